// qwen2, mistral and rope-scaled llama: tiny random-weight GGUF models written here with kvq's own
// writer, run through the fast forward (SIMD matvec, kvq cache) and through a scalar reference
// forward written in this file from the architectures' definitions (biases, half-split or
// adjacent-pair rotation, frequency factors, linear position scaling). The reference shares no
// RoPE or bias code with the model; each test also shows the reference would catch the feature
// being ignored.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf_writer.h"
#include "model/gguf_llama.h"
#include "model/decoder.h"
#include "weights/matvec.h"
#include "kvq/rope.h"

namespace kvq {
namespace {

constexpr int kDim = 64, kHidden = 96, kLayers = 2, kHeads = 4, kKvHeads = 2, kVocab = 48, kContext = 128;
constexpr int kHeadDim = kDim / kHeads, kKv = kHeadDim * kKvHeads;

struct TinySpec {
  std::string arch = "llama";
  bool biases = false;
  std::vector<float> freq_factors;  // rope_freqs.weight when not empty
  float linear_factor = 0;          // rope.scaling.type linear when > 0
  uint32_t sliding_window = 0;
  float theta = 10000.0f;
};

std::vector<uint8_t> Bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::string WriteTiny(const std::string& name, const TinySpec& s) {
  GgufWriter w;
  const std::string p = s.arch + ".";
  EXPECT_TRUE(w.SetString("general.architecture", s.arch).ok());
  EXPECT_TRUE(w.SetU32(p + "embedding_length", kDim).ok());
  EXPECT_TRUE(w.SetU32(p + "feed_forward_length", kHidden).ok());
  EXPECT_TRUE(w.SetU32(p + "block_count", kLayers).ok());
  EXPECT_TRUE(w.SetU32(p + "attention.head_count", kHeads).ok());
  EXPECT_TRUE(w.SetU32(p + "attention.head_count_kv", kKvHeads).ok());
  EXPECT_TRUE(w.SetU32(p + "context_length", kContext).ok());
  EXPECT_TRUE(w.SetU32(p + "rope.dimension_count", kHeadDim).ok());
  EXPECT_TRUE(w.SetF32(p + "rope.freq_base", s.theta).ok());
  EXPECT_TRUE(w.SetF32(p + "attention.layer_norm_rms_epsilon", 1e-6f).ok());
  if (s.linear_factor > 0) {
    EXPECT_TRUE(w.SetString(p + "rope.scaling.type", "linear").ok());
    EXPECT_TRUE(w.SetF32(p + "rope.scaling.factor", s.linear_factor).ok());
  }
  if (s.sliding_window > 0) {
    EXPECT_TRUE(w.SetU32(p + "attention.sliding_window", s.sliding_window).ok());
  }
  std::mt19937 rng(7);
  auto random = [&](int64_t n, float sd, float mean = 0.0f) {
    std::normal_distribution<float> dist(mean, sd);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
  };
  auto add = [&](const std::string& t, std::vector<int64_t> dims, const std::vector<float>& v) {
    EXPECT_TRUE(w.AddTensor(t, GgmlType::kF32, dims, Bytes(v)).ok()) << t;
  };
  // Weights ~ N(0, 1/cols) keep activations O(1); biases large enough to matter (σ 0.5).
  const float sd_dim = 1.0f / std::sqrt(static_cast<float>(kDim));
  add("token_embd.weight", {kDim, kVocab}, random(int64_t{kDim} * kVocab, 1.0f));
  for (int l = 0; l < kLayers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    add(b + "attn_norm.weight", {kDim}, random(kDim, 0.1f, 1.0f));
    add(b + "attn_q.weight", {kDim, kDim}, random(kDim * kDim, sd_dim));
    add(b + "attn_k.weight", {kDim, kKv}, random(kDim * kKv, sd_dim));
    add(b + "attn_v.weight", {kDim, kKv}, random(kDim * kKv, sd_dim));
    if (s.biases) {
      add(b + "attn_q.bias", {kDim}, random(kDim, 0.5f));
      add(b + "attn_k.bias", {kKv}, random(kKv, 0.5f));
      add(b + "attn_v.bias", {kKv}, random(kKv, 0.5f));
    }
    add(b + "attn_output.weight", {kDim, kDim}, random(kDim * kDim, sd_dim));
    add(b + "ffn_norm.weight", {kDim}, random(kDim, 0.1f, 1.0f));
    add(b + "ffn_gate.weight", {kDim, kHidden}, random(kDim * kHidden, sd_dim));
    add(b + "ffn_down.weight", {kHidden, kDim}, random(kHidden * kDim, 1.0f / std::sqrt(float{kHidden})));
    add(b + "ffn_up.weight", {kDim, kHidden}, random(kDim * kHidden, sd_dim));
  }
  add("output_norm.weight", {kDim}, random(kDim, 0.1f, 1.0f));
  if (!s.freq_factors.empty()) add("rope_freqs.weight", {kHeadDim / 2}, s.freq_factors);
  const std::string path = ::testing::TempDir() + "/arch_" + name + "_" + std::to_string(getpid()) + ".gguf";
  EXPECT_TRUE(w.Write(path).ok());
  return path;
}

// What the reference forward is told about the architecture (the test's own reading of it).
struct ReferenceRope {
  bool halves = false;              // qwen2: pairs (i, i + d/2); else (2i, 2i+1)
  std::vector<double> freq_factors; // empty: 1
  double position_scale = 1.0;
  bool biases = true;               // add the biases the weights carry
};

// A scalar forward: plain loops, the rotation in double, a two-pass softmax over plain arrays.
class ReferenceForward {
 public:
  ReferenceForward(const DecoderWeights& w, ReferenceRope rope) : w_(w), rope_(std::move(rope)) {
    k_.resize(int64_t{kLayers} * kContext * kKv);
    v_.resize(k_.size());
  }
  std::vector<float> Forward(int32_t token, int32_t pos) {
    const DecoderConfig& c = w_.config;
    std::vector<float> x(kDim), xb(kDim), xb2(kDim), q(kDim), hb(kHidden), hb2(kHidden), att(pos + 1);
    DecodeWeightRow(w_.token_embedding, token, x.data());
    for (int l = 0; l < kLayers; ++l) {
      const LayerWeights& L = w_.layers[l];
      float* k = k_.data() + (int64_t{l} * kContext + pos) * kKv;
      float* v = v_.data() + (int64_t{l} * kContext + pos) * kKv;
      RmsNorm(xb.data(), x.data(), L.attn_norm, kDim, c.norm_eps);
      MatVecReference(L.wq, xb.data(), q.data());
      MatVecReference(L.wk, xb.data(), k);
      MatVecReference(L.wv, xb.data(), v);
      if (rope_.biases && L.bq != nullptr) {
        for (int i = 0; i < kDim; ++i) q[i] += L.bq[i];
        for (int i = 0; i < kKv; ++i) k[i] += L.bk[i], v[i] += L.bv[i];
      }
      Rotate(q.data(), kHeads, pos);
      Rotate(k, kKvHeads, pos);
      for (int h = 0; h < kHeads; ++h) {
        const int kvh = h / (kHeads / kKvHeads);
        double top = -INFINITY;
        for (int t = 0; t <= pos; ++t) {
          const float* kt = k_.data() + (int64_t{l} * kContext + t) * kKv + kvh * kHeadDim;
          double s = 0;
          for (int i = 0; i < kHeadDim; ++i) s += double{q[h * kHeadDim + i]} * kt[i];
          att[t] = static_cast<float>(s / std::sqrt(double{kHeadDim}));
          top = std::max<double>(top, att[t]);
        }
        double sum = 0;
        for (int t = 0; t <= pos; ++t) sum += att[t] = static_cast<float>(std::exp(att[t] - top));
        for (int i = 0; i < kHeadDim; ++i) {
          double o = 0;
          for (int t = 0; t <= pos; ++t) o += att[t] / sum * v_[(int64_t{l} * kContext + t) * kKv + kvh * kHeadDim + i];
          xb[h * kHeadDim + i] = static_cast<float>(o);
        }
      }
      MatVecReference(L.wo, xb.data(), xb2.data());
      for (int i = 0; i < kDim; ++i) x[i] += xb2[i];
      RmsNorm(xb.data(), x.data(), L.ffn_norm, kDim, c.norm_eps);
      MatVecReference(L.w1, xb.data(), hb.data());
      MatVecReference(L.w3, xb.data(), hb2.data());
      for (int i = 0; i < kHidden; ++i) hb[i] = hb[i] / (1.0f + std::exp(-hb[i])) * hb2[i];
      MatVecReference(L.w2, hb.data(), xb.data());
      for (int i = 0; i < kDim; ++i) x[i] += xb[i];
    }
    RmsNorm(x.data(), x.data(), w_.final_norm, kDim, c.norm_eps);
    std::vector<float> logits(kVocab);
    MatVecReference(w_.classifier, x.data(), logits.data());
    return logits;
  }

