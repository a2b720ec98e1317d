// The tokenizer.json importer (text/hf_tokenizer_json.h) on small hand-built files: both merge
// forms, added tokens and their types, ids no token has, tokenizer_config.json and the
// post-processor's BOS, the NFC normalizer, the GGUF form synth writes, and every refusal (each
// error names the file and what it did not understand).
#include "text/hf_tokenizer_json.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

/// GPT-2's byte alphabet: the character of byte b (written independently of tokenizer_bpe.cc).
std::string ByteChar(int b) {
  int next = 256;
  for (int i = 0; i < 256; ++i) {
    const bool printable = (i >= 0x21 && i <= 0x7E) || (i >= 0xA1 && i <= 0xAC) || i >= 0xAE;
    const int cp = printable ? i : next++;
    if (i == b) {
      std::string s;
      unicode::AppendUtf8(static_cast<uint32_t>(cp), s);
      return s;
    }
  }
  return "";
}

class HfTokenizerJson : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("kvq_hf_json_{}_{}", ::getpid(),
                                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  /// Bytes 0..255 (id = byte), "ab" 256, "abc" 257, "Ġab" 258; merges a b, ab c, Ġ ab; added
  /// tokens "<|end|>" 259 (special) and "<x>" 260; GPT-2's ByteLevel pre-tokenizer.
  static json Base() {
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) vocab[ByteChar(b)] = b;
    vocab["ab"] = 256;
    vocab["abc"] = 257;
    vocab[ByteChar(' ') + "ab"] = 258;
    const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
    return {{"version", "1.0"},
            {"added_tokens",
             {{{"id", 259}, {"content", "<|end|>"}, {"special", true}},
              {{"id", 260}, {"content", "<x>"}, {"special", false}}}},
            {"normalizer", nullptr},
            {"pre_tokenizer", byte_level},
            {"post_processor", byte_level},
            {"decoder", byte_level},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", nullptr},
              {"byte_fallback", false},
              {"vocab", vocab},
              {"merges", {"a b", "ab c", ByteChar(' ') + " ab"}}}}};
  }

  std::string Write(const json& j, const std::string& name = "tokenizer.json") {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << j.dump();
    return path;
  }

  void ExpectRefused(const json& j, const std::vector<std::string>& whats) {
    const std::string path = Write(j);
    Result<BpeVocabulary> v = ReadHfTokenizerJson(path);
    ASSERT_FALSE(v.ok()) << j.dump().substr(0, 200);
    EXPECT_NE(v.status().message().find(path), std::string::npos) << v.status().message();
    for (const std::string& what : whats) {
      EXPECT_NE(v.status().message().find(what), std::string::npos) << v.status().message();
    }
  }

  fs::path dir_;
};

TEST_F(HfTokenizerJson, StringAndArrayMergesAreTheSame) {
  const std::string strings = Write(Base(), "strings.json");
  json arrays = Base();
  // (json::array: nlohmann would read a list of string pairs as an object)
  arrays["model"]["merges"] = json::array(
      {json::array({"a", "b"}), json::array({"ab", "c"}), json::array({ByteChar(' '), "ab"})});
  const std::string pairs = Write(arrays, "pairs.json");
  Result<BpeVocabulary> a = ReadHfTokenizerJson(strings);
  Result<BpeVocabulary> b = ReadHfTokenizerJson(pairs);
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(b.ok()) << b.status().message();
  ASSERT_TRUE(arrays["model"]["merges"][0].is_array());
  EXPECT_EQ(a->merges, b->merges);
  EXPECT_EQ(a->merges, (std::vector<std::string>{"a b", "ab c", ByteChar(' ') + " ab"}));
  EXPECT_EQ(a->pre, "gpt-2");
  Result<Tokenizer> t = Tokenizer::LoadHfTokenizerJson(pairs);
  ASSERT_TRUE(t.ok()) << t.status().message();
  // "abc" merges fully; " abd": Ġ+ab (rank 2) then d; the literals are cut out first.
  EXPECT_EQ(t->Encode("abc abd<x><|end|>", false), (std::vector<int32_t>{257, 258, 'd', 260, 259}));
  EXPECT_EQ(t->Detokenize(t->Encode("abc abd<x><|end|>", false)), "abc abd<x>");
  EXPECT_EQ(t->piece(258), " ab");  // decoded from the byte alphabet
}

