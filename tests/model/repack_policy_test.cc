// LoadModel's repack choice (model/load_model.h, RepackPolicy) on the tiny-qwen35moe synth, a
// mixture-of-experts hybrid whose Q8_0 experts repack: kAuto with less memory than the experts'
// copy leaves them in the file's layout and gives the logits of a load that repacks the dense
// matrices alone, bit for bit; kAuto with room gives kAll's, bit for bit. The layouts are checked
// directly; on AVX3 the experts' layout also moves the logits (another order of f32 sums). The
// memory figure is injected (RepackOptions::memory_available), so no big machine is needed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf_reader.h"
#include "model/cache_config.h"
#include "model/decoder.h"
#include "model/gguf_llama.h"
#include "model/load_model.h"
#include "synth/synth.h"
#include "test_util/bundled_paths.h"

namespace kvq {
namespace {

const std::string kStories = test::BundledGgufPath();

class RepackPolicyTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string(testing::TempDir() + "/repack_policy_" + std::to_string(getpid()) + ".gguf");
    ASSERT_TRUE(WriteSynthModel(*SynthPreset("tiny-qwen35moe"), kStories, *path_).ok());
  }
  static void TearDownTestSuite() {
    std::filesystem::remove(*path_);
    delete path_;
  }
  static inline std::string* path_ = nullptr;
};

// [2][vocab] the logits through `weights` after a block of 8 tokens (the prefill kernels, several
// tokens per matrix product) and after one more token (the decode kernels).
std::vector<float> Logits(DecoderWeights weights) {
  const DecoderConfig c = weights.config;
  DecoderModel m(std::move(weights), 2);
  const FormatDesc* f32 = *FindFormat("f32");
  Result<std::unique_ptr<KvCache>> cache = CreateModelCache(c, 64, {.layers = {{f32, f32}}, .page_positions = 32});
  EXPECT_TRUE(cache.ok()) << cache.status().message();
  if (!cache.ok()) return {};
  std::vector<int32_t> tokens;
  for (int i = 0; i < 9; ++i) tokens.push_back(i * 37 % c.vocab_size);
  std::vector<float> logits(2 * static_cast<size_t>(c.vocab_size));
  EXPECT_TRUE(m.ForwardBlock(tokens.data(), 8, 0, **cache, logits.data()).ok());
  EXPECT_TRUE(m.Forward(tokens[8], 8, **cache, logits.data() + c.vocab_size).ok());
  return logits;
}

// The layouts of every layer's routed experts and of its dense projections (w1: the shared
// expert's gate), each required to be `want`.
void ExpectLayouts(const DecoderWeights& w, MatrixLayout experts, MatrixLayout dense) {
  for (const LayerWeights& L : w.layers) {
    for (const Matrix* m : {&L.gate_exps, &L.up_exps, &L.down_exps}) EXPECT_EQ(m->layout, experts);
    EXPECT_EQ(L.w1.layout, dense);
  }
}

DecoderWeights Load(const std::string& path, RepackOptions repack) {
  Result<LoadedModel> loaded = LoadModel(path, "", 0, repack);
  EXPECT_TRUE(loaded.ok()) << loaded.status().message();
  return std::move(loaded.value().weights);
}

TEST_F(RepackPolicyTest, AutoWithLittleMemoryLeavesTheExpertsMapped) {
  DecoderWeights low = Load(*path_, {.policy = RepackPolicy::kAuto, .memory_available = 1});
  ExpectLayouts(low, MatrixLayout::kRowMajor, MatrixLayout::kInterleaved16);
  // The same file with the dense matrices alone repacked, by hand.
  Result<std::unique_ptr<GgufFile>> f = GgufFile::Open(*path_);
  ASSERT_TRUE(f.ok()) << f.status().message();
  Result<DecoderWeights> dense = LoadGgufLlama(std::shared_ptr<GgufFile>(std::move(f).value()));
  ASSERT_TRUE(dense.ok()) << dense.status().message();
  RepackWeights(&dense.value(), /*release_mapped_pages=*/false, {.dense = true, .experts = false});
  const std::vector<float> auto_low = Logits(std::move(low));
  EXPECT_EQ(auto_low, Logits(std::move(dense).value()));
  // Whether kAll's logits differ depends on the SIMD target: on AVX3 the two expert layouts' kernels
  // sum in different orders, on AVX2 (the sanitizer build's widest target, and AVX2-only hosts) in
  // the same one. So the layouts are what tell the loads apart (ExpectLayouts above); the logits
  // check that leaving the experts mapped changes nothing else.
  const bool layouts_show = auto_low != Logits(Load(*path_, {.policy = RepackPolicy::kAll}));
  std::printf("the experts' layout %s the logits on this target\n", layouts_show ? "changes" : "does not change");
}

