// `kvq bench attention` through KvCache: every spec is an arm under its canonical name, with the
// bytes its cache holds (sinks and residual rows in f32 included), a time per step, and the
// spec's shape checked before anything is timed.
#include "measure/attention_bench.h"

#include <gtest/gtest.h>

namespace kvq {
namespace {

KvSpec S(const char* name) { return ParseKvSpec(name).value(); }

TEST(AttentionBench, EverySpecIsAnArmWithItsCacheBytes) {
  AttentionBenchConfig c{.specs = {S("int4"), S("int4+rot"), S("int4+res64+sink4"), S("f32")},
                         .contexts = {40, 300}, .shape = {.n_heads = 4, .n_kv_heads = 2, .head_dim = 64},
                         .reps = 3, .query_blocks = {0, 1}};
  std::vector<std::string> lines;
  const Result<std::vector<AttentionBenchRow>> rows =
      RunAttentionBench(c, [&](const std::string& l) { lines.push_back(l); });
  ASSERT_TRUE(rows.ok()) << rows.status().message();
  ASSERT_EQ(rows->size(), 2u * 4u * 2u);  // contexts × specs × query blocks
  EXPECT_EQ(lines.size(), 2u);
  const RowShape row{.n_kv_heads = 2, .head_dim = 64};
  const char* names[] = {"int4", "int4+rot", "int4+sink4+res64", "f32"};
  for (size_t i = 0; i < rows->size(); ++i) {
    const AttentionBenchRow& r = (*rows)[i];
    const size_t spec = (i / 2) % 4;
    EXPECT_EQ(r.format, names[spec]);
    EXPECT_EQ(r.spec, c.specs[spec]);
    EXPECT_EQ(r.context, i < 8 ? 40 : 300);
    EXPECT_EQ(r.query_block, i % 2 == 0 ? 0 : 1);
    EXPECT_EQ(r.kv_bytes, SpecBytesForRows(r.spec.format->key, r.spec.transforms, row, r.context) +
                              SpecBytesForRows(r.spec.format->value, r.spec.transforms, row, r.context));
    EXPECT_GT(r.ns_per_step, 0);
    EXPECT_LE(r.ns_min, r.ns_per_step);
    EXPECT_GE(r.ns_max, r.ns_per_step);
    EXPECT_EQ(r.score_macs, r.context * 4 * 64);  // one query sees every position
  }
  // Rotation stores the same bytes; sinks and the residual add f32 rows: at 300 positions 64 + 4
  // rows of K and of V (2 × 64 numbers each) — 236 rows encoded of int4's 300.
  const AttentionBenchRow& plain = (*rows)[8];
  const AttentionBenchRow& rotated = (*rows)[10];
  const AttentionBenchRow& held = (*rows)[12];
  EXPECT_EQ(rotated.kv_bytes, plain.kv_bytes);
  EXPECT_EQ(held.kv_bytes,
            2 * (BytesForRows(plain.spec.format->key, row, 236) + int64_t{68} * 2 * 64 * 4));
}

TEST(AttentionBench, ASpecThatDoesNotFitTheShapeIsRefused) {
  AttentionBenchConfig c{.specs = {S("int4"), S("int4+rot")}, .contexts = {64},
                         .shape = {.n_heads = 4, .n_kv_heads = 2, .head_dim = 48}, .reps = 1};
  const Result<std::vector<AttentionBenchRow>> rows = RunAttentionBench(c, {});
  ASSERT_FALSE(rows.ok());
  EXPECT_NE(rows.status().message().find("int4+rot"), std::string::npos) << rows.status().message();
}

}  // namespace
}  // namespace kvq
