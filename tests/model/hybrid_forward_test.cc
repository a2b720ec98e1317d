// Hybrid models (qwen35, qwen35moe, qwen3next: Gated DeltaNet + gated attention, dense or experts):
// tiny GGUF files written here, run through kvq's fast forward (SIMD matvec, KvCache with the
// recurrent state) and through the scalar reference of test_util/hybrid_model.h, at every position.
// Each comparison also runs the reference with one detail read wrong (the V-head mapping, the
// partial rotation, the output gate, the expert renormalisation, the conv window) and requires
// that to be far off, so the comparison can fail.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvq/format.h"
#include "model/cache_config.h"
#include "model/decoder.h"
#include "model/decoder_weights.h"
#include "model/gguf_llama.h"
#include "test_util/hybrid_model.h"
#include "weights/matrix.h"

namespace kvq {
namespace {

using test::HybridReading;
using test::HybridReference;
using test::TinyHybrid;

// The file's weights, row-major as stored, or with `repack` in the interleaved layout LoadModel
// gives them (RepackWeights: the projections, and the routed experts' stacks slice by slice).
Result<DecoderWeights> Load(const std::string& path, bool repack = false) {
  Result<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
  if (!f.ok()) return f.status();
  Result<DecoderWeights> w = LoadGgufLlama(std::shared_ptr<GgufFile>(std::move(f).value()));
  if (w.ok() && repack) RepackWeights(&w.value(), /*release_mapped_pages=*/false);
  return w;
}

std::unique_ptr<KvCache> Cache(const DecoderConfig& c, const char* format = "f32") {
  const FormatDesc* f = *FindFormat(format);
  Result<std::unique_ptr<KvCache>> cache = CreateModelCache(c, c.seq_len, {.layers = {{f, f}}, .page_positions = 32});
  EXPECT_TRUE(cache.ok()) << cache.status().message();
  return cache.ok() ? std::move(cache).value() : nullptr;
}

std::vector<int32_t> Tokens(int n) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 7 + 3) % test::kHVocab;
  return t;
}

// The largest |a − b|, or infinity where either is NaN (std::max would drop a NaN, and a model
// reading its weights wrongly, say a scale from the wrong bytes, can give NaN logits).
double WorstDifference(const std::vector<float>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(a[i] - b[i]);
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, d);
  }
  return worst;
}

// Tolerances. F32 weights: both sides use the same weights; kvq sums in f32 (lane-parallel
// matvec, f32 state and softmax) and the reference in double. Each f32 operation is off by
// ≤ 2^-24 relative; the longest chains (a 64-term dot, the 16×16 state updated 24 times, four
// layers) keep logits (spread ±25) within ~1e-4 (observed 1.6e-5 .. 1.7e-4, printed); 1e-3 leaves a
// margin. Q8_0 weights: both sides quantise each activation block to 8 bits the same way (the
// reference through MatVecQuantizedReference), but from activations that differ in the last f32
// bits, so a code whose x/d_x lies within ~1e-6 of a rounding boundary can round the other way:
// about one such flip per run of 24 tokens. A flip moves one product by one step (amax/127 ·
// |w|), and the recurrent state and KV rows carry it on: observed 1e-5 without a flip, up to
// 0.62 with one (over five token sequences), 0.69 with the experts repacked (their lane sums
// round differently, so a flip can fall on another code). So 1.0 there, while every wrong reading below moves
// the logits by more than 4 (observed 4.65 .. 38): the comparison asks for 3× the tolerance.
constexpr double kF32Tolerance = 1e-3, kQ8Tolerance = 1.0;

struct WrongReading {
  const char* what;
  HybridReading reading;
};

