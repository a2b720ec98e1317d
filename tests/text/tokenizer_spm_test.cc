// SentencePiece ("llama") GGUF vocabularies: every test input of llama.cpp's vocabulary tests
// encodes (without BOS) to the ids the models' original tokenizers give; arbitrary bytes
// (space runs, newlines, emoji, CJK, invalid UTF-8) round-trip through Encode and Detokenize;
// special ids come from the metadata; control, user-defined and unknown pieces written in the text
// become their tokens, as llama.cpp parses special tokens (known answers joined); the llama2.c and
// GGUF loaders of the same vocabulary agree; other tokenizer models and damaged vocabularies are
// refused with the file named.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "test_util/vocab_cases.h"
#include "text/tokenizer.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;
using test::kVocabDir;
using test::ReadFile;
using test::ReadInputs;
using test::ReadOutputs;
using Loaded = test::LoadedVocab;
constexpr auto Load = test::LoadVocab;

const std::string kStoriesDir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";

std::string Escaped(const std::string& s) {
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u == '\n') {
      out += "\\n";
    } else if (u == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

// Encodes every input of `<name>.inp` and compares with `<name>.out`; returns the passes.
void ExpectKnownAnswers(const std::string& name, size_t want_inputs) {
  const Loaded v = Load(kVocabDir + name);
  const std::vector<std::string> inputs = ReadInputs(kVocabDir + name + ".inp");
  const std::vector<std::vector<int32_t>> outputs = ReadOutputs(kVocabDir + name + ".out");
  ASSERT_EQ(inputs.size(), want_inputs);
  ASSERT_EQ(outputs.size(), inputs.size());
  size_t passed = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::vector<int32_t> got = v.tok.Encode(inputs[i], /*add_bos=*/false);
    if (got == outputs[i]) {
      ++passed;
    } else {
      ADD_FAILURE() << name << " input " << i << " \"" << Escaped(inputs[i]) << "\": got "
                    << testing::PrintToString(got) << ", want " << testing::PrintToString(outputs[i]);
    }
    // The known inputs round-trip too.
    EXPECT_EQ(v.tok.Detokenize(got), inputs[i]) << name << " input " << i;
  }
  std::printf("%s: %zu of %zu inputs encode to the expected ids\n", name.c_str(), passed, inputs.size());
  EXPECT_EQ(passed, inputs.size());
}

TEST(TokenizerSpm, LlamaSpmKnownAnswers) { ExpectKnownAnswers("ggml-vocab-llama-spm.gguf", 46); }
TEST(TokenizerSpm, Phi3KnownAnswers) { ExpectKnownAnswers("ggml-vocab-phi-3.gguf", 46); }