 private:
  void Rotate(float* v, int heads, int32_t pos) const {
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < kHeadDim / 2; ++i) {
        double freq = std::pow(double{w_.config.rope_theta}, -2.0 * i / kHeadDim);
        if (!rope_.freq_factors.empty()) freq /= rope_.freq_factors[i];
        const double angle = pos * rope_.position_scale * freq;
        float* a = v + h * kHeadDim + (rope_.halves ? i : 2 * i);
        float* b = v + h * kHeadDim + (rope_.halves ? i + kHeadDim / 2 : 2 * i + 1);
        const double x = *a, y = *b;
        *a = static_cast<float>(x * std::cos(angle) - y * std::sin(angle));
        *b = static_cast<float>(x * std::sin(angle) + y * std::cos(angle));
      }
    }
  }
  const DecoderWeights& w_;
  ReferenceRope rope_;
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
  return cache.ok() ? std::move(cache).value() : nullptr;  // null: the caller ASSERTs
}

// Runs 100 positions through the model and the reference; returns the worst |Δlogit| and the worst
// difference to `wrong`, a reference that ignores the feature. The tokens vary (a fixed
// pseudo-random walk): a repeated token gives identical K and V rows, and attention over identical
// rows cannot tell one rotation from another.
struct Agreement {
  double worst = 0;        // fast vs reference
  double wrong_worst = 0;  // reference vs the reference without the feature
};
Agreement Compare(const DecoderWeights& w, const ReferenceRope& right, const ReferenceRope& wrong) {
  DecoderModel model(w, 2);
  std::unique_ptr<KvCache> cache = F32Cache(w.config);
  // No cache (the failure is recorded): agreement infinitely bad, so the caller's checks fail too.
  if (cache == nullptr) return {.worst = std::numeric_limits<double>::infinity()};
  ReferenceForward reference(w, right), without(w, wrong);
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

// Tolerance: f32 throughout with different summation orders (SIMD matvec, online softmax, RoPE
// angles in f32 vs double) over 2 layers of 64/96-wide sums, logits of magnitude ~1-5: observed
// differences are ~1e-5; 1e-3 leaves room while a missing bias, a wrong pairing or an ignored
// scaling moves logits by more than 0.01 (each test checks that on its own reference).
constexpr double kTolerance = 1e-3;

TEST(ArchForward, Qwen2BiasesAndHalfSplitRotationMatchTheReference) {
  const std::string path = WriteTiny("qwen2", {.arch = "qwen2", .biases = true, .theta = 1e6f});
  Result<DecoderWeights> w = Load(path);
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(w->config.rope_pairing, RopePairing::kHalves);
  ASSERT_NE(w->layers[1].bv, nullptr);
  Agreement a = Compare(*w, {.halves = true}, {.halves = false});
  EXPECT_LT(a.worst, kTolerance);
  EXPECT_GT(a.wrong_worst, 10 * kTolerance) << "adjacent pairs instead of halves went unnoticed";
  a = Compare(*w, {.halves = true}, {.halves = true, .biases = false});
  EXPECT_GT(a.wrong_worst, 10 * kTolerance) << "dropping the biases went unnoticed";
  std::remove(path.c_str());
}

TEST(ArchForward, Qwen2WithoutBiasTensorsIsRefusedByName) {
  const std::string path = WriteTiny("qwen2_nobias", {.arch = "qwen2", .biases = false});
  Result<DecoderWeights> w = Load(path);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("blk.0.attn_q.bias"), std::string::npos) << w.status().message();
  EXPECT_NE(w.status().message().find(path), std::string::npos);
  std::remove(path.c_str());
}

