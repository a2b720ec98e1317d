// RunBatchBench on the bundled model: one row per (context, session count) in order, every
// session's logits bit-identical to the first arm's (the bench's correctness signal), the ratios
// relative to the first arm; refusals of an empty or non-positive arm list and of a context past
// the model's. No timing is checked.
#include "api_bench/batch_bench.h"

#include <gtest/gtest.h>

namespace kvq {
namespace {

std::unique_ptr<Model> Bundled() {
  const std::string dir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";
  Result<std::unique_ptr<Model>> m =
      Model::Load(dir + "stories260K.bin",
                  {.tokenizer_path = dir + "tok512.bin", .threads = 1, .context = 100});
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

TEST(BatchBench, RowsPerContextAndCountAllBitIdentical) {
  std::unique_ptr<Model> m = Bundled();
  ASSERT_NE(m, nullptr);
  const BatchBenchConfig config{.sessions = {2, 1, 5},
                                .contexts = {0, 40},
                                .steps = 3,
                                .rounds = 2,
                                .kv = {.key_format = "int4-kivi", .value_format = "int4-kivi"}};
  EXPECT_EQ(BatchBenchPositions(config, 40), 40 + 1 + 6);
  std::vector<std::string> lines;
  Result<std::vector<BatchBenchRow>> rows =
      RunBatchBench(*m, config, [&](const std::string& line) { lines.push_back(line); });
  ASSERT_TRUE(rows.ok()) << rows.status().message();
  ASSERT_EQ(rows->size(), 6u);
  for (size_t i = 0; i < rows->size(); ++i) {
    const BatchBenchRow& r = (*rows)[i];
    EXPECT_EQ(r.context, i < 3 ? 0 : 40);
    EXPECT_EQ(r.sessions, config.sessions[i % 3]);
    EXPECT_TRUE(r.bit_identical) << i;
    EXPECT_LE(r.tps_min, r.tokens_per_second);
    EXPECT_GE(r.tps_max, r.tokens_per_second);
    EXPECT_DOUBLE_EQ(r.per_session_tps, r.tokens_per_second / r.sessions);
    EXPECT_DOUBLE_EQ(r.vs_first, r.tokens_per_second / (*rows)[i - i % 3].tokens_per_second);
  }
  EXPECT_FALSE(lines.empty());
}

TEST(BatchBench, Refusals) {
  std::unique_ptr<Model> m = Bundled();
  ASSERT_NE(m, nullptr);
  auto message = [&](const BatchBenchConfig& c) {
    Result<std::vector<BatchBenchRow>> r = RunBatchBench(*m, c, {});
    return r.ok() ? std::string("(ok)") : r.status().message();
  };
  EXPECT_NE(message({.sessions = {}}).find("no session counts"), std::string::npos);
  EXPECT_NE(message({.sessions = {1, 0}}).find("at least 1 (got 0)"), std::string::npos);
  // 90 + 1 + 2·5 = 101 positions: one past the context of 100.
  EXPECT_NE(message({.sessions = {1}, .contexts = {90}, .steps = 5, .rounds = 2})
                .find("model's context of 100"),
            std::string::npos);
  EXPECT_NE(message({.sessions = {1}, .concurrent = true, .session_threads = 0}).find("session_threads must be in 1..1024 (got 0)"),
            std::string::npos);
}

TEST(BatchBench, ConcurrentArmsAreBitIdenticalToOneSessionAlone) {
  // Each session of an arm decodes on its own OS thread at once (1 and 2 threads of its own); its
  // logits after the run must equal the 1-session arm's, a session run alone.
  std::unique_ptr<Model> m = Bundled();
  ASSERT_NE(m, nullptr);
  for (int32_t threads : {1, 2}) {
    const BatchBenchConfig config{.sessions = {1, 2, 3}, .contexts = {30}, .steps = 4, .rounds = 2,
                                  .concurrent = true, .session_threads = threads};
    Result<std::vector<BatchBenchRow>> rows = RunBatchBench(*m, config, {});
    ASSERT_TRUE(rows.ok()) << rows.status().message();
    ASSERT_EQ(rows->size(), 3u);
    for (const BatchBenchRow& r : *rows) {
      EXPECT_TRUE(r.bit_identical) << r.sessions << " sessions, " << threads << " threads each";
      EXPECT_GT(r.tokens_per_second, 0);
    }
  }
}

}  // namespace
}  // namespace kvq
