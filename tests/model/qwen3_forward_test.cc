// qwen3: tiny random-weight GGUF models written here with kvq's own writer (per-head q/k norm
// weights far from 1, attention.key_length 24 while dim / n_heads = 16, so n_heads · head_dim =
// 96 ≠ dim 64), run through the fast forward (SIMD matvec, kvq cache) and through a scalar
// reference forward written in this file from Qwen3's definition. The reference shares no norm,
// RoPE or attention code with the model; each test also shows that the reference with one
// feature dropped (no q norm, no k norm, adjacent pairs, head_dim = dim / n_heads) is far off.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf_writer.h"
#include "model/decoder.h"
#include "model/gguf_llama.h"
#include "weights/matvec.h"

namespace kvq {
namespace {

constexpr int kDim = 64, kHidden = 96, kLayers = 2, kHeads = 4, kKvHeads = 2, kVocab = 48, kContext = 128;
constexpr int kHeadDim = 24;  // attention.key_length: not kDim / kHeads = 16
constexpr int kQ = kHeads * kHeadDim, kKv = kKvHeads * kHeadDim;
constexpr float kEps = 1e-6f;

std::vector<uint8_t> Bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

struct TinyQwen3 {
  bool tied = true;                 // no output.weight
  uint32_t value_length = kHeadDim; // written as attention.value_length
  bool key_length = true;           // write attention.key_length
  const char* skip = "";            // a tensor left out
};

std::string WriteQwen3(const std::string& name, const TinyQwen3& s) {
  GgufWriter w;
  EXPECT_TRUE(w.SetString("general.architecture", "qwen3").ok());
  EXPECT_TRUE(w.SetU32("qwen3.embedding_length", kDim).ok());
  EXPECT_TRUE(w.SetU32("qwen3.feed_forward_length", kHidden).ok());
  EXPECT_TRUE(w.SetU32("qwen3.block_count", kLayers).ok());
  EXPECT_TRUE(w.SetU32("qwen3.attention.head_count", kHeads).ok());
  EXPECT_TRUE(w.SetU32("qwen3.attention.head_count_kv", kKvHeads).ok());
  EXPECT_TRUE(w.SetU32("qwen3.context_length", kContext).ok());
  if (s.key_length) {
    EXPECT_TRUE(w.SetU32("qwen3.attention.key_length", kHeadDim).ok());
    EXPECT_TRUE(w.SetU32("qwen3.attention.value_length", s.value_length).ok());
  }
  EXPECT_TRUE(w.SetF32("qwen3.rope.freq_base", 10000.0f).ok());
  EXPECT_TRUE(w.SetF32("qwen3.attention.layer_norm_rms_epsilon", kEps).ok());
  std::mt19937 rng(11);
  auto random = [&](int64_t n, float sd, float mean = 0.0f) {
    std::normal_distribution<float> dist(mean, sd);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
  };
  auto add = [&](const std::string& t, std::vector<int64_t> dims, const std::vector<float>& v) {
    if (t == s.skip) return;
    EXPECT_TRUE(w.AddTensor(t, GgmlType::kF32, dims, Bytes(v)).ok()) << t;
  };
  // Weights ~ N(0, 1/cols) keep activations O(1). The q/k norm weights N(1, 0.5): far enough
  // from 1 that dropping them moves the logits.
  auto sd = [](int cols) { return 1.0f / std::sqrt(static_cast<float>(cols)); };
  add("token_embd.weight", {kDim, kVocab}, random(int64_t{kDim} * kVocab, 1.0f));
  for (int l = 0; l < kLayers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    add(b + "attn_norm.weight", {kDim}, random(kDim, 0.1f, 1.0f));
    add(b + "attn_q.weight", {kDim, kQ}, random(kDim * kQ, sd(kDim)));
    add(b + "attn_k.weight", {kDim, kKv}, random(kDim * kKv, sd(kDim)));
    add(b + "attn_v.weight", {kDim, kKv}, random(kDim * kKv, sd(kDim)));
    add(b + "attn_q_norm.weight", {kHeadDim}, random(kHeadDim, 0.5f, 1.0f));
    add(b + "attn_k_norm.weight", {kHeadDim}, random(kHeadDim, 0.5f, 1.0f));
    add(b + "attn_output.weight", {kQ, kDim}, random(kQ * kDim, sd(kQ)));
    add(b + "ffn_norm.weight", {kDim}, random(kDim, 0.1f, 1.0f));
    add(b + "ffn_gate.weight", {kDim, kHidden}, random(kDim * kHidden, sd(kDim)));
    add(b + "ffn_down.weight", {kHidden, kDim}, random(kHidden * kDim, sd(kHidden)));
    add(b + "ffn_up.weight", {kDim, kHidden}, random(kDim * kHidden, sd(kDim)));
  }
  add("output_norm.weight", {kDim}, random(kDim, 0.1f, 1.0f));
  if (!s.tied) add("output.weight", {kDim, kVocab}, random(int64_t{kDim} * kVocab, sd(kDim)));
  const std::string path = ::testing::TempDir() + "/qwen3_" + name + "_" + std::to_string(getpid()) + ".gguf";
  EXPECT_TRUE(w.Write(path).ok());
  return path;
}

// What the reference is told about the architecture (the test's own reading of Qwen3).
struct Qwen3Reading {
  bool q_norm = true;
  bool k_norm = true;
  bool halves = true;         // NeoX: pairs (i, i + d/2); else (2i, 2i + 1)
  int head_dim = kHeadDim;    // the head size it cuts q and k into (16: dim / n_heads)
};

// Qwen3's forward, scalar: sums in double, RMSNorm and rotation in double, a two-pass softmax
// over plain K/V arrays [layer][pos][kKv].
class Qwen3Reference {
 public:
  Qwen3Reference(const DecoderWeights& w, Qwen3Reading r) : w_(w), r_(r) {
    k_.resize(int64_t{kLayers} * kContext * kKv);
    v_.resize(k_.size());
  }
  std::vector<float> Forward(int32_t token, int32_t pos) {
    const int hd = r_.head_dim, heads = kQ / hd, kv_heads = kKv / hd;
    std::vector<float> x(kDim), xb(kDim), q(kQ), att(kQ), xo(kDim), hb(kHidden), hb2(kHidden), s(pos + 1);
    DecodeWeightRow(w_.token_embedding, token, x.data());
    for (int l = 0; l < kLayers; ++l) {
      const LayerWeights& L = w_.layers[l];
      float* k = k_.data() + (int64_t{l} * kContext + pos) * kKv;
      float* v = v_.data() + (int64_t{l} * kContext + pos) * kKv;
      Norm(x.data(), L.attn_norm, kDim, xb.data());
      MatVecReference(L.wq, xb.data(), q.data());
      MatVecReference(L.wk, xb.data(), k);
      MatVecReference(L.wv, xb.data(), v);
      for (int h = 0; h < heads; ++h) {
        if (r_.q_norm) Norm(q.data() + h * hd, L.q_norm, hd, q.data() + h * hd);
        Rotate(q.data() + h * hd, pos);
      }
      for (int h = 0; h < kv_heads; ++h) {
        if (r_.k_norm) Norm(k + h * hd, L.k_norm, hd, k + h * hd);
        Rotate(k + h * hd, pos);
      }
      for (int h = 0; h < heads; ++h) {
        const int kvh = h / (heads / kv_heads);
        double top = -INFINITY;
        for (int t = 0; t <= pos; ++t) {
          const float* kt = k_.data() + (int64_t{l} * kContext + t) * kKv + kvh * hd;
          double dot = 0;
          for (int i = 0; i < hd; ++i) dot += double{q[h * hd + i]} * kt[i];
          s[t] = static_cast<float>(dot / std::sqrt(static_cast<double>(hd)));
          top = std::max<double>(top, s[t]);
        }
        double sum = 0;
        for (int t = 0; t <= pos; ++t) sum += s[t] = static_cast<float>(std::exp(s[t] - top));
        for (int i = 0; i < hd; ++i) {
          double o = 0;
          for (int t = 0; t <= pos; ++t) o += s[t] / sum * v_[(int64_t{l} * kContext + t) * kKv + kvh * hd + i];
          att[h * hd + i] = static_cast<float>(o);
        }
      }
      MatVecReference(L.wo, att.data(), xo.data());
      for (int i = 0; i < kDim; ++i) x[i] += xo[i];
      Norm(x.data(), L.ffn_norm, kDim, xb.data());
      MatVecReference(L.w1, xb.data(), hb.data());
      MatVecReference(L.w3, xb.data(), hb2.data());
      for (int i = 0; i < kHidden; ++i) hb[i] = static_cast<float>(hb[i] / (1.0 + std::exp(-double{hb[i]})) * hb2[i]);
      MatVecReference(L.w2, hb.data(), xo.data());
      for (int i = 0; i < kDim; ++i) x[i] += xo[i];
    }
    Norm(x.data(), w_.final_norm, kDim, x.data());
    std::vector<float> logits(kVocab);
    MatVecReference(w_.classifier, x.data(), logits.data());
    return logits;
  }