TEST(TokenizerSpm, SpecialIdsAndFlagsFromMetadata) {
  const Loaded llama = Load(kVocabDir + "ggml-vocab-llama-spm.gguf");
  EXPECT_EQ(llama.tok.vocab_size(), 32000);
  EXPECT_EQ(llama.tok.bos(), 1);
  EXPECT_EQ(llama.tok.eos(), 2);
  EXPECT_EQ(llama.tok.unk(), 0);
  EXPECT_TRUE(llama.tok.add_bos());
  EXPECT_TRUE(llama.tok.add_space_prefix());  // not in the file: llama.cpp's SPM default
  EXPECT_EQ(llama.tok.type(1), Tokenizer::TokenType::kControl);
  EXPECT_EQ(llama.tok.type(3), Tokenizer::TokenType::kByte);
  EXPECT_EQ(llama.tok.piece(29871), " ");  // "▁" is kept as a plain space

  const Loaded phi = Load(kVocabDir + "ggml-vocab-phi-3.gguf");
  EXPECT_EQ(phi.tok.vocab_size(), 32064);
  EXPECT_EQ(phi.tok.bos(), 1);
  EXPECT_EQ(phi.tok.eos(), 32000);  // <|endoftext|>
  EXPECT_EQ(phi.tok.piece(phi.tok.eos()), "<|endoftext|>");

  for (const Tokenizer* t : {&llama.tok, &phi.tok}) {
    const std::vector<int32_t> ids = t->Encode("Hello world", true);
    ASSERT_GE(ids.size(), 2u);
    EXPECT_EQ(ids[0], t->bos());
    EXPECT_EQ(std::vector<int32_t>(ids.begin() + 1, ids.end()), t->Encode("Hello world", false));
    EXPECT_EQ(t->Encode("", true), std::vector<int32_t>{t->bos()});
    EXPECT_TRUE(t->Encode("", false).empty());
    // Control tokens print nothing; the space Encode added after BOS is dropped.
    EXPECT_EQ(t->Decode(ids[1], t->eos()), "");
    EXPECT_EQ(t->Decode(ids[1], t->bos()), "");
    EXPECT_EQ(t->Decode(t->bos(), ids[1]), "Hello");
    EXPECT_EQ(t->Decode(ids[0] + 100, ids[1]), " Hello");
  }
  // llama.cpp's own example: "Hello world" is 15043 3186 after BOS 1.
  EXPECT_EQ(llama.tok.Encode("Hello world", true), (std::vector<int32_t>{1, 15043, 3186}));
}

std::vector<std::string> RoundTripTexts() {
  std::vector<std::string> texts = {
      "Hello world",
      " leading space",
      "trailing spaces   ",
      "  two   three    four     five      spaces",
      "\n",
      "\n\n\nthree newlines\r\nand CRLF\n",
      "\ttab\t\t",
      "emoji 🦙🙂👍🏽 and ZWJ 👨‍👩‍👧",
      "日本語のテキスト 中文 한국어",
      "naïve café — “quotes” ½",
      "▁ literal U+2581 ▁▁ and <s> </s> <unk> <0x41> text",
      "<|endoftext|><|user|> control-looking text",
      std::string("nul \0 byte", 10),
      "\xff\xfe invalid \x80 bytes \xc3",
      "\xe0" "ab truncated three-byte lead",
      "four-byte lead at the end \xf0\x9f",
      "\xed\xa0\x80 surrogate, \xc0\xaf overlong",
      "",
      " ",
      "   ",
  };
  // Random bytes, biased to spaces and UTF-8 lead/continuation bytes.
  std::mt19937 rng(1234);
  const std::string alphabet = std::string(" \n\tabcXYZ.,!?0123456789") + "\x80\xbf\xc3\xa9\xe2\x96\x81\xf0\x9f\xff";
  for (int i = 0; i < 200; ++i) {
    std::string s;
    const int n = static_cast<int>(rng() % 40);
    for (int k = 0; k < n; ++k) {
      s.push_back(rng() % 4 == 0 ? static_cast<char>(rng() % 256) : alphabet[rng() % alphabet.size()]);
    }
    texts.push_back(s);
  }
  return texts;
}

TEST(TokenizerSpm, ArbitraryBytesRoundTrip) {
  for (const char* name : {"ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf"}) {
    const Loaded v = Load(kVocabDir + name);
    for (const std::string& s : RoundTripTexts()) {
      // A text holding a literal piece ("<s>", "</s>", "<unk>") has it cut out, with a space prefix
      // after it, as llama.cpp does, so that text does not round-trip (ControlPiecesInText).
      const auto holds = [&](int32_t id) { return s.find(v.tok.piece(id)) != std::string::npos; };
      const std::span<const int32_t> literals = v.tok.literal_tokens();
      if (std::any_of(literals.begin(), literals.end(), holds)) continue;
      for (const bool bos : {false, true}) {
        const std::vector<int32_t> ids = v.tok.Encode(s, bos);
        EXPECT_EQ(v.tok.Detokenize(ids), s) << name << " \"" << Escaped(s) << "\" bos " << bos;
        std::string streamed;
        for (size_t i = 1; i < ids.size(); ++i) streamed += v.tok.Decode(ids[i - 1], ids[i]);
        if (bos) {
          EXPECT_EQ(streamed, s) << name << " \"" << Escaped(s) << "\" streamed";
        }
        for (size_t i = bos ? 1 : 0; i < ids.size(); ++i) {
          const int32_t id = ids[i];
          ASSERT_GE(id, 0);
          ASSERT_LT(id, v.tok.vocab_size());
          EXPECT_NE(v.tok.type(id), Tokenizer::TokenType::kControl) << name << " \"" << Escaped(s) << "\"";
          EXPECT_NE(v.tok.type(id), Tokenizer::TokenType::kUnknown) << name << " \"" << Escaped(s) << "\"";
        }
      }
    }
  }
}

