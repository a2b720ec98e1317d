// RunDecodeBench on the bundled model: one row per (context, arm) in order, the byte accounting
// from the registry and the shapes, the ceiling formula of docs/design.md §5, the speedup relative to
// the reference arm, and refusal of a context past the model's limit.
#include "measure/decode_bench.h"

#include <gtest/gtest.h>

#include "kvq/kv_memory.h"
#include "model/gguf_llama.h"
#include "model/llama2c.h"
#include "test_util/hybrid_model.h"
#include "weights/matvec.h"

namespace kvq {
namespace {

// The bundled model, or null (the failure recorded) when it does not load: callers ASSERT.
std::unique_ptr<DecoderModel> BundledModel() {
  Result<DecoderWeights> w = LoadLlama2c(std::string(KVQ_SOURCE_DIR) + "/models/stories260K/stories260K.bin");
  EXPECT_TRUE(w.ok()) << w.status().message();
  if (!w.ok()) return nullptr;
  return std::make_unique<DecoderModel>(std::move(w).value(), 1);
}

TEST(DecodeBench, RowsAccountingAndCeilings) {
  const std::unique_ptr<DecoderModel> bundled = BundledModel();
  ASSERT_NE(bundled, nullptr);
  DecoderModel& model = *bundled;
  const DecoderConfig& c = model.config();
  DecodeBenchConfig config{.formats = {*FindFormat("int4"), *FindFormat("f16"), *FindFormat("int8")},
                           .contexts = {0, 100}, .reps = 2};
  ASSERT_EQ(KvSpecName(*DecodeBenchReference(config)), "f16");
  Result<std::vector<DecodeBenchRow>> rows = RunDecodeBench(model, config, {});
  ASSERT_TRUE(rows.ok()) << rows.status().message();
  ASSERT_EQ(rows->size(), 6u);

  // Weights: the bundled f32 model, counted independently from its shape (every matrix f32, the
  // classifier shared with the embedding but read again as the classifier, 2 norms per layer).
  const int64_t d = c.dim, kv = c.kv_dim(), h = c.hidden_dim;
  const int64_t per_layer = (d * d + 2 * kv * d + d * d + 3 * h * d + 2 * d) * 4;
  const int64_t want_weights = c.n_layers * per_layer + (int64_t{c.vocab_size} * d + d + d) * 4;
  EXPECT_EQ(WeightBytesPerStep(model.weights()), want_weights);

  const KvShape shape{.n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim()};
  const int64_t f16_kv = *KvBytesForContext(**FindFormat("f16"), shape, 100);
  for (size_t i = 0; i < rows->size(); ++i) {
    const DecodeBenchRow& r = (*rows)[i];
    EXPECT_EQ(r.context, i < 3 ? 0 : 100);
    EXPECT_EQ(r.format, KvSpecName(config.formats[i % 3]));
    EXPECT_GT(r.ms_median, 0.0);
    EXPECT_LE(r.ms_min, r.ms_median);
    EXPECT_GE(r.ms_max, r.ms_median);
    EXPECT_EQ(r.weight_bytes, want_weights);
    if (r.context == 0) {
      EXPECT_EQ(r.kv_bytes, 0);
      EXPECT_EQ(r.ceiling, 1.0);
      continue;
    }
    const int64_t kv_bytes = *KvBytesForContext(**FindFormat(r.format), shape, 100);
    EXPECT_EQ(r.kv_bytes, kv_bytes);
    const double share = static_cast<double>(f16_kv) / static_cast<double>(f16_kv + want_weights);
    EXPECT_DOUBLE_EQ(r.kv_share, share);
    // docs/design.md §5: 1 / (1 − share · (1 − r)), r = this arm's KV bytes over f16's.
    EXPECT_DOUBLE_EQ(r.ceiling, 1.0 / (1.0 - share * (1.0 - static_cast<double>(kv_bytes) / f16_kv)));
  }
  EXPECT_EQ((*rows)[4].speedup, 1.0) << "f16 is the reference arm";
  EXPECT_GT((*rows)[3].ceiling, (*rows)[5].ceiling) << "int4 reads fewer bytes than int8";
}

// A hybrid MoE model (tiny qwen35moe: layers 0 and 2 recurrent, 1 and 3 attention, 6 experts of
// which 2 per token): KV counted in the attention layers only, the recurrent state once per step,
// the weights without the stacked experts, and the experts a decode step reads measured — one
// token runs exactly k experts per layer, so that is k of each MoE layer's expert slices.
TEST(DecodeBench, HybridCountsAttentionLayersStateAndTheExpertsRead) {
  using namespace test;
  const std::string path = WriteHybrid("decode_bench", {.arch = "qwen35moe"});
  Result<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  Result<DecoderWeights> w = LoadGgufLlama(std::shared_ptr<GgufFile>(std::move(file).value()));
  ASSERT_TRUE(w.ok()) << w.status().message();
  DecoderModel model(std::move(w).value(), 1);
  DecodeBenchConfig config{.formats = {*FindFormat("f16"), *FindFormat("int8")}, .contexts = {20}, .reps = 3};
  Result<std::vector<DecodeBenchRow>> rows = RunDecodeBench(model, config, {});
  ASSERT_TRUE(rows.ok()) << rows.status().message();
  ASSERT_EQ(rows->size(), 2u);

  // Every tensor F32 (4 bytes a number), counted from the writer's shapes.
  const int64_t dv = kHCv / kHVHeads;
  const int64_t recurrent = int64_t{kHDim} * kHC + int64_t{kHDim} * kHCv + 2 * int64_t{kHDim} * kHVHeads +
                            kHConvK * kHC + 2 * kHVHeads + dv + int64_t{kHCv} * kHDim;
  const int64_t attention = int64_t{kHDim} * 2 * kHQ + 2 * int64_t{kHDim} * kHKv + 2 * kHHeadDim + int64_t{kHQ} * kHDim;
  const int64_t ffn = int64_t{kHDim} * kHExperts + kHDim + 3 * int64_t{kHDim} * kHSharedFfn;  // router, shared
  const int64_t dense = (2 * recurrent + 2 * attention + 4 * ffn + 4 * 2 * kHDim +  // + the two norms a layer
                         kHDim + int64_t{kHVocab} * kHDim + kHDim) * 4;  // embedding row, tied classifier, norm
  const int64_t experts = 4 * kHUsed * int64_t{3} * kHDim * kHExpertFfn * 4;  // 4 MoE layers, gate up down
  const int64_t state = 2 * (int64_t{kHC} * (kHConvK - 1) + int64_t{kHVHeads} * kHKeyDim * dv) * 4;
  const int64_t f16_kv = 2 * 20 * int64_t{kHKv} * 2 * 2;  // 2 attention layers, K and V, 2 bytes
  EXPECT_EQ(WeightBytesPerStep(model.weights()), dense);
  for (const DecodeBenchRow& r : *rows) {
    EXPECT_EQ(r.expert_bytes, experts) << r.format;
    EXPECT_EQ(r.weight_bytes, dense + experts) << r.format;
    EXPECT_EQ(r.state_bytes, state) << r.format;
    EXPECT_DOUBLE_EQ(r.kv_share, static_cast<double>(f16_kv) / static_cast<double>(f16_kv + dense + experts + state));
  }
  EXPECT_EQ((*rows)[0].kv_bytes, f16_kv);
  EXPECT_EQ((*rows)[1].kv_bytes, *DecodeKvBytes(model.config(), config.formats[1], 20));
  EXPECT_LT((*rows)[1].kv_bytes, f16_kv);
  std::remove(path.c_str());
}

TEST(DecodeBench, ContextPastTheModelIsRefused) {
  const std::unique_ptr<DecoderModel> bundled = BundledModel();
  ASSERT_NE(bundled, nullptr);
  DecoderModel& model = *bundled;
  DecodeBenchConfig config{.formats = {*FindFormat("f16")}, .contexts = {model.config().seq_len - 2}, .reps = 2};
  Result<std::vector<DecodeBenchRow>> rows = RunDecodeBench(model, config, {});
  ASSERT_FALSE(rows.ok());
  EXPECT_NE(rows.status().message().find("past the model's context of 512"), std::string::npos)
      << rows.status().message();
}

}  // namespace
}  // namespace kvq