 private:
  // out = weight · x / sqrt(mean(x²) + eps), in double (out may be x).
  static void Norm(const float* x, const float* weight, int n, float* out) {
    double ss = 0;
    for (int i = 0; i < n; ++i) ss += double{x[i]} * x[i];
    const double scale = 1.0 / std::sqrt(ss / n + kEps);
    for (int i = 0; i < n; ++i) out[i] = static_cast<float>(weight[i] * (scale * x[i]));
  }
  void Rotate(float* head, int32_t pos) const {
    const int hd = r_.head_dim;
    for (int i = 0; i < hd / 2; ++i) {
      const double angle = pos * std::pow(10000.0, -2.0 * i / hd);
      float* a = head + (r_.halves ? i : 2 * i);
      float* b = head + (r_.halves ? i + hd / 2 : 2 * i + 1);
      const double x = *a, y = *b;
      *a = static_cast<float>(x * std::cos(angle) - y * std::sin(angle));
      *b = static_cast<float>(x * std::sin(angle) + y * std::cos(angle));
    }
  }
  const DecoderWeights& w_;
  Qwen3Reading r_;
  std::vector<float> k_, v_;
};

Result<DecoderWeights> Load(const std::string& path) {
  Result<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
  if (!f.ok()) return f.status();
  return LoadGgufLlama(std::shared_ptr<GgufFile>(std::move(f).value()));
}

std::unique_ptr<KvCache> F32Cache(const DecoderConfig& c) {
  const FormatDesc* f32 = *FindFormat("f32");
  Result<std::unique_ptr<KvCache>> cache =
      KvCache::Create({.n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim(),
                       .layers = {{f32, f32}}, .max_positions = c.seq_len, .page_positions = 32});
  EXPECT_TRUE(cache.ok()) << cache.status().message();
  return cache.ok() ? std::move(cache).value() : nullptr;
}

// 100 positions through the model and the reference (tokens a fixed pseudo-random walk: repeated
// tokens give identical K rows, over which rotations cannot be told apart); the worst |Δlogit|
// of the model against `right`, and of `wrong` against `right`.
struct Agreement {
  double worst = 0;
  double wrong_worst = 0;
};
Agreement Compare(const DecoderWeights& w, const Qwen3Reading& right, const Qwen3Reading& wrong) {
  DecoderModel model(w, 2);
  std::unique_ptr<KvCache> cache = F32Cache(w.config);
  if (cache == nullptr) return {.worst = std::numeric_limits<double>::infinity()};
  Qwen3Reference reference(w, right), without(w, wrong);
  std::vector<float> fast(kVocab);
  Agreement a;
  int32_t token = 3;
  for (int32_t pos = 0; pos < 100; ++pos) {
    EXPECT_TRUE(model.Forward(token, pos, *cache, fast.data()).ok());
    const std::vector<float> want = reference.Forward(token, pos);
    const std::vector<float> other = without.Forward(token, pos);
    for (int i = 0; i < kVocab; ++i) {
      a.worst = std::max<double>(a.worst, std::fabs(fast[i] - want[i]));
      a.wrong_worst = std::max<double>(a.wrong_worst, std::fabs(other[i] - want[i]));
    }
    token = (token * 17 + 5) % kVocab;
  }
  return a;
}

// Tolerance. Both sides are f32 activations with f32 weights; they differ in summation order
// (SIMD matvec lanes, the online softmax, RoPE angles in f32 vs double, norms in f32 vs double).
// Each logit is a 64-term dot of O(1) numbers after 2 layers of 64/96-term sums: relative f32
// rounding ~6e-8 per operation over a few hundred chained operations, on logits of magnitude up
// to ~10 (tied: embedding rows of sd 1 give logits of sd ~8), gives ~1e-5 absolute (observed:
// 1.9e-5 tied, 1.6e-6 separate; the test prints both). 1e-3 is 50x that, while each dropped
// feature moves the logits by more than 10x the tolerance (observed: 1 to 25).
constexpr double kTolerance = 1e-3;

TEST(Qwen3Forward, LoadsHeadDimFromKeyLengthAndTheNorms) {
  const std::string path = WriteQwen3("load", {});
  Result<DecoderWeights> w = Load(path);
  ASSERT_TRUE(w.ok()) << w.status().message();
  const DecoderConfig& c = w->config;
  EXPECT_EQ(c.arch, "qwen3");
  EXPECT_EQ(c.head_dim(), kHeadDim);
  EXPECT_EQ(c.q_dim(), kQ);
  EXPECT_EQ(c.kv_dim(), kKv);
  EXPECT_NE(c.q_dim(), c.dim);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.rope_pairing, RopePairing::kHalves);
  EXPECT_EQ(w->layers[1].wq.rows, kQ);
  EXPECT_EQ(w->layers[1].wo.cols, kQ);
  EXPECT_NE(w->layers[1].q_norm, nullptr);
  EXPECT_NE(w->layers[1].k_norm, nullptr);
  EXPECT_EQ(w->layers[1].bq, nullptr);
  EXPECT_EQ(w->classifier.data, w->token_embedding.data) << "no output.weight: the classifier is token_embd";
  EXPECT_EQ(Fingerprint(*w).head_dim, kHeadDim);
  std::remove(path.c_str());
}

TEST(Qwen3Forward, MatchesTheReferenceAndTheReferenceSeesEachFeatureDropped) {
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied classifier" : "separate output.weight");
    const std::string path = WriteQwen3(tied ? "tied" : "separate", {.tied = tied});
    Result<DecoderWeights> w = Load(path);
    ASSERT_TRUE(w.ok()) << w.status().message();
    EXPECT_EQ(w->classifier.data == w->token_embedding.data, tied);
    const struct {
      const char* feature;
      Qwen3Reading wrong;
    } dropped[] = {
        {"q norm", {.q_norm = false}},
        {"k norm", {.k_norm = false}},
        {"half-split rotation (adjacent pairs instead)", {.halves = false}},
        {"head_dim from key_length (dim / n_heads = 16 instead)", {.head_dim = kDim / kHeads}},
    };
    for (const auto& d : dropped) {
      SCOPED_TRACE(d.feature);
      const Agreement a = Compare(*w, {}, d.wrong);
      std::printf("qwen3 %s, dropping %s: kvq vs reference %.3g, reference without it %.3g\n",
                  tied ? "tied" : "separate", d.feature, a.worst, a.wrong_worst);
      EXPECT_LT(a.worst, kTolerance);
      EXPECT_GT(a.wrong_worst, 10 * kTolerance) << "dropping the " << d.feature << " went unnoticed";
    }
    std::remove(path.c_str());
  }
}