TEST_F(HfTokenizerJson, AddedTokensTypesAndIdsNoTokenHas) {
  json j = Base();
  j["added_tokens"].push_back({{"id", 265}, {"content", "<|im_start|>"}, {"special", false}});
  Result<BpeVocabulary> v = ReadHfTokenizerJson(Write(j));
  ASSERT_TRUE(v.ok()) << v.status().message();
  ASSERT_EQ(v->tokens.size(), 266u);
  EXPECT_EQ(v->token_types[259], 3);  // special: CONTROL
  EXPECT_EQ(v->token_types[260], 4);  // not special: USER_DEFINED
  EXPECT_EQ(v->token_types[265], 3);  // not special but "<|...|>": CONTROL, as the converter decides
  EXPECT_EQ(v->token_types['a'], 1);
  for (int id = 261; id < 265; ++id) {
    EXPECT_EQ(v->tokens[id], fmt::format("[PAD{}]", id));
    EXPECT_EQ(v->token_types[id], 5);
  }
  EXPECT_FALSE(v->nfc);
  EXPECT_EQ(v->bos, -1);
  EXPECT_FALSE(v->add_bos.has_value());
}

TEST_F(HfTokenizerJson, ConfigAndPostProcessor) {
  json j = Base();
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {{{"SpecialToken", {{"id", "<|end|>"}, {"type_id", 0}}}},
                                     {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}};
  {
    Result<BpeVocabulary> v = ReadHfTokenizerJson(Write(j));
    ASSERT_TRUE(v.ok()) << v.status().message();
    EXPECT_EQ(v->bos, 259);
    EXPECT_EQ(v->add_bos, true);
  }
  Write({{"bos_token", {{"content", "<x>"}}},
         {"eos_token", "<|end|>"},
         {"pad_token", nullptr},
         {"add_bos_token", false},
         {"chat_template", {{{"name", "tool_use"}, {"template", "T"}}, {{"name", "default"}, {"template", "D"}}}}},
        "tokenizer_config.json");
  Result<BpeVocabulary> v = ReadHfTokenizerJson(Write(j));
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(v->bos, 260);
  EXPECT_EQ(v->eos, 259);
  EXPECT_EQ(v->pad, -1);
  EXPECT_EQ(v->add_bos, false);  // the config overrides the post-processor
  EXPECT_EQ(v->chat_template, "D");
  // A config naming a token the file lacks is refused, naming the config.
  const std::string config = Write({{"eos_token", "<|nope|>"}}, "tokenizer_config.json");
  Result<BpeVocabulary> bad = ReadHfTokenizerJson(Write(j));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(config), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("eos_token"), std::string::npos) << bad.status().message();
}

TEST_F(HfTokenizerJson, NfcNormalizerIsFollowed) {
  const std::string decomposed = "e\xCC\x81";  // e + U+0301
  const std::string composed = "\xC3\xA9";     // U+00E9
  for (const json& normalizer : {json({{"type", "NFC"}}),
                                 json({{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}}}}), json()}) {
    json j = Base();
    j["normalizer"] = normalizer;
    Result<Tokenizer> t = Tokenizer::LoadHfTokenizerJson(Write(j));
    ASSERT_TRUE(t.ok()) << t.status().message();
    const bool nfc = !normalizer.is_null();
    EXPECT_EQ(t->normalizes_nfc(), nfc);
    EXPECT_EQ(t->Encode(decomposed, false) == t->Encode(composed, false), nfc) << normalizer.dump();
    EXPECT_EQ(t->Detokenize(t->Encode(decomposed, false)), nfc ? composed : decomposed);
    // Literals are cut before normalising, and bytes that are not UTF-8 survive.
    EXPECT_EQ(t->Detokenize(t->Encode("<x>\xFF" + decomposed, false)), "<x>\xFF" + (nfc ? composed : decomposed));
  }
}

