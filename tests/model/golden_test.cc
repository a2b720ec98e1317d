// The bundled stories260K, greedy with an f32 KV cache, reproduces the reference llama2.c run.c's
// output token for token for every prompt in models/stories260K/golden-runc-ids.txt (run.c's -n 200
// counts positions: BOS + 200 tokens, or fewer when it samples BOS) — from the llama2.c files and
// from the GGUF copy. Also through a streamed cache, since tiers must not change a bit.
#include <gtest/gtest.h>

#include "kvq/model.h"
#include "kvq/session.h"
#include "test_util/golden_runc.h"

namespace kvq {
namespace {

const std::string kDir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";

using Golden = test::GoldenRun;
std::vector<Golden> ReadGolden() { return test::ReadGoldenRuns(); }

// model: "stories260K.bin" (with tok512.bin) or "stories260K.gguf" (its own vocabulary). Returns
// the prompt's ids and the generated ones.
std::vector<int32_t> RunGreedy(const std::string& prompt, int32_t n_total, KvBudgets budgets,
                               const std::string& model = "stories260K.bin") {
  Result<std::unique_ptr<Model>> m = Model::Load(
      kDir + model, {.tokenizer_path = model == "stories260K.bin" ? kDir + "tok512.bin" : "", .threads = 2,
                     .kv = {.key_format = "f32", .value_format = "f32", .budgets = budgets, .page_positions = 64}});
  EXPECT_TRUE(m.ok()) << m.status().message();
  if (!m.ok()) return {};
  Result<std::unique_ptr<Session>> s = (*m)->NewSession();
  EXPECT_TRUE(s.ok()) << s.status().message();
  if (!s.ok()) return {};  // the callers compare against non-empty goldens, so this fails them
  std::vector<int32_t> ids = (*m)->Tokenize(prompt);
  Result<Completion> c = (*s)->Generate(
      ids, {.max_tokens = n_total - static_cast<int32_t>(ids.size()), .sampling = {.temperature = 0}});
  EXPECT_TRUE(c.ok()) << c.status().message();
  if (!c.ok()) return {};
  ids.insert(ids.end(), c->tokens.begin(), c->tokens.end());
  return ids;
}

TEST(Golden, GreedyMatchesLlama2cRunC) {
  const std::vector<Golden> golden = ReadGolden();
  ASSERT_EQ(golden.size(), 3u);
  for (const Golden& g : golden) {
    std::vector<int32_t> want = g.ids;
    const bool stopped_at_bos = want.size() > 1 && want.back() == 1;
    if (stopped_at_bos) want.pop_back();  // kvq does not append the BOS it stops at
    EXPECT_EQ(RunGreedy(g.prompt, static_cast<int32_t>(g.ids.size()), {}), want) << "prompt \"" << g.prompt << "\"";
  }
}

TEST(Golden, GgufCopyMatchesToo) {
  for (const Golden& g : ReadGolden()) {
    std::vector<int32_t> want = g.ids;
    if (want.size() > 1 && want.back() == 1) want.pop_back();
    EXPECT_EQ(RunGreedy(g.prompt, static_cast<int32_t>(g.ids.size()), {}, "stories260K.gguf"), want)
        << "prompt \"" << g.prompt << "\"";
  }
}

TEST(Golden, StreamedCacheGivesTheSameTokens) {
  const Golden g = ReadGolden()[2];
  EXPECT_EQ(RunGreedy(g.prompt, static_cast<int32_t>(g.ids.size()), {.device_bytes = 64 << 10}),
            RunGreedy(g.prompt, static_cast<int32_t>(g.ids.size()), {}));
}

}  // namespace
}  // namespace kvq