TEST(TokenizerSpm, ByteFallbackAndInvalidUtf8) {
  const Loaded v = Load(kVocabDir + "ggml-vocab-llama-spm.gguf");
  const auto byte_id = [&](uint8_t b) { return static_cast<int32_t>(3 + b); };  // <0x00> is id 3
  // A stray continuation byte is a character of its own; a lead byte takes the bytes it announces
  // whatever they are (llama.cpp's split), and a symbol that is no piece becomes byte pieces.
  EXPECT_EQ(v.tok.Encode("\x80", false), (std::vector<int32_t>{29871, byte_id(0x80)}));
  EXPECT_EQ(v.tok.Encode("\xe0" "ab", false),
            (std::vector<int32_t>{29871, byte_id(0xe0), byte_id('a'), byte_id('b')}));
  EXPECT_EQ(v.tok.Encode("a\xf0\x9f", false).back(), byte_id(0x9f));
  // Text that looks like a byte piece is text.
  const std::vector<int32_t> ids = v.tok.Encode("<0x41>", false);
  for (const int32_t id : ids) EXPECT_EQ(v.tok.type(id), Tokenizer::TokenType::kNormal) << id;
  // Decode of each piece kind.
  EXPECT_EQ(v.tok.Decode(0, byte_id(0xff)), "\xff");
  EXPECT_EQ(v.tok.Decode(1, byte_id(' ')), " ");  // a byte piece keeps its space after BOS
  EXPECT_EQ(v.tok.Decode(5, 0), "");              // <unk>
  EXPECT_EQ(v.tok.Decode(5, 29871), " ");
}

TEST(TokenizerSpm, UserDefinedPiecesAreCutOutFirst) {
  const Loaded phi = Load(kVocabDir + "ggml-vocab-phi-3.gguf");
  ASSERT_EQ(phi.tok.type(2), Tokenizer::TokenType::kUserDefined);  // "</s>" in phi-3
  // As llama.cpp: the text after a user-defined piece starts with a space prefix again.
  std::vector<int32_t> want = phi.tok.Encode("a", false);
  want.push_back(2);
  for (const int32_t id : phi.tok.Encode("b", false)) want.push_back(id);
  EXPECT_EQ(phi.tok.Encode("a</s>b", false), want);
  EXPECT_EQ(phi.tok.Encode("</s>", false), std::vector<int32_t>{2});
  EXPECT_EQ(phi.tok.Decode(5, 2), "</s>");
}