TEST_F(HfTokenizerJson, GgufFormRoundTrips) {
  json j = Base();
  j["normalizer"] = {{"type", "NFC"}};
  const std::string path = Write(j);
  Result<BpeVocabulary> read = ReadHfTokenizerJson(path);
  ASSERT_TRUE(read.ok()) << read.status().message();
  BpeVocabulary v = *read;
  v.chat_template = "{{ messages }}";
  v.eos = 259;
  GgufWriter w;
  ASSERT_TRUE(WriteBpeVocabularyGguf(v, 300, &w).ok());
  const std::string gguf = (dir_ / "vocab.gguf").string();
  ASSERT_TRUE(w.Write(gguf).ok());
  Result<std::unique_ptr<GgufFile>> f = GgufFile::Open(gguf);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(*(*f)->GetString("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*(*f)->GetString("tokenizer.ggml.pre"), "gpt-2");
  EXPECT_EQ(*(*f)->GetString("tokenizer.chat_template"), "{{ messages }}");
  EXPECT_EQ((*f)->GetStringArray("tokenizer.ggml.tokens")->size(), 300u);
  EXPECT_EQ((*(*f)->GetStringArray("tokenizer.ggml.tokens"))[299], "[PAD299]");
  Result<Tokenizer> from_gguf = Tokenizer::LoadGguf(**f);
  Result<Tokenizer> from_json = Tokenizer::LoadHfTokenizerJson(path);
  ASSERT_TRUE(from_gguf.ok()) << from_gguf.status().message();
  ASSERT_TRUE(from_json.ok());
  EXPECT_FALSE(from_gguf->normalizes_nfc());  // GGUF has no normaliser key; llama.cpp applies none
  EXPECT_EQ(from_gguf->eos(), 259);
  for (const std::string s : {"abc abd<x><|end|>", "hello world 123", "\xC3\xA9t\xC3\xA9"}) {
    EXPECT_EQ(from_gguf->Encode(s, false), from_json->Encode(s, false)) << s;
  }
  GgufWriter small;
  EXPECT_FALSE(WriteBpeVocabularyGguf(v, 100, &small).ok());  // fewer ids than tokens
}

TEST_F(HfTokenizerJson, WhatItDoesNotUnderstandIsRefused) {
  const auto with = [](const std::function<void(json&)>& edit) {
    json j = Base();
    edit(j);
    return j;
  };
  ExpectRefused(with([](json& j) { j["model"]["type"] = "Unigram"; }), {"model.type", "Unigram", "BPE"});
  ExpectRefused(with([](json& j) { j["model"]["byte_fallback"] = true; }), {"byte_fallback"});
  ExpectRefused(with([](json& j) { j["model"]["continuing_subword_prefix"] = "##"; }), {"continuing_subword_prefix"});
  ExpectRefused(with([](json& j) { j["model"]["dropout"] = 0.1; }), {"dropout"});
  ExpectRefused(with([](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }), {"normalizer", "Lowercase"});
  ExpectRefused(with([](json& j) {
                  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "NFKC"}}}}};
                }),
                {"normalizer", "NFKC"});
  ExpectRefused(with([](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; }), {"pre_tokenizer", "Metaspace"});
  ExpectRefused(with([](json& j) { j["pre_tokenizer"]["add_prefix_space"] = true; }), {"pre_tokenizer"});
  const json split_then_byte_level = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}{1,5}|\\s+"}}}, {"behavior", "Isolated"}, {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  ExpectRefused(with([&](json& j) { j["pre_tokenizer"] = split_then_byte_level; }), {"pre_tokenizer", "Split"});
  ExpectRefused(with([](json& j) { j["model"]["ignore_merges"] = true; }), {"ignore_merges", "gpt-2"});
  ExpectRefused(with([](json& j) { j["decoder"] = nullptr; }), {"decoder"});
  ExpectRefused(with([](json& j) { j["added_tokens"][0]["lstrip"] = true; }), {"<|end|>", "lstrip"});
  ExpectRefused(with([](json& j) { j["model"]["merges"][0] = "ab"; }), {"model.merges[0]"});
  ExpectRefused(with([](json& j) { j["model"]["merges"][1] = json::array({"a b", "c"}); }), {"model.merges[1]"});
  ExpectRefused(with([](json& j) { j["model"]["merges"][1] = 7; }), {"model.merges[1]"});
  ExpectRefused(with([](json& j) { j["model"]["vocab"]["zz"] = 5; }), {"id 5", "zz"});
  ExpectRefused(with([](json& j) { j["model"]["vocab"]["zz"] = "five"; }), {"zz"});
  ExpectRefused(with([](json& j) { j["added_tokens"][0]["id"] = -3; }), {"<|end|>", "-3"});
  ExpectRefused(with([](json& j) { j.erase("model"); }), {"model"});
  {
    const std::string path = (dir_ / "broken.json").string();
    std::ofstream(path) << "{\"model\": ";
    Result<Tokenizer> t = Tokenizer::LoadHfTokenizerJson(path);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find(path), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find("not valid JSON"), std::string::npos) << t.status().message();
  }
  Result<Tokenizer> missing = Tokenizer::LoadHfTokenizerJson((dir_ / "none.json").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("none.json"), std::string::npos);
}

}  // namespace
}  // namespace kvq
