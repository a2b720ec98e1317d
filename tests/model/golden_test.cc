// The bundled stories260K, greedy with an f32 KV cache, reproduces the reference llama2.c run.c's
// output token for token for every prompt in models/stories260K/golden-runc-ids.txt (run.c's -n 200
// counts positions: BOS + 200 tokens, or fewer when it samples BOS) — from the llama2.c files and
// from the GGUF copy. Also through a streamed cache, since tiers must not change a bit.
#include <gtest/gtest.h>

#include "generate/generate.h"
#include "model/load_model.h"
#include "test_util/golden_runc.h"

namespace kvq {
namespace {

const std::string kDir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";

using Golden = test::GoldenRun;
std::vector<Golden> ReadGolden() { return test::ReadGoldenRuns(); }

// model: "stories260K.bin" (with tok512.bin) or "stories260K.gguf" (its own vocabulary).
std::vector<int32_t> RunGreedy(const std::string& prompt, int32_t n_total, KvBudgets budgets,
                               const std::string& model = "stories260K.bin") {
  Result<LoadedModel> loaded = LoadModel(kDir + model, model == "stories260K.bin" ? kDir + "tok512.bin" : "");
  EXPECT_TRUE(loaded.ok()) << loaded.status().message();
  if (!loaded.ok()) return {};
  LlamaWeights* w = &loaded.value().weights;
  const Tokenizer* tok = &loaded.value().tokenizer;
  const LlamaConfig c = w->config;
  const FormatDesc* f32 = *FindFormat("f32");
  Result<std::unique_ptr<KvCache>> cache =
      KvCache::Create({.n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim(),
                       .layers = {{f32, f32}}, .max_positions = c.seq_len, .page_positions = 64,
                       .budgets = budgets});
  EXPECT_TRUE(cache.ok()) << cache.status().message();
  if (!cache.ok()) return {};  // the callers compare against non-empty goldens, so this fails them
  LlamaModel llama(std::move(*w), 2);
  const int32_t n_prompt = static_cast<int32_t>(tok->Encode(prompt, true).size());
  Result<GenerateResult> r = Generate(llama, *tok, **cache,
                                      {.prompt = prompt, .n_new = n_total - n_prompt, .sampling = {.temperature = 0}},
                                      nullptr);
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (!r.ok()) return {};
  return r->tokens;
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