// Control and unknown pieces written in the text become their tokens, as llama.cpp's
// tokenizer_st_partition cuts them out with special tokens parsed (what a rendered chat template
// such as "<s>[INST] ..." needs), and each stretch after one starts with the space prefix again.
// So the ids of known inputs joined by "<s>", "</s>" and "<unk>" are the known ids of each input
// joined by 1, 2 and 0: answers from the .out file, not written here.
TEST(TokenizerSpm, ControlPiecesInText) {
  const std::string name = "ggml-vocab-llama-spm.gguf";
  const Loaded v = Load(kVocabDir + name);
  const std::vector<std::string> in = ReadInputs(kVocabDir + name + ".inp");
  const std::vector<std::vector<int32_t>> out = ReadOutputs(kVocabDir + name + ".out");
  ASSERT_EQ(in.size(), 46u);
  ASSERT_EQ(in[23], "Hello");
  ASSERT_EQ(v.tok.type(0), Tokenizer::TokenType::kUnknown);
  ASSERT_EQ(v.tok.type(1), Tokenizer::TokenType::kControl);
  ASSERT_EQ(v.tok.type(2), Tokenizer::TokenType::kControl);
  const std::vector<std::pair<std::string, int32_t>> literals = {
      {"<s>", 1}, {"</s>", 2}, {"<unk>", 0}};
  // Inputs with a space, newline, tab, emoji, Cyrillic and digits at their edges.
  const std::vector<size_t> parts = {23, 12, 7, 28, 20, 0, 44, 3, 18, 36, 10, 33};
  for (size_t k = 0; k + 1 < parts.size(); ++k) {
    const auto& [literal, id] = literals[k % literals.size()];
    const size_t a = parts[k], b = parts[k + 1];
    std::vector<int32_t> want = out[a];
    want.push_back(id);
    want.insert(want.end(), out[b].begin(), out[b].end());
    EXPECT_EQ(v.tok.Encode(in[a] + literal + in[b], false), want)
        << "\"" << Escaped(in[a] + literal + in[b]) << "\"";
    // At the ends and doubled: nothing between two literals, the prefix after the last.
    std::vector<int32_t> doubled = {id, id};
    doubled.insert(doubled.end(), out[b].begin(), out[b].end());
    EXPECT_EQ(v.tok.Encode(literal + literal + in[b], false), doubled) << literal << " " << b;
  }
  // BOS added and "<s>" written: two BOS, as llama.cpp gives (Model::TokenizeChatPrompt avoids it).
  EXPECT_EQ(v.tok.Encode("<s>", true), (std::vector<int32_t>{1, 1}));
  // Decoding drops control and unknown tokens, as before.
  EXPECT_EQ(v.tok.Detokenize(v.tok.Encode("Hello</s>", false)), "Hello");
  // The literal set is the one rule for every vocabulary: these three, longest first.
  EXPECT_EQ(std::vector<int32_t>(v.tok.literal_tokens().begin(), v.tok.literal_tokens().end()),
            (std::vector<int32_t>{0, 2, 1}));
}

