// The K-quant mixes as a pure function: which type name each tensor of a model gets, against
// tables derived here by hand from llama.cpp's rules (llama-quant.cpp llama_tensor_get_type),
// for the 28-layer Qwen3 shapes (GQA 16/8) and the 16-layer Llama 3.2 1B shape (GQA 32/8).
#include "synth/type_mix.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace kvq {
namespace {

using R = SynthTensorRole;
constexpr TypeMixModel kQwen3{.n_layers = 28, .n_heads = 16, .n_kv_heads = 8, .tied_embeddings = true};

const TypeMix& Mix(const char* name) {
  const TypeMix* m = FindTypeMix(name);
  EXPECT_NE(m, nullptr) << name;
  return *m;
}

TEST(TypeMix, NamesFileTypesAndBases) {
  // llama_ftype ids (llama.h): MOSTLY_Q2_K 10, Q3_K_M 12, Q4_K_M 15, Q5_K_M 17, Q6_K 18.
  const struct { const char* name; uint32_t ftype; const char* base; } want[] = {
      {"q2_k", 10, "q2_k"}, {"q3_k_m", 12, "q3_k"}, {"q4_k_m", 15, "q4_k"}, {"q5_k_m", 17, "q5_k"}, {"q6_k", 18, "q6_k"}};
  ASSERT_EQ(TypeMixes().size(), std::size(want));
  for (const auto& w : want) {
    const TypeMix& m = Mix(w.name);
    EXPECT_EQ(m.file_type, w.ftype) << w.name;
    EXPECT_STREQ(m.base, w.base);
  }
  EXPECT_EQ(FindTypeMix("Q4_K_M"), FindTypeMix("q4_k_m"));
  EXPECT_EQ(FindTypeMix("q4_0"), nullptr);
  EXPECT_EQ(TypeMixNameList(), "q2_k, q3_k_m, q4_k_m, q5_k_m, q6_k");
}

TEST(TypeMix, UseMoreBitsIsHalfOfTwentyEightLayers) {
  // n/8 = 3, 7n/8 = 24: layers 0-2, 24-27, and (i - 3) % 3 == 2 between: 5, 8, ..., 23.
  const std::set<int64_t> want = {0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27};
  for (int64_t l = 0; l < 28; ++l) EXPECT_EQ(TypeMixUseMoreBits(l, 28), want.count(l) == 1) << l;
}

TEST(TypeMix, Q4KMAndQ5KMGiveHalfTheVAndDownLayersQ6K) {
  const std::set<int64_t> more = {0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27};
  for (const char* name : {"q4_k_m", "q5_k_m"}) {
    SCOPED_TRACE(name);
    const TypeMix& m = Mix(name);
    const std::string base = m.base;
    EXPECT_EQ(MixTensorTypeName(m, R::kTokenEmbd, -1, 2048, kQwen3), "q6_k");  // tied: the classifier
    TypeMixModel separate = kQwen3;
    separate.tied_embeddings = false;
    EXPECT_EQ(MixTensorTypeName(m, R::kTokenEmbd, -1, 2048, separate), base);
    EXPECT_EQ(MixTensorTypeName(m, R::kOutput, -1, 2048, separate), "q6_k");
    for (int64_t l = 0; l < 28; ++l) {
      const std::string v = more.count(l) ? "q6_k" : base;
      EXPECT_EQ(MixTensorTypeName(m, R::kAttnV, l, 2048, kQwen3), v) << l;
      EXPECT_EQ(MixTensorTypeName(m, R::kFfnDown, l, 6144, kQwen3), v) << l;
      for (R r : {R::kAttnQ, R::kAttnK, R::kAttnOutput, R::kFfnGate, R::kFfnUp}) {
        EXPECT_EQ(MixTensorTypeName(m, r, l, 2048, kQwen3), base) << l;
      }
    }
  }
}

TEST(TypeMix, Q3KMQ2KAndQ6K) {
  const TypeMix& q3 = Mix("q3_k_m");
  // attn_v: the first two Q5_K, then Q4_K; ffn_down: layer < 28/16 = 1 Q5_K, then Q4_K;
  // attn_output Q4_K; the rest Q3_K.
  EXPECT_EQ(MixTensorTypeName(q3, R::kAttnV, 1, 2048, kQwen3), "q5_k");
  EXPECT_EQ(MixTensorTypeName(q3, R::kAttnV, 2, 2048, kQwen3), "q4_k");
  EXPECT_EQ(MixTensorTypeName(q3, R::kFfnDown, 0, 6144, kQwen3), "q5_k");
  EXPECT_EQ(MixTensorTypeName(q3, R::kFfnDown, 1, 6144, kQwen3), "q4_k");
  EXPECT_EQ(MixTensorTypeName(q3, R::kAttnOutput, 9, 2048, kQwen3), "q4_k");
  EXPECT_EQ(MixTensorTypeName(q3, R::kFfnUp, 9, 2048, kQwen3), "q3_k");
  EXPECT_EQ(MixTensorTypeName(q3, R::kTokenEmbd, -1, 2048, kQwen3), "q6_k");
  const TypeMix& q2 = Mix("q2_k");
  // attn_v: Q3_K at GQA 2 (Qwen3), Q4_K at GQA 4 (Llama 3.2 1B: 32 / 8); ffn_down and
  // attn_output Q3_K; the rest Q2_K.
  EXPECT_EQ(MixTensorTypeName(q2, R::kAttnV, 0, 2048, kQwen3), "q3_k");
  const TypeMixModel llama{.n_layers = 16, .n_heads = 32, .n_kv_heads = 8, .tied_embeddings = true};
  EXPECT_EQ(MixTensorTypeName(q2, R::kAttnV, 0, 2048, llama), "q4_k");
  EXPECT_EQ(MixTensorTypeName(q2, R::kFfnDown, 5, 8192, llama), "q3_k");
  EXPECT_EQ(MixTensorTypeName(q2, R::kAttnOutput, 5, 2048, llama), "q3_k");
  EXPECT_EQ(MixTensorTypeName(q2, R::kAttnQ, 5, 2048, llama), "q2_k");
  const TypeMix& q6 = Mix("q6_k");
  for (R r : {R::kTokenEmbd, R::kAttnV, R::kFfnDown, R::kAttnQ}) {
    EXPECT_EQ(MixTensorTypeName(q6, r, 3, 2048, kQwen3), "q6_k");
  }
}

TEST(TypeMix, RowsThatAreNotWholeSuperBlocksFallBack) {
  // 896 (Qwen2.5 0.5B's dim) = 3.5 blocks of 256: Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1,
  // Q6_K -> Q8_0; the classifier Q8_0. 40 is not a multiple of 32 either: F16.
  const TypeMixModel m{.n_layers = 24, .n_heads = 14, .n_kv_heads = 2, .tied_embeddings = true};
  EXPECT_EQ(MixTensorTypeName(Mix("q2_k"), R::kAttnQ, 3, 896, m), "q4_0");
  EXPECT_EQ(MixTensorTypeName(Mix("q3_k_m"), R::kFfnUp, 3, 896, m), "q4_0");
  EXPECT_EQ(MixTensorTypeName(Mix("q4_k_m"), R::kAttnQ, 3, 896, m), "q5_0");
  EXPECT_EQ(MixTensorTypeName(Mix("q5_k_m"), R::kAttnQ, 3, 896, m), "q5_1");
  EXPECT_EQ(MixTensorTypeName(Mix("q6_k"), R::kAttnQ, 3, 896, m), "q8_0");
  EXPECT_EQ(MixTensorTypeName(Mix("q4_k_m"), R::kTokenEmbd, -1, 896, m), "q8_0");
  EXPECT_EQ(MixTensorTypeName(Mix("q4_k_m"), R::kFfnDown, 0, 4864, m), "q6_k");  // 4864 = 19 · 256
  EXPECT_EQ(MixTensorTypeName(Mix("q4_k_m"), R::kAttnQ, 0, 40, m), "f16");
}

}  // namespace
}  // namespace kvq