void CheckArch(const std::string& arch, bool q8_0, bool repack = false) {
  const TinyHybrid spec{.arch = arch, .q8_0 = q8_0, .nextn = arch == "qwen3next" ? 0 : 1};
  const std::string path = test::WriteHybrid(arch + (q8_0 ? "_q8" : "_f32"), spec);
  const double tolerance = q8_0 ? kQ8Tolerance : kF32Tolerance;
  std::vector<WrongReading> wrongs = {
      {"V-head mapping", {.v_heads_modulo = arch == "qwen3next"}},
      {"partial rotation", {.rot = test::kHHeadDim}},
      {"output gate", {.output_gate = false}},
      {"conv window", {.conv_state = false}},
  };
  // The right reading of this arch (qwen3next: v head h reads key head h div r); each wrong one
  // differs from it in one field.
  const HybridReading base{.v_heads_modulo = arch != "qwen3next"};
  if (spec.moe()) wrongs.push_back({"expert renormalisation", {.renormalise = false}});
  for (WrongReading& wr : wrongs) {
    if (std::string(wr.what) != "V-head mapping") wr.reading.v_heads_modulo = base.v_heads_modulo;
  }
  for (const WrongReading& wr : wrongs) {
    SCOPED_TRACE(wr.what);
    Result<DecoderWeights> w = Load(path, repack);
    ASSERT_TRUE(w.ok()) << w.status().message();
    if (repack && spec.moe()) {  // else this would test the row kernels again
      for (const Matrix* m : {&w->layers[0].gate_exps, &w->layers[0].up_exps, &w->layers[0].down_exps})
        ASSERT_EQ(m->layout, MatrixLayout::kInterleaved16);
    }
    Result<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
    ASSERT_TRUE(file.ok());
    DecoderModel model(*w, 2);
    std::unique_ptr<KvCache> cache = Cache(w->config);
    ASSERT_NE(cache, nullptr);
    HybridReference right(**file, spec, base), reading(**file, spec, wr.reading);
    double worst = 0, wrong_worst = 0;
    std::vector<float> fast(test::kHVocab);
    const std::vector<int32_t> tokens = Tokens(24);
    for (int pos = 0; pos < 24; ++pos) {
      ASSERT_TRUE(model.Forward(tokens[pos], pos, *cache, fast.data()).ok());
      const std::vector<double> want = right.Forward(tokens[pos]);
      const std::vector<double> other = reading.Forward(tokens[pos]);
      worst = std::max(worst, WorstDifference(fast, want));
      wrong_worst = std::max(wrong_worst,
                             WorstDifference(std::vector<float>(other.begin(), other.end()), want));
    }
    std::printf("%s %s, wrong %s: kvq vs reference %.3g, wrong reading %.3g\n", arch.c_str(),
                q8_0 ? "q8_0" : "f32", wr.what, worst, wrong_worst);
    EXPECT_LT(worst, tolerance);
    EXPECT_GT(wrong_worst, 3 * tolerance) << "reading the " << wr.what << " wrong went unnoticed";
  }
  std::remove(path.c_str());
}

TEST(HybridForward, Qwen35MatchesReference) { CheckArch("qwen35", false); }
TEST(HybridForward, Qwen35MoeMatchesReference) { CheckArch("qwen35moe", false); }
TEST(HybridForward, Qwen3NextMatchesReference) { CheckArch("qwen3next", false); }
TEST(HybridForward, Qwen35Q8MatchesReference) { CheckArch("qwen35", true); }
TEST(HybridForward, Qwen35MoeQ8MatchesReference) { CheckArch("qwen35moe", true); }
TEST(HybridForward, Qwen3NextQ8MatchesReference) { CheckArch("qwen3next", true); }
// The routed experts repacked (each expert's slice of the stack an interleaved matrix): a slice
// read at the wrong offset or in the wrong layout would be far from the reference.
TEST(HybridForward, Qwen35MoeQ8RepackedMatchesReference) { CheckArch("qwen35moe", true, true); }
TEST(HybridForward, Qwen3NextQ8RepackedMatchesReference) { CheckArch("qwen3next", true, true); }