TEST(TokenizerSpm, LongTextIsFast) {
  const Loaded v = Load(kVocabDir + "ggml-vocab-llama-spm.gguf");
  std::string text;
  while (text.size() < 1'000'000) text += "The quick brown fox jumps over the lazy dog; 日本語 🦙 ";
  const std::vector<int32_t> ids = v.tok.Encode(text, false);
  EXPECT_GT(ids.size(), 100'000u);
  EXPECT_EQ(v.tok.Detokenize(ids), text);
  const std::string spaces(100'000, ' ');  // one long run of equal-score merges
  EXPECT_EQ(v.tok.Detokenize(v.tok.Encode(spaces, false)), spaces);
}

// stories260K.gguf holds the same 512-piece vocabulary as tok512.bin: both loaders agree.
TEST(TokenizerSpm, Llama2cAndGgufLoadersAgree) {
  Result<Tokenizer> bin = Tokenizer::LoadLlama2c(kStoriesDir + "tok512.bin", 512);
  ASSERT_TRUE(bin.ok()) << bin.status().message();
  const Loaded gguf = Load(kStoriesDir + "stories260K.gguf");
  ASSERT_EQ(gguf.tok.vocab_size(), 512);
  EXPECT_EQ(bin->bos(), gguf.tok.bos());
  EXPECT_EQ(bin->eos(), gguf.tok.eos());
  for (int32_t id = 3; id < 512; ++id) EXPECT_EQ(bin->piece(id), gguf.tok.piece(id)) << id;
  // The control texts differ ("\n<s>\n" in tok512.bin, "<s>" in the GGUF) and are cut out of text,
  // so texts holding either file's are left out.
  const auto holds_literal = [](const Tokenizer& t, const std::string& s) {
    const std::span<const int32_t> literals = t.literal_tokens();
    return std::any_of(literals.begin(), literals.end(),
                       [&](int32_t id) { return s.find(t.piece(id)) != std::string::npos; });
  };
  for (const std::string& s : RoundTripTexts()) {
    if (holds_literal(*bin, s) || holds_literal(gguf.tok, s)) continue;
    const std::vector<int32_t> ids = bin->Encode(s, true);
    EXPECT_EQ(ids, gguf.tok.Encode(s, true)) << "\"" << Escaped(s) << "\"";
    EXPECT_EQ(bin->Detokenize(ids), s);
    EXPECT_EQ(gguf.tok.Detokenize(ids), s);
  }
}

class TokenizerGgufErrors : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kvq-tokenizer-spm-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A 262-token "llama" vocabulary (<unk>, <s>, </s>, 256 byte pieces, "▁a", "b", "▁ab").
  static GgufWriter Vocab(const std::string& model) {
    GgufWriter w;
    std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
    std::vector<int32_t> types = {2, 3, 3};
    for (int b = 0; b < 256; ++b) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "<0x%02X>", b);
      tokens.push_back(buf);
      types.push_back(6);
    }
    for (const char* t : {"\xE2\x96\x81" "a", "b", "\xE2\x96\x81" "ab"}) {
      tokens.push_back(t);
      types.push_back(1);
    }
    std::vector<float> scores(tokens.size(), 0.0f);
    scores[259] = -1;
    scores[260] = -2;
    scores[261] = -3;
    EXPECT_TRUE(w.SetString("tokenizer.ggml.model", model).ok());
    EXPECT_TRUE(w.SetStringArray("tokenizer.ggml.tokens", tokens).ok());
    EXPECT_TRUE(w.SetF32Array("tokenizer.ggml.scores", scores).ok());
    EXPECT_TRUE(w.SetI32Array("tokenizer.ggml.token_type", types).ok());
    return w;
  }

  // Writes `w` and loads it: the file and the tokenizer result.
  std::pair<std::string, Result<Tokenizer>> WriteAndLoad(const GgufWriter& w, const std::string& name) {
    const std::string path = (dir_ / name).string();
    EXPECT_TRUE(w.Write(path).ok());
    Result<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
    EXPECT_TRUE(f.ok()) << f.status().message();
    if (!f.ok()) return {path, f.status()};
    return {path, Tokenizer::LoadGguf(**f)};
  }

  void ExpectRefused(const GgufWriter& w, const std::string& name, const std::string& what) {
    auto [path, t] = WriteAndLoad(w, name);
    ASSERT_FALSE(t.ok()) << name;
    EXPECT_NE(t.status().message().find(path), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find(what), std::string::npos) << t.status().message();
  }

  fs::path dir_;
};

TEST_F(TokenizerGgufErrors, SmallVocabularyWorksWithDefaults) {
  auto [path, t] = WriteAndLoad(Vocab("llama"), "ok.gguf");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->bos(), 1);  // llama.cpp's SPM defaults when the ids are not in the file
  EXPECT_EQ(t->eos(), 2);
  EXPECT_EQ(t->unk(), 0);
  EXPECT_EQ(t->Encode("ab", true), (std::vector<int32_t>{1, 261}));
  EXPECT_EQ(t->Encode("abc", false), (std::vector<int32_t>{261, 3 + 'c'}));
}

