// The bundled stories260K, greedy with an f32 KV cache, reproduces the reference llama2.c run.c's
// output token for token for every prompt in models/stories260K/golden-runc-ids.txt (run.c's -n 200
// counts positions: BOS + 200 tokens, or fewer when it samples BOS). Also through a streamed cache,
// since tiers must not change a bit.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "model/generate.h"
#include "model/llama2c.h"

namespace kvq {
namespace {

const std::string kDir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";

struct Golden {
  std::string prompt;
  std::vector<int32_t> ids;
};

std::vector<Golden> ReadGolden() {
  std::ifstream in(kDir + "golden-runc-ids.txt");
  std::vector<Golden> out;
  std::string line;
  const std::regex header(R"re(=== model=stories260K\.bin prompt="(.*)" \(token ids)re");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, header)) {
      out.push_back({m[1].str(), {}});
    } else if (line.rfind("IDS:", 0) == 0 && !out.empty()) {
      std::istringstream ids(line.substr(4));
      for (int32_t id; ids >> id;) out.back().ids.push_back(id);
    }
  }
  return out;
}

std::vector<int32_t> RunGreedy(const std::string& prompt, int32_t n_total, KvBudgets budgets) {
  Result<LlamaWeights> w = LoadLlama2c(kDir + "stories260K.bin");
  EXPECT_TRUE(w.ok()) << w.status().message();
  Result<Tokenizer> tok = Tokenizer::LoadLlama2c(kDir + "tok512.bin", w->config.vocab_size);
  EXPECT_TRUE(tok.ok()) << tok.status().message();
  const LlamaConfig c = w->config;
  const FormatDesc* f32 = *FindFormat("f32");
  Result<std::unique_ptr<KvCache>> cache =
      KvCache::Create({.n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim(),
                       .layers = {{f32, f32}}, .max_positions = c.seq_len, .page_positions = 64,
                       .budgets = budgets});
  EXPECT_TRUE(cache.ok()) << cache.status().message();
  LlamaModel model(std::move(w).value(), 2);
  const int32_t n_prompt = static_cast<int32_t>(tok->Encode(prompt, true).size());
  Result<GenerateResult> r = Generate(model, *tok, **cache,
                                      {.prompt = prompt, .n_new = n_total - n_prompt, .sampling = {.temperature = 0}},
                                      nullptr);
  EXPECT_TRUE(r.ok()) << r.status().message();
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

TEST(Golden, StreamedCacheGivesTheSameTokens) {
  const Golden g = ReadGolden()[2];
  EXPECT_EQ(RunGreedy(g.prompt, static_cast<int32_t>(g.ids.size()), {.device_bytes = 64 << 10}),
            RunGreedy(g.prompt, static_cast<int32_t>(g.ids.size()), {}));
}

}  // namespace
}  // namespace kvq