// A block through the scan gives the bits of its tokens one at a time, and so does a batch of
// two sequences (each its own cache and state), for every arch and both weight types, and with
// the Q8_0 weights repacked (the experts' rows grouped by expert then run through the interleaved
// kernels several tokens at a time: a row routed to the wrong expert or back to the wrong token
// changes the block's bits).
TEST(HybridForward, BlockAndBatchEqualTokenByToken) {
  for (const char* arch : {"qwen35", "qwen35moe", "qwen3next"}) {
    for (const auto [q8_0, repack] : {std::pair{false, false}, {true, false}, {true, true}}) {
      SCOPED_TRACE(std::string(arch) + (q8_0 ? " q8_0" : " f32") + (repack ? " repacked" : ""));
      const std::string path =
          test::WriteHybrid(std::string("block_") + arch, {.arch = arch, .q8_0 = q8_0});
      Result<DecoderWeights> w = Load(path, repack);
      ASSERT_TRUE(w.ok()) << w.status().message();
      DecoderModel model(*w, 2);
      std::unique_ptr<KvCache> a = Cache(w->config), b = Cache(w->config), c = Cache(w->config),
                               d = Cache(w->config);
      const std::vector<int32_t> tokens = Tokens(13), other = {5, 1, 9, 33, 2};
      std::vector<float> by_token(test::kHVocab), by_block(test::kHVocab), batch0(test::kHVocab),
          batch1(test::kHVocab), other_alone(test::kHVocab);
      for (size_t i = 0; i < tokens.size(); ++i)
        ASSERT_TRUE(model.Forward(tokens[i], i, *a, by_token.data()).ok());
      // In two blocks (7 + 6), so the second starts from a carried state.
      ASSERT_TRUE(model.ForwardBlock(tokens.data(), 7, 0, *b, nullptr).ok());
      ASSERT_TRUE(model.ForwardBlock(tokens.data() + 7, 6, 7, *b, by_block.data()).ok());
      EXPECT_EQ(by_token, by_block);
      EXPECT_EQ(0, std::memcmp(a->state(), b->state(), a->state_floats() * sizeof(float)));
      const ForwardSegment segments[] = {
          {.tokens = tokens.data(), .n = 13, .pos = 0, .cache = *c, .logits = batch0.data()},
          {.tokens = other.data(), .n = 5, .pos = 0, .cache = *d, .logits = batch1.data()}};
      ASSERT_TRUE(model.ForwardBatch(segments).ok());
      std::unique_ptr<KvCache> e = Cache(w->config);
      ASSERT_TRUE(model.ForwardBlock(other.data(), 5, 0, *e, other_alone.data()).ok());
      EXPECT_EQ(batch0, by_token);
      EXPECT_EQ(batch1, other_alone);
      std::remove(path.c_str());
    }
  }
}

TEST(HybridForward, CacheHoldsOnlyAttentionLayersAndTheState) {
  const std::string path = test::WriteHybrid("bytes", {.arch = "qwen35moe"});
  Result<DecoderWeights> w = Load(path);
  ASSERT_TRUE(w.ok()) << w.status().message();
  const DecoderConfig& c = w->config;
  EXPECT_EQ(c.n_layers, 4);
  EXPECT_EQ(c.n_attention_layers(), 2);  // layers 1 and 3 (interval 2)
  EXPECT_FALSE(c.is_recurrent(1));
  EXPECT_TRUE(c.is_recurrent(2));
  EXPECT_EQ(c.cache_layer(3), 1);
  // Per recurrent layer (K−1)·C + Hv·dk·dv floats.
  EXPECT_EQ(c.state_floats(), 2 * ((test::kHConvK - 1) * test::kHC + test::kHVHeads * 16 * 16));
  std::unique_ptr<KvCache> cache = Cache(c);
  ASSERT_NE(cache, nullptr);
  // f32 K and V rows of the two attention layers only, for every position.
  EXPECT_EQ(cache->plan().total_bytes, int64_t{2} * 2 * test::kHKv * 4 * test::kHContext);
  EXPECT_EQ(cache->state_floats(), c.state_floats());
  // A cache without the state (or with every layer) is refused by the forward pass, by name.
  const FormatDesc* f32 = *FindFormat("f32");
  Result<std::unique_ptr<KvCache>> plain = KvCache::Create({.n_layers = c.n_layers,
                                                            .n_kv_heads = c.n_kv_heads,
                                                            .head_dim = c.head_dim(),
                                                            .layers = {{f32, f32}},
                                                            .max_positions = c.seq_len,
                                                            .page_positions = 32});
  ASSERT_TRUE(plain.ok());
  DecoderModel model(*w, 1);
  std::vector<float> logits(test::kHVocab);
  const Status s = model.Forward(1, 0, **plain, logits.data());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("floats of recurrent state"), std::string::npos) << s.message();
  std::remove(path.c_str());
}