TEST(ArchForward, MistralMatchesTheReferenceAndItsWindowCapsTheContext) {
  const std::string path = WriteTiny("mistral", {.arch = "mistral", .sliding_window = 100});
  Result<DecoderWeights> w = Load(path);
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(w->config.seq_len, 100) << "attending to every position equals the window only within it";
  const Agreement a = Compare(*w, {}, {.halves = true});
  EXPECT_LT(a.worst, kTolerance);
  EXPECT_GT(a.wrong_worst, 10 * kTolerance);
  std::remove(path.c_str());
}

TEST(ArchForward, Llama3FrequencyFactorsMatchTheReference) {
  // Llama 3.1's scaling with an original context of 16 so that most pairs are scaled within the
  // 100 positions tested (the real 8192 would leave a tiny model's test insensitive).
  const Llama3RopeScaling scaling{.factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_context = 16};
  const std::vector<float> factors = Llama3RopeFreqFactors(kHeadDim, 500000.0f, scaling);
  const std::string path = WriteTiny("llama3", {.freq_factors = factors, .theta = 500000.0f});
  Result<DecoderWeights> w = Load(path);
  ASSERT_TRUE(w.ok()) << w.status().message();
  ASSERT_EQ(w->config.rope_freq_factors, factors);
  const Agreement a = Compare(*w, {.freq_factors = {factors.begin(), factors.end()}}, {});
  EXPECT_LT(a.worst, kTolerance);
  EXPECT_GT(a.wrong_worst, 10 * kTolerance) << "ignoring the frequency factors went unnoticed";
  std::remove(path.c_str());
}

