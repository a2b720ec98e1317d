// The forward pass gives the same logits on every SIMD target for a Q4_0 model (repacked at load)
// with integer-score KV formats: the page's WebAssembly SIMD128 build must reproduce native kvq
// run's greedy ids (issue 32), and the native targets stand in for it — HWY_SCALAR, like SIMD128,
// has no fused multiply-add, so a kernel whose bits follow FMA or the lane count shows here as
// AVX2/AVX3 ≠ SCALAR. Strict equality: the repacked weight kernels (weights/matvec.h), the
// integer scores (formats/int_score.h), PortableExp (softmax factors, SwiGLU) and the unfused
// value accumulation give the same bits by construction. f32-score formats (f16 keys ...) are
// not covered: their q·k sums follow the lane count (formats/row_kernels-inl.h).
#include <gtest/gtest.h>
#include <hwy/targets.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "kvq/model.h"
#include "kvq/session.h"
#include "synth/synth.h"
#include "test_util/target_scope.h"

namespace kvq {
namespace {

// Logits at every position of `ids`, teacher-forced, [ids.size()][vocab].
std::vector<float> AllLogits(const Model& model, const char* kv, const std::vector<int32_t>& ids) {
  Result<std::unique_ptr<Session>> s = model.NewSession({.key_format = kv, .value_format = kv});
  EXPECT_TRUE(s.ok()) << s.status().message();
  if (!s.ok()) return {};
  std::vector<int32_t> every(ids.size());
  for (size_t i = 0; i < every.size(); ++i) every[i] = static_cast<int32_t>(i);
  const Status st = (*s)->Prefill(ids, every);
  EXPECT_TRUE(st.ok()) << st.message();
  return std::vector<float>((*s)->chosen_logits().begin(), (*s)->chosen_logits().end());
}

TEST(TargetForward, Q4_0WithIntegerScoresIsTheSameOnEveryTarget) {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_GE(targets.size(), 2u) << "one SIMD target here: nothing to compare";
  // A qwen3 (q/k norms, grouped KV, halves RoPE at θ = 10^6 as Qwen3's) whose matrices all repack
  // (rows multiples of 16), head_dim 128 as qwen3-0.6b's.
  SynthSpec spec{.name = "target-forward", .arch = SynthArch::kQwen3, .dim = 256, .n_layers = 2, .n_heads = 4,
                 .head_dim_override = 128, .n_kv_heads = 2, .hidden_dim = 512, .context = 256,
                 .rope_theta = 1000000.0f};
  spec.type = "q4_0";
  const std::string path = ::testing::TempDir() + "target_forward_" + std::to_string(getpid()) + ".gguf";
  const std::string vocab = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/stories260K.gguf";
  ASSERT_TRUE(WriteSynthModel(spec, vocab, path).ok());
  Result<std::unique_ptr<Model>> model = Model::Load(path, {.threads = 1});
  std::remove(path.c_str());
  ASSERT_TRUE(model.ok()) << model.status().message();
  // 80 positions: three prefill blocks' worth, several softmax tiles.
  std::vector<int32_t> ids = (*model)->Tokenize("Once upon a time there was a little dog who liked to run in the park. "
                                                "He ran and ran until the sun went down and the moon came up.");
  while (ids.size() < 80) ids.push_back(static_cast<int32_t>((ids.size() * 37) % 500 + 3));
  for (const char* kv : {"int8", "int4"}) {
    const std::vector<float> best = AllLogits(**model, kv, ids);
    ASSERT_EQ(best.size(), ids.size() * static_cast<size_t>((*model)->info().vocab_size));
    for (size_t t = 1; t < targets.size(); ++t) {
      test::TargetScope scope(targets[t]);
      const std::vector<float> other = AllLogits(**model, kv, ids);
      ASSERT_EQ(other.size(), best.size());
      size_t first = best.size();
      for (size_t i = 0; i < best.size() && first == best.size(); ++i)
        if (best[i] != other[i]) first = i;
      EXPECT_EQ(first, best.size()) << kv << ": " << hwy::TargetName(targets[t]) << " differs from "
                                    << hwy::TargetName(targets[0]) << " first at position "
                                    << first / (*model)->info().vocab_size << " (" << best[first] << " vs "
                                    << other[first] << ")";
    }
  }
}

}  // namespace
}  // namespace kvq