TEST(HybridForward, TruncateIsRefusedWithAState) {
  const std::string path = test::WriteHybrid("truncate", {.arch = "qwen3next"});
  Result<DecoderWeights> w = Load(path);
  ASSERT_TRUE(w.ok()) << w.status().message();
  DecoderModel model(*w, 1);
  std::unique_ptr<KvCache> cache = Cache(w->config), fresh = Cache(w->config);
  const std::vector<int32_t> tokens = Tokens(6);
  std::vector<float> logits(test::kHVocab), again(test::kHVocab);
  ASSERT_TRUE(model.ForwardBlock(tokens.data(), 6, 0, *cache, logits.data()).ok());
  EXPECT_EQ(cache->TruncationPoint(3), 0);
  EXPECT_EQ(cache->TruncationPoint(6), 6);
  const Status s = cache->Truncate(3);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("recurrent state"), std::string::npos) << s.message();
  EXPECT_EQ(cache->positions(0), 6);  // unchanged
  EXPECT_TRUE(cache->Truncate(6).ok());
  // Truncate(0) starts again: state zeroed, the same logits as a fresh cache.
  ASSERT_TRUE(cache->Truncate(0).ok());
  for (int64_t i = 0; i < cache->state_floats(); ++i) ASSERT_EQ(cache->state()[i], 0.0f) << i;
  ASSERT_TRUE(model.ForwardBlock(tokens.data(), 6, 0, *cache, logits.data()).ok());
  ASSERT_TRUE(model.ForwardBlock(tokens.data(), 6, 0, *fresh, again.data()).ok());
  EXPECT_EQ(logits, again);
  std::remove(path.c_str());
}

// Snapshots carry the recurrent state: restore-then-continue gives the bits of continuing without
// the interruption, for each arch and in a quantised KV format; the same restore with the state
// zeroed (what a snapshot of the KV pages alone would give) does not, so the comparison can fail.
TEST(HybridForward, SnapshotRestoreThenContinueEqualsUninterrupted) {
  for (const char* arch : {"qwen35", "qwen35moe", "qwen3next"}) {
    for (const char* format : {"f32", "int8"}) {
      SCOPED_TRACE(testing::Message() << arch << " " << format);
      const std::string path = test::WriteHybrid(std::string("snapshot_") + arch, {.arch = arch});
      Result<DecoderWeights> w = Load(path);
      ASSERT_TRUE(w.ok()) << w.status().message();
      const ModelFingerprint fingerprint = Fingerprint(*w);
      DecoderModel model(*w, 1);
      const std::vector<int32_t> tokens = Tokens(20);
      std::unique_ptr<KvCache> whole = Cache(w->config, format);
      std::vector<float> logits(test::kHVocab);
      ASSERT_TRUE(model.ForwardBlock(tokens.data(), 11, 0, *whole, logits.data()).ok());
      const std::string snapshot = path + ".kvqs";
      ASSERT_TRUE(whole->Save(snapshot, fingerprint, {tokens.begin(), tokens.begin() + 11}).ok());
      std::vector<std::vector<float>> want;  // the uninterrupted run's logits after each token
      for (int t = 11; t < 20; ++t) {
        ASSERT_TRUE(model.Forward(tokens[t], t, *whole, logits.data()).ok());
        want.push_back(logits);
      }
      for (const bool zero_state : {false, true}) {
        std::unique_ptr<KvCache> restored = Cache(w->config, format);
        Result<std::vector<int32_t>> ids = restored->Load(snapshot, fingerprint);
        ASSERT_TRUE(ids.ok()) << ids.status().message();
        ASSERT_EQ(ids->size(), 11u);
        if (zero_state) std::fill_n(restored->state(), restored->state_floats(), 0.0f);
        float worst = 0;
        for (int t = 11; t < 20; ++t) {
          ASSERT_TRUE(model.Forward(tokens[t], t, *restored, logits.data()).ok());
          if (!zero_state) {
            ASSERT_EQ(logits, want[t - 11]) << "position " << t;
          }
          for (int i = 0; i < test::kHVocab; ++i) worst = std::max(worst, std::fabs(logits[i] - want[t - 11][i]));
        }
        if (zero_state) {
          EXPECT_GT(worst, 0.1f) << "a lost state must show in the logits";
        }
      }
      // A cache of a model without this state (or with another) refuses the file, naming both.
      DecoderConfig plain = w->config;
      plain.delta_net.n_v_heads = 2;
      std::unique_ptr<KvCache> other = Cache(plain, format);
      Result<std::vector<int32_t>> refused = other->Load(snapshot, fingerprint);
      ASSERT_FALSE(refused.ok());
      EXPECT_NE(refused.status().message().find("floats of recurrent state"), std::string::npos)
          << refused.status().message();
      std::remove(snapshot.c_str());
      std::remove(path.c_str());
    }
  }
}