TEST_F(RepackPolicyTest, AutoWithRoomEqualsAll) {
  DecoderWeights high = Load(*path_, {.policy = RepackPolicy::kAuto, .memory_available = int64_t{1} << 40});
  ExpectLayouts(high, MatrixLayout::kInterleaved16, MatrixLayout::kInterleaved16);
  DecoderWeights all = Load(*path_, {.policy = RepackPolicy::kAll, .memory_available = 1});
  ExpectLayouts(all, MatrixLayout::kInterleaved16, MatrixLayout::kInterleaved16);
  EXPECT_EQ(Logits(std::move(high)), Logits(std::move(all)));
}

TEST_F(RepackPolicyTest, NoneRepacksNothing) {
  DecoderWeights none = Load(*path_, {.policy = RepackPolicy::kNone, .memory_available = int64_t{1} << 40});
  ExpectLayouts(none, MatrixLayout::kRowMajor, MatrixLayout::kRowMajor);
  EXPECT_EQ(none.repacked, nullptr);
}

// The decision's threshold, at the byte: the experts are repacked exactly when their copy fits in
// what is available less the headroom and the dense copy, and the note names the figures.
TEST_F(RepackPolicyTest, AutoRepacksTheExpertsExactlyWhenTheirCopyFits) {
  Result<std::unique_ptr<GgufFile>> f = GgufFile::Open(*path_);
  ASSERT_TRUE(f.ok());
  Result<DecoderWeights> w = LoadGgufLlama(std::shared_ptr<GgufFile>(std::move(f).value()));
  ASSERT_TRUE(w.ok());
  const int64_t experts = RepackedBytes(*w, {.dense = false, .experts = true});
  const int64_t dense = RepackedBytes(*w, {.dense = true, .experts = false});
  ASSERT_GT(experts, 0);
  ASSERT_GT(dense, 0);
  // The least `available` that fits: available − (1 GiB + available / 10) ≥ experts + dense.
  int64_t fits = experts + dense + RepackHeadroom(experts + dense);
  while (fits - RepackHeadroom(fits) < experts + dense) ++fits;
  const RepackDecision yes = RepackChoice(*w, {.policy = RepackPolicy::kAuto, .memory_available = fits});
  EXPECT_TRUE(yes.parts.dense && yes.parts.experts);
  EXPECT_EQ(yes.note, "");
  const RepackDecision no = RepackChoice(*w, {.policy = RepackPolicy::kAuto, .memory_available = fits - 1});
  EXPECT_TRUE(no.parts.dense);
  EXPECT_FALSE(no.parts.experts);
  EXPECT_NE(no.note.find("experts left in the file's layout"), std::string::npos) << no.note;
  EXPECT_NE(no.note.find("--repack all"), std::string::npos) << no.note;
  // kAll and kNone ignore the memory.
  const RepackDecision all = RepackChoice(*w, {.policy = RepackPolicy::kAll, .memory_available = 1});
  EXPECT_TRUE(all.parts.dense && all.parts.experts);
  const RepackDecision none = RepackChoice(*w, {.policy = RepackPolicy::kNone, .memory_available = int64_t{1} << 40});
  EXPECT_FALSE(none.parts.dense || none.parts.experts);
  // What RepackWeights allocates is the two parts' sum.
  EXPECT_EQ(RepackWeights(&w.value(), /*release_mapped_pages=*/false), experts + dense);
}

}  // namespace
}  // namespace kvq
