// `kvq bench serve --phases replicas` at a tiny size: two replicas of a synth model, conversations
// sharing system prompts, sent once by a round-robin client and once by a prefix-affinity client.
// Checked: the table's structure (a header, one row per client, every request answered, the
// outputs equal under both clients), and that affinity routing got at least as many prompt tokens
// from a cached prefix as round-robin did — counted by the replicas on /metrics
// (vllm:prefix_cache_hits_total), not timed: the machine running the suite may be loaded.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "synth/synth.h"
#include "test_util/serve_processes.h"

namespace kvq::test {
namespace {

TEST(BenchServeReplicas, AffinityRoutingReusesAtLeastAsManyPrefixTokensAsRoundRobin) {
  const std::string model = (std::filesystem::path(::testing::TempDir()) /
                             ("kvq_bench_replicas_" + std::to_string(getpid()) + ".gguf")).string();
  const SynthSpec spec{.arch = SynthArch::kLlama, .dim = 128, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2,
                       .hidden_dim = 256, .context = 1024, .type = "q8_0", .seed = 11};
  const Status written =
      WriteSynthModel(spec, std::string(KVQ_SOURCE_DIR) + "/models/stories260K/stories260K.gguf", model);
  ASSERT_TRUE(written.ok()) << written.message();
  // 4 conversations over 2 system prompts, 3 turns each: 12 requests per client.
  Child bench({KVQ_BINARY, "bench", "serve", "-m", model, "-t", "1", "--phases", "replicas", "--conversations", "4",
               "--system-prompts", "2", "--system-tokens", "200", "--turns", "3", "--max-tokens", "8"});
  ASSERT_TRUE(bench.ReadUntil(std::regex("outputs equal under both clients: (yes|NO)\\n"), nullptr, 0, 300))
      << "no table within 300 s:\n" << bench.log;
  std::filesystem::remove(model);
  const std::string& out = bench.log;
  EXPECT_TRUE(std::regex_search(out, std::regex("\\n  client +requests +failed +TTFT p50 ms +TTFT p99 ms +tok/s "
                                                "+prefix hits \\(tokens\\) +per replica\\n")))
      << out;
  // client, requests, failed, p50, p99, tok/s, hits of prompt tokens, requests per replica
  const std::regex row("\\n  (round-robin|prefix-affinity) +(\\d+) +(\\d+) +([0-9.]+) +([0-9.]+) +([0-9.]+) +"
                       "(\\d+) of (\\d+) +(\\d+) / (\\d+)(?=\\n)");
  std::vector<std::smatch> rows;
  for (std::sregex_iterator it(out.begin(), out.end(), row), end; it != end; ++it) rows.push_back(*it);
  ASSERT_EQ(rows.size(), 2u) << out;
  EXPECT_EQ(rows[0][1], "round-robin");
  EXPECT_EQ(rows[1][1], "prefix-affinity");
  for (const std::smatch& m : rows) {
    EXPECT_EQ(std::stoi(m[2]), 12) << m[1];
    EXPECT_EQ(std::stoi(m[3]), 0) << m[1];
    EXPECT_GT(std::stod(m[4]), 0) << m[1];
    EXPECT_GE(std::stod(m[5]), std::stod(m[4])) << m[1];  // p99 ≥ p50
    EXPECT_GT(std::stod(m[6]), 0) << m[1];
    EXPECT_LE(std::stoll(m[7]), std::stoll(m[8])) << m[1];
    EXPECT_EQ(std::stoi(m[9]) + std::stoi(m[10]), 12) << m[1];
  }
  EXPECT_EQ(rows[0][9], "6");  // round-robin alternates
  EXPECT_GE(std::stoll(rows[1][7]), std::stoll(rows[0][7])) << out;
  EXPECT_NE(out.find("outputs equal under both clients: yes"), std::string::npos) << out;
}

}  // namespace
}  // namespace kvq::test