TEST(Qwen3Forward, BlockForwardEqualsTokenForward) {
  const std::string path = WriteQwen3("block", {});
  Result<DecoderWeights> w = Load(path);
  ASSERT_TRUE(w.ok()) << w.status().message();
  DecoderModel model(*w, 2);
  std::unique_ptr<KvCache> a = F32Cache(w->config), b = F32Cache(w->config);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::vector<int32_t> tokens = {1, 5, 9, 2, 30, 47, 11, 0, 8, 8, 13};
  std::vector<float> by_token(kVocab), by_block(kVocab);
  for (size_t i = 0; i < tokens.size(); ++i) ASSERT_TRUE(model.Forward(tokens[i], i, *a, by_token.data()).ok());
  ASSERT_TRUE(model.ForwardBlock(tokens.data(), tokens.size(), 0, *b, by_block.data()).ok());
  EXPECT_EQ(by_token, by_block);
  std::remove(path.c_str());
}

TEST(Qwen3Forward, BadFilesAreRefusedByName) {
  const struct {
    const char* name;
    TinyQwen3 spec;
    std::string must_mention;
  } cases[] = {
      {"value_length", {.value_length = 32}, "attention.value_length = 32"},
      {"no_q_norm", {.skip = "blk.1.attn_q_norm.weight"}, "blk.1.attn_q_norm.weight"},
      {"no_k_norm", {.skip = "blk.0.attn_k_norm.weight"}, "blk.0.attn_k_norm.weight"},
      // Without key_length the head size is dim / n_heads = 16, which the 24-wide norms disagree with.
      {"no_key_length", {.key_length = false}, "has shape [24]; the metadata implies [16]"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = WriteQwen3(c.name, c.spec);
    Result<DecoderWeights> w = Load(path);
    ASSERT_FALSE(w.ok());
    EXPECT_NE(w.status().message().find(c.must_mention), std::string::npos) << w.status().message();
    EXPECT_NE(w.status().message().find(path), std::string::npos) << w.status().message();
    std::remove(path.c_str());
  }
}

}  // namespace
}  // namespace kvq