// Per-layer head counts (0 for the recurrent layers), as some converters write them.
TEST(HybridLoader, PerLayerKvHeadCounts) {
  const std::string path =
      test::WriteHybrid("kv_array", {.arch = "qwen35", .kv_heads = {0, 2, 0, 2}});
  Result<DecoderWeights> w = Load(path);
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(w->config.n_kv_heads, 2);
  std::remove(path.c_str());
  const std::string bad =
      test::WriteHybrid("kv_array_bad", {.arch = "qwen35", .kv_heads = {0, 2, 0, 1}});
  Result<DecoderWeights> refused = Load(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("qwen35.attention.head_count_kv holds 2 and 1"),
            std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find(bad), std::string::npos) << refused.status().message();
  std::remove(bad.c_str());
}

TEST(HybridForward, RecurrentLayersArrayAndMtpLayers) {
  const std::string path =
      test::WriteHybrid("layers", {.arch = "qwen35", .recurrent = {1, 1, 0, 1, 0}, .nextn = 1});
  Result<DecoderWeights> w = Load(path);
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(w->config.n_layers, 4);  // block_count 5 − 1 MTP block
  EXPECT_EQ(w->config.n_attention_layers(), 1);
  EXPECT_FALSE(w->config.is_recurrent(2));
  EXPECT_TRUE(w->config.is_recurrent(3));
  std::remove(path.c_str());
}

TEST(HybridLoader, BadFilesAreRefusedByName) {
  const struct {
    const char* name;
    TinyHybrid spec;
    std::string must_mention;
  } cases[] = {
      {"no_ssm_a", {.arch = "qwen35", .skip = "blk.0.ssm_a"}, "blk.0.ssm_a"},
      {"no_ba", {.arch = "qwen3next", .skip = "blk.2.ssm_ba.weight"}, "blk.2.ssm_ba.weight"},
      {"no_experts",
       {.arch = "qwen35moe", .skip = "blk.1.ffn_up_exps.weight"},
       "blk.1.ffn_up_exps.weight"},
      {"no_shared_gate",
       {.arch = "qwen3next", .skip = "blk.3.ffn_gate_inp_shexp.weight"},
       "blk.3.ffn_gate_inp_shexp.weight"},
      {"no_gate", {.arch = "qwen35", .skip = "blk.0.attn_gate.weight"}, "blk.0.attn_gate.weight"},
      {"no_conv_kernel",
       {.arch = "qwen35moe", .skip_key = "ssm.conv_kernel"},
       "qwen35moe.ssm.conv_kernel"},
      {"inner_size", {.arch = "qwen35", .inner_size = 80}, "ssm.inner_size = 80"},
      {"legacy", {.arch = "qwen3next", .legacy_ssm_in = true}, "ssm_in"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = test::WriteHybrid(c.name, c.spec);
    Result<DecoderWeights> w = Load(path);
    ASSERT_FALSE(w.ok());
    EXPECT_NE(w.status().message().find(c.must_mention), std::string::npos) << w.status().message();
    EXPECT_NE(w.status().message().find(path), std::string::npos) << w.status().message();
    std::remove(path.c_str());
  }
}

TEST(HybridLoader, UnknownArchitectureListsTheHybrids) {
  GgufWriter w;
  ASSERT_TRUE(w.SetString("general.architecture", "qwen4").ok());
  const std::string path =
      ::testing::TempDir() + "/hybrid_unknown_" + std::to_string(getpid()) + ".gguf";
  ASSERT_TRUE(w.Write(path).ok());
  Result<DecoderWeights> loaded = Load(path);
  ASSERT_FALSE(loaded.ok());
  for (const char* name : {"qwen35", "qwen35moe", "qwen3next", path.c_str()}) {
    EXPECT_NE(loaded.status().message().find(name), std::string::npos) << loaded.status().message();
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kvq