TEST_F(TokenizerGgufErrors, FlagsAndIdsAreRead) {
  GgufWriter w = Vocab("llama");
  ASSERT_TRUE(w.SetBool("tokenizer.ggml.add_space_prefix", false).ok());
  ASSERT_TRUE(w.SetBool("tokenizer.ggml.add_bos_token", false).ok());
  ASSERT_TRUE(w.SetU32("tokenizer.ggml.bos_token_id", 2).ok());
  ASSERT_TRUE(w.SetU32("tokenizer.ggml.eos_token_id", 1).ok());
  auto [path, t] = WriteAndLoad(w, "flags.gguf");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_FALSE(t->add_bos());
  EXPECT_FALSE(t->add_space_prefix());
  EXPECT_EQ(t->bos(), 2);
  EXPECT_EQ(t->eos(), 1);
  EXPECT_EQ(t->Encode("ab", false), (std::vector<int32_t>{3 + 'a', 260}));  // no "▁" in front
  EXPECT_EQ(t->Detokenize(t->Encode(" ab", true)), " ab");
}

TEST_F(TokenizerGgufErrors, OtherTokenizerModelsAreRefused) {
  ExpectRefused(Vocab("bert"), "bert.gguf", "\"bert\"");
  ExpectRefused(Vocab("t5"), "t5.gguf", "\"t5\"");
  // "gpt2" is byte-level BPE (tokenizer_bpe_test.cc): this vocabulary has no merges for it.
  ExpectRefused(Vocab("gpt2"), "gpt2.gguf", "tokenizer.ggml.merges");
}

TEST_F(TokenizerGgufErrors, DamagedVocabulariesAreRefused) {
  {
    GgufWriter w;
    ASSERT_TRUE(w.SetString("general.architecture", "llama").ok());
    ExpectRefused(w, "none.gguf", "tokenizer.ggml.model");
  }
  {
    GgufWriter w;
    ASSERT_TRUE(w.SetString("tokenizer.ggml.model", "llama").ok());
    ExpectRefused(w, "notokens.gguf", "tokenizer.ggml.tokens");
  }
  {
    GgufWriter w;
    ASSERT_TRUE(w.SetString("tokenizer.ggml.model", "llama").ok());
    ASSERT_TRUE(w.SetStringArray("tokenizer.ggml.tokens", {"a", "b"}).ok());
    ASSERT_TRUE(w.SetF32Array("tokenizer.ggml.scores", {0.0f}).ok());
    ExpectRefused(w, "scores.gguf", "tokenizer.ggml.scores");
  }
  {
    GgufWriter w;
    ASSERT_TRUE(w.SetString("tokenizer.ggml.model", "llama").ok());
    ASSERT_TRUE(w.SetStringArray("tokenizer.ggml.tokens", {"a", "b"}).ok());
    ASSERT_TRUE(w.SetI32Array("tokenizer.ggml.token_type", {1, 9}).ok());
    ExpectRefused(w, "types.gguf", "type 9");
  }
  {
    GgufWriter w;
    ASSERT_TRUE(w.SetString("tokenizer.ggml.model", "llama").ok());
    ASSERT_TRUE(w.SetStringArray("tokenizer.ggml.tokens", {"a", "<0xZZ>"}).ok());
    ASSERT_TRUE(w.SetI32Array("tokenizer.ggml.token_type", {1, 6}).ok());
    ExpectRefused(w, "byte.gguf", "<0xZZ>");
  }
  {
    GgufWriter w = Vocab("llama");
    ASSERT_TRUE(w.SetU32("tokenizer.ggml.eos_token_id", 5000).ok());
    ExpectRefused(w, "eos.gguf", "tokenizer.ggml.eos_token_id");
  }
  {
    GgufWriter w = Vocab("llama");
    ASSERT_TRUE(w.SetString("tokenizer.ggml.add_bos_token", "yes").ok());
    ExpectRefused(w, "flag.gguf", "tokenizer.ggml.add_bos_token");
  }
}

}  // namespace
}  // namespace kvq