TEST(ArchForward, Llama3FactorsFollowTheDefinition) {
  // Hand-derived for head_dim 8, theta 10000 (freqs 1, 0.1, 0.01, 0.001; wavelengths 2π/freq =
  // 6.28, 62.8, 628, 6283), original context 1024, low 1, high 4 (wavelength bounds 256, 1024):
  // pairs 0, 1 keep (factor 1); pair 3 is past 1024 → 8; pair 2 (628) blends with
  // smooth = (1024/628.3 − 1) / 3 = 0.20992, divisor 1 / (0.79008/8 + 0.20992) = 1/0.30868 = 3.2396.
  const std::vector<float> f = Llama3RopeFreqFactors(
      8, 10000.0f, {.factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_context = 1024});
  ASSERT_EQ(f.size(), 4u);
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[1], 1.0f);
  EXPECT_NEAR(f[2], 3.2396, 1e-4);  // the hand computation's 5 significant digits
  EXPECT_EQ(f[3], 8.0f);
}

TEST(ArchForward, LinearRopeScalingMatchesTheReference) {
  const std::string path = WriteTiny("linear", {.linear_factor = 4.0f});
  Result<DecoderWeights> w = Load(path);
  ASSERT_TRUE(w.ok()) << w.status().message();
  const Agreement a = Compare(*w, {.position_scale = 0.25}, {});
  EXPECT_LT(a.worst, kTolerance);
  EXPECT_GT(a.wrong_worst, 10 * kTolerance);
  std::remove(path.c_str());
}

TEST(ArchForward, BlockForwardEqualsTokenForwardForQwen2) {
  const std::string path = WriteTiny("qwen2_block", {.arch = "qwen2", .biases = true});
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

TEST(ArchForward, UnsupportedScalingAndPartialRotationAreRefused) {
  // Metadata only: the loader must refuse before it looks for tensors. The key under test is set
  // first, so the defaults after it cannot override it (the writer refuses duplicate keys).
  auto refuse = [&](const std::string& key, auto set, const std::string& expect) {
    GgufWriter w;
    set(w);
    (void)w.SetString("general.architecture", "llama");
    (void)w.SetU32("llama.embedding_length", kDim);
    (void)w.SetU32("llama.feed_forward_length", kHidden);
    (void)w.SetU32("llama.block_count", 1);
    (void)w.SetU32("llama.attention.head_count", kHeads);
    (void)w.SetU32("llama.context_length", kContext);
    const std::string p = ::testing::TempDir() + "/arch_refuse_" + std::to_string(getpid()) + ".gguf";
    ASSERT_TRUE(w.Write(p).ok());
    Result<DecoderWeights> r = Load(p);
    ASSERT_FALSE(r.ok()) << key;
    EXPECT_NE(r.status().message().find(expect), std::string::npos) << r.status().message();
    std::remove(p.c_str());
  };
  refuse("yarn", [](GgufWriter& w) { (void)w.SetString("llama.rope.scaling.type", "yarn"); }, "'yarn' is not supported");
  refuse("partial", [](GgufWriter& w) { (void)w.SetU32("llama.rope.dimension_count", kHeadDim / 2); },
         "rotates part of a head");
  refuse("arch", [](GgufWriter& w) { (void)w.SetString("general.architecture", "gemma"); },
         "architecture 'gemma' is not supported");
  // Every angle inf or NaN (a fuzz finding: the NaN reached an integer conversion in RoPE).
  for (float theta : {0.0f, -10000.0f, std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::infinity()}) {
    refuse("theta", [&](GgufWriter& w) { (void)w.SetF32("llama.rope.freq_base", theta); },
           "rope.freq_base = " + fmt::format("{}", theta) + " must be a positive finite number");
  }
  for (float eps : {-1e-6f, std::numeric_limits<float>::quiet_NaN()}) {
    refuse("eps", [&](GgufWriter& w) { (void)w.SetF32("llama.attention.layer_norm_rms_epsilon", eps); },
           "must be a finite number >= 0");
  }
}

}  // namespace
}  // namespace kvq
