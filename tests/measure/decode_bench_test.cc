// RunDecodeBench on the bundled model: one row per (context, arm) in order, the byte accounting
// from the registry and the shapes, the ceiling formula of DESIGN.md §5, the speedup relative to
// the reference arm, and refusal of a context past the model's limit.
#include "measure/decode_bench.h"

#include <gtest/gtest.h>

#include "kvq/kv_memory.h"
#include "model/llama2c.h"
#include "weights/matvec.h"

namespace kvq {
namespace {

// The bundled model, or null (the failure recorded) when it does not load: callers ASSERT.
std::unique_ptr<LlamaModel> BundledModel() {
  Result<LlamaWeights> w = LoadLlama2c(std::string(KVQ_SOURCE_DIR) + "/models/stories260K/stories260K.bin");
  EXPECT_TRUE(w.ok()) << w.status().message();
  if (!w.ok()) return nullptr;
  return std::make_unique<LlamaModel>(std::move(w).value(), 1);
}

TEST(DecodeBench, RowsAccountingAndCeilings) {
  const std::unique_ptr<LlamaModel> bundled = BundledModel();
  ASSERT_NE(bundled, nullptr);
  LlamaModel& model = *bundled;
  const LlamaConfig& c = model.config();
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
    // DESIGN.md §5: 1 / (1 − share · (1 − r)), r = this arm's KV bytes over f16's.
    EXPECT_DOUBLE_EQ(r.ceiling, 1.0 / (1.0 - share * (1.0 - static_cast<double>(kv_bytes) / f16_kv)));
  }
  EXPECT_EQ((*rows)[4].speedup, 1.0) << "f16 is the reference arm";
  EXPECT_GT((*rows)[3].ceiling, (*rows)[5].ceiling) << "int4 reads fewer bytes than int8";
}

TEST(DecodeBench, ContextPastTheModelIsRefused) {
  const std::unique_ptr<LlamaModel> bundled = BundledModel();
  ASSERT_NE(bundled, nullptr);
  LlamaModel& model = *bundled;
  DecodeBenchConfig config{.formats = {*FindFormat("f16")}, .contexts = {model.config().seq_len - 2}, .reps = 2};
  Result<std::vector<DecodeBenchRow>> rows = RunDecodeBench(model, config, {});
  ASSERT_FALSE(rows.ok());
  EXPECT_NE(rows.status().message().find("past the model's context of 512"), std::string::npos)
      << rows.status().message();
}

}  // namespace
}  // namespace kvq
