// Byte-level BPE ("gpt2") GGUF vocabularies: every test input of llama.cpp's vocabulary tests
// encodes (without BOS) to the ids the models' original tokenizers give (GPT-2, Falcon,
// StarCoder); random UTF-8 and invalid bytes round-trip through Encode and Detokenize for each
// vocabulary and for every supported pre-tokenizer run over the GPT-2 vocabulary; merge order,
// ignore_merges, literal special tokens, defaults and flags follow llama.cpp; damaged or
// unsupported vocabularies are refused with the file and the value named.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "text/pre_tokenizer.h"
#include "text/tokenizer.h"
#include "text/unicode.h"
#include "test_util/vocab_cases.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;
using test::kVocabDir;
using test::ReadFile;
using test::ReadInputs;
using test::ReadOutputs;
using Loaded = test::LoadedVocab;
constexpr auto Load = test::LoadVocab;

const std::string kGpt2 = kVocabDir + "ggml-vocab-gpt-2.gguf";

std::string Escaped(const std::string& s) {
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

void ExpectKnownAnswers(const std::string& name) {
  const Loaded v = Load(kVocabDir + name);
  const std::vector<std::string> inputs = ReadInputs(kVocabDir + name + ".inp");
  const std::vector<std::vector<int32_t>> outputs = ReadOutputs(kVocabDir + name + ".out");
  ASSERT_EQ(inputs.size(), 46u);
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
    EXPECT_EQ(v.tok.Detokenize(got), inputs[i]) << name << " input " << i;
  }
  std::printf("%s: %zu of %zu inputs encode to the expected ids\n", name.c_str(), passed, inputs.size());
  EXPECT_EQ(passed, inputs.size());
}

TEST(TokenizerBpe, Gpt2KnownAnswers) { ExpectKnownAnswers("ggml-vocab-gpt-2.gguf"); }
TEST(TokenizerBpe, FalconKnownAnswers) { ExpectKnownAnswers("ggml-vocab-falcon.gguf"); }
TEST(TokenizerBpe, StarcoderKnownAnswers) { ExpectKnownAnswers("ggml-vocab-starcoder.gguf"); }

TEST(TokenizerBpe, MetadataSpecialTokensAndDecode) {
  const Loaded gpt2 = Load(kGpt2);
  EXPECT_EQ(gpt2.tok.kind(), Tokenizer::Kind::kBytePairs);
  EXPECT_EQ(gpt2.tok.pre_tokenizer(), PreTokenizer::kGpt2);
  EXPECT_EQ(gpt2.tok.vocab_size(), 50257);
  EXPECT_EQ(gpt2.tok.bos(), 50256);
  EXPECT_EQ(gpt2.tok.eos(), 50256);
  EXPECT_EQ(gpt2.tok.unk(), -1);  // not in the file: llama.cpp's BPE has none by default
  EXPECT_FALSE(gpt2.tok.add_bos());
  EXPECT_FALSE(gpt2.tok.add_space_prefix());
  EXPECT_EQ(gpt2.tok.type(50256), Tokenizer::TokenType::kControl);
  EXPECT_EQ(gpt2.tok.piece(50256), "<|endoftext|>");
  // Pieces are decoded from the byte alphabet: "Ġ" (U+0120) is a space, "Ċ" (U+010A) a newline.
  EXPECT_EQ(gpt2.tok.piece(220), " ");
  EXPECT_EQ(gpt2.tok.piece(198), "\n");
  EXPECT_EQ(gpt2.tok.piece(18435), " Hello");
  EXPECT_EQ(gpt2.tok.piece(0), "!");
  // From the .out file: "Hello world" is 15496 995; BOS only when asked for.
  EXPECT_EQ(gpt2.tok.Encode("Hello world", false), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(gpt2.tok.Encode("Hello world", true), (std::vector<int32_t>{50256, 15496, 995}));
  EXPECT_EQ(gpt2.tok.Encode("", true), std::vector<int32_t>{50256});
  EXPECT_TRUE(gpt2.tok.Encode("", false).empty());
  // Control tokens in the text are matched literally and decode to "".
  EXPECT_EQ(gpt2.tok.Encode("Hello<|endoftext|> world", false), (std::vector<int32_t>{15496, 50256, 995}));
  EXPECT_EQ(gpt2.tok.Decode(15496, 50256), "");
  EXPECT_EQ(gpt2.tok.Decode(50256, 995), " world");  // no space is dropped after BOS in BPE
  EXPECT_EQ(gpt2.tok.Detokenize(std::vector<int32_t>{50256, 15496, 995, 50256}), "Hello world");
  // A token may be part of a UTF-8 character: "🦙" is 8582 99 247 after a space ... bytes each.
  std::string llama;
  for (const int32_t id : gpt2.tok.Encode(" \xF0\x9F\xA6\x99", false)) llama += gpt2.tok.Decode(0, id);
  EXPECT_EQ(llama, " \xF0\x9F\xA6\x99");
  EXPECT_TRUE(gpt2.tok.IsEndOfGeneration(50256));
  EXPECT_FALSE(gpt2.tok.IsEndOfGeneration(15496));

  const Loaded falcon = Load(kVocabDir + "ggml-vocab-falcon.gguf");
  EXPECT_EQ(falcon.tok.pre_tokenizer(), PreTokenizer::kFalcon);
  EXPECT_EQ(falcon.tok.eos(), 11);
  EXPECT_EQ(falcon.tok.piece(11), "<|endoftext|>");
  EXPECT_TRUE(falcon.tok.IsEndOfGeneration(11));
  EXPECT_FALSE(falcon.tok.IsEndOfGeneration(0));  // ">>TITLE<<" is control but no end of turn
  // Falcon's control tokens are literals too.
  EXPECT_EQ(falcon.tok.Encode(">>TITLE<<", false), std::vector<int32_t>{0});

  const Loaded starcoder = Load(kVocabDir + "ggml-vocab-starcoder.gguf");
  EXPECT_EQ(starcoder.tok.pre_tokenizer(), PreTokenizer::kStarcoder);
  EXPECT_EQ(starcoder.tok.bos(), 0);
  EXPECT_EQ(starcoder.tok.unk(), 0);
  EXPECT_EQ(starcoder.tok.Encode("<fim_prefix>x<fim_suffix>", false).front(), 1);
  EXPECT_EQ(starcoder.tok.Encode("<fim_prefix>x<fim_suffix>", false).back(), 3);
}

// IsEndOfGeneration works for both kinds: EOS plus the control tokens with an end-of-turn text.
TEST(TokenizerBpe, EndOfGenerationForBothKinds) {
  const Loaded phi = Load(kVocabDir + "ggml-vocab-phi-3.gguf");  // SentencePiece
  EXPECT_EQ(phi.tok.kind(), Tokenizer::Kind::kSentencePiece);
  EXPECT_TRUE(phi.tok.IsEndOfGeneration(32000));   // <|endoftext|>, the EOS
  EXPECT_TRUE(phi.tok.IsEndOfGeneration(32007));   // <|end|> (control)
  EXPECT_FALSE(phi.tok.IsEndOfGeneration(32010));  // <|user|>
  EXPECT_FALSE(phi.tok.IsEndOfGeneration(2));      // </s> is user-defined in phi-3, not control
  EXPECT_FALSE(phi.tok.IsEndOfGeneration(1));      // BOS
  const Loaded starcoder = Load(kVocabDir + "ggml-vocab-starcoder.gguf");
  EXPECT_TRUE(starcoder.tok.IsEndOfGeneration(0));  // <|endoftext|>
  for (int32_t id = 1; id < 38; ++id) EXPECT_FALSE(starcoder.tok.IsEndOfGeneration(id)) << id;
  EXPECT_FALSE(starcoder.tok.IsEndOfGeneration(-1));
}

// Random UTF-8: code points from many scripts (1- to 4-byte), whitespace runs of every kind,
// digits, contractions and punctuation runs.
std::vector<std::string> RandomTexts(uint32_t seed, int count) {
  struct Span {
    uint32_t first, last;
  };
  static constexpr Span kSpans[] = {
      {'a', 'z'},         {'A', 'Z'},         {'0', '9'},         {'!', '/'},         {':', '@'},
      {0x00C0, 0x00FF},   {0x0391, 0x03C9},   {0x0410, 0x044F},   {0x05D0, 0x05EA},   {0x0627, 0x064A},
      {0x0660, 0x0669},   {0x0900, 0x097F},   {0x0E01, 0x0E3A},   {0x1780, 0x17DD},   {0x3041, 0x3096},
      {0x4E00, 0x9FA5},   {0xAC00, 0xD7A3},   {0xFF01, 0xFF5E},   {0x2000, 0x206F},   {0x0300, 0x036F},
      {0x1F600, 0x1F64F}, {0x1F300, 0x1F5FF}, {0x20000, 0x2A6DF}, {0x1D400, 0x1D7FF}, {0x10400, 0x1044F},
  };
  static constexpr uint32_t kSpaces[] = {' ', ' ', ' ', '\t', '\n', '\r', 0x0B, 0x0C, 0x85, 0xA0, 0x3000, 0x2028};
  static const char* const kPieces[] = {"'s", "'T", "'re", "'LL", "n't", "...", "!!", "12345", "3.14", "``"};
  std::mt19937 rng(seed);
  std::vector<std::string> texts;
  for (int t = 0; t < count; ++t) {
    std::string s;
    const int n = static_cast<int>(rng() % 48);
    for (int k = 0; k < n; ++k) {
      const uint32_t pick = rng() % 10;
      if (pick < 5) {
        const Span& span = kSpans[rng() % std::size(kSpans)];
        unicode::AppendUtf8(span.first + rng() % (span.last - span.first + 1), s);
      } else if (pick < 8) {
        const int run = 1 + static_cast<int>(rng() % 4);
        for (int r = 0; r < run; ++r) unicode::AppendUtf8(kSpaces[rng() % std::size(kSpaces)], s);
      } else {
        s += kPieces[rng() % std::size(kPieces)];
      }
    }
    texts.push_back(s);
  }
  return texts;
}

// Invalid UTF-8: stray continuation bytes, truncated sequences, overlong forms, surrogates,
// bytes that never start a character, code points past U+10FFFF, NUL.
std::vector<std::string> InvalidTexts() {
  std::vector<std::string> texts = {
      "\xff\xfe invalid \x80 bytes \xc3",
      "\xe0" "ab truncated three-byte lead",
      "four-byte lead at the end \xf0\x9f",
      "\xed\xa0\x80 surrogate, \xc0\xaf overlong",
      "\xf4\x90\x80\x80 past U+10FFFF, \xf8\x88\x80\x80\x80 five bytes",
      std::string("nul \0 byte\0", 11),
      "\x80\x80\x80   \xbf\xbf 12\xff" "34 don\xe2\x80t",
  };
  std::mt19937 rng(99);
  for (int i = 0; i < 100; ++i) {
    std::string s;
    const int n = static_cast<int>(rng() % 32);
    for (int k = 0; k < n; ++k) s.push_back(static_cast<char>(rng() % 256));
    texts.push_back(s);
  }
  return texts;
}

// GPT-2's byte alphabet (tokenizer_bpe.cc): printable bytes stand for themselves, the others are
// U+0100, U+0101, ... in byte order.
std::array<std::string, 256> ByteAlphabet() {
  std::array<std::string, 256> utf8;
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    unicode::AppendUtf8(printable ? b : next++, utf8[b]);
  }
  return utf8;
}

// The bytes a vocabulary file has no token for (read from its token list, not the tokenizer).
std::array<bool, 256> MissingBytes(const GgufFile& file) {
  Result<std::span<const std::string_view>> tokens = file.GetStringArray("tokenizer.ggml.tokens");
  EXPECT_TRUE(tokens.ok());
  const std::set<std::string_view> have(tokens->begin(), tokens->end());
  const std::array<std::string, 256> alphabet = ByteAlphabet();
  std::array<bool, 256> missing{};
  for (int b = 0; b < 256; ++b) missing[b] = have.count(alphabet[b]) == 0;
  return missing;
}

// Detokenize(Encode(s)) is s without the bytes the vocabulary lacks (they are dropped, as
// llama.cpp drops them); whole and streamed token by token; no control token comes out of text.
void ExpectRoundTrips(const Tokenizer& tok, const std::array<bool, 256>& missing, const std::string& what) {
  std::vector<std::string> texts = RandomTexts(7, 300);
  for (std::string& s : InvalidTexts()) texts.push_back(std::move(s));
  for (const std::string& s : texts) {
    std::string want;
    for (const char c : s) {
      if (!missing[static_cast<uint8_t>(c)]) want.push_back(c);
    }
    const std::vector<int32_t> ids = tok.Encode(s, /*add_bos=*/true);
    EXPECT_EQ(tok.Detokenize(ids), want) << what << " \"" << Escaped(s) << "\"";
    std::string streamed;
    for (size_t i = 1; i < ids.size(); ++i) streamed += tok.Decode(ids[i - 1], ids[i]);
    EXPECT_EQ(streamed, want) << what << " streamed \"" << Escaped(s) << "\"";
    for (size_t i = 1; i < ids.size(); ++i) {
      ASSERT_GE(ids[i], 0);
      ASSERT_LT(ids[i], tok.vocab_size());
      EXPECT_NE(tok.type(ids[i]), Tokenizer::TokenType::kControl) << what << " \"" << Escaped(s) << "\"";
    }
  }
}

TEST(TokenizerBpe, RandomUtf8AndInvalidBytesRoundTrip) {
  const std::array<size_t, 3> want_missing = {0, 28, 14};  // counted with a script from the files
  size_t i = 0;
  for (const char* name : {"ggml-vocab-gpt-2.gguf", "ggml-vocab-falcon.gguf", "ggml-vocab-starcoder.gguf"}) {
    const Loaded v = Load(kVocabDir + name);
    const std::array<bool, 256> missing = MissingBytes(*v.file);
    EXPECT_EQ(static_cast<size_t>(std::count(missing.begin(), missing.end(), true)), want_missing[i++]) << name;
    ExpectRoundTrips(v.tok, missing, name);
  }
  // Falcon has no token for 0x0B (vertical tab): it is dropped, as in llama.cpp.
  const Loaded falcon = Load(kVocabDir + "ggml-vocab-falcon.gguf");
  EXPECT_EQ(falcon.tok.Detokenize(falcon.tok.Encode("a\vb", false)), "ab");
}

// GGUF files written by the tests: the GPT-2 vocabulary under another pre-tokenizer, small
// hand-made vocabularies, damaged ones.
class TokenizerBpeFiles : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kvq-tokenizer-bpe-" + std::to_string(::getpid()) + "-" +
                                        testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The GPT-2 vocabulary (tokens, types, merges, BOS/EOS) with tokenizer.ggml.pre = `pre`
  // ("" leaves the key out).
  static GgufWriter Gpt2With(const std::string& pre) {
    const Loaded src = Load(kGpt2);
    GgufWriter w;
    const auto strings = [&](const char* key) {
      Result<std::span<const std::string_view>> a = src.file->GetStringArray(key);
      EXPECT_TRUE(a.ok());
      return std::vector<std::string>(a->begin(), a->end());
    };
    EXPECT_TRUE(w.SetString("tokenizer.ggml.model", "gpt2").ok());
    if (!pre.empty()) {
      EXPECT_TRUE(w.SetString("tokenizer.ggml.pre", pre).ok());
    }
    EXPECT_TRUE(w.SetStringArray("tokenizer.ggml.tokens", strings("tokenizer.ggml.tokens")).ok());
    EXPECT_TRUE(w.SetStringArray("tokenizer.ggml.merges", strings("tokenizer.ggml.merges")).ok());
    EXPECT_TRUE(w.SetI32Array("tokenizer.ggml.token_type", *src.file->GetI32Array("tokenizer.ggml.token_type")).ok());
    EXPECT_TRUE(w.SetU32("tokenizer.ggml.bos_token_id", 50256).ok());
    EXPECT_TRUE(w.SetU32("tokenizer.ggml.eos_token_id", 50256).ok());
    return w;
  }

  // A small vocabulary: the 256 byte-alphabet characters (id = byte), then `extra` tokens,
  // "<|end|>" (control) and "<x>" (user-defined), with `merges`.
  static GgufWriter Small(const std::vector<std::string>& extra, const std::vector<std::string>& merges,
                          const std::string& pre) {
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    for (const std::string& c : ByteAlphabet()) {
      tokens.push_back(c);
      types.push_back(1);
    }
    for (const std::string& e : extra) {
      tokens.push_back(e);
      types.push_back(1);
    }
    tokens.push_back("<|end|>");
    types.push_back(3);
    tokens.push_back("<x>");
    types.push_back(4);
    GgufWriter w;
    EXPECT_TRUE(w.SetString("tokenizer.ggml.model", "gpt2").ok());
    EXPECT_TRUE(w.SetString("tokenizer.ggml.pre", pre).ok());
    EXPECT_TRUE(w.SetStringArray("tokenizer.ggml.tokens", tokens).ok());
    EXPECT_TRUE(w.SetI32Array("tokenizer.ggml.token_type", types).ok());
    EXPECT_TRUE(w.SetStringArray("tokenizer.ggml.merges", merges).ok());
    return w;
  }

  std::pair<std::string, Result<Tokenizer>> WriteAndLoad(const GgufWriter& w, const std::string& name) {
    const std::string path = (dir_ / name).string();
    EXPECT_TRUE(w.Write(path).ok());
    Result<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
    EXPECT_TRUE(f.ok()) << f.status().message();
    if (!f.ok()) return {path, f.status()};
    return {path, Tokenizer::LoadGguf(**f)};
  }

  void ExpectRefused(const GgufWriter& w, const std::string& name, const std::vector<std::string>& whats) {
    auto [path, t] = WriteAndLoad(w, name);
    ASSERT_FALSE(t.ok()) << name;
    EXPECT_NE(t.status().message().find(path), std::string::npos) << t.status().message();
    for (const std::string& what : whats) {
      EXPECT_NE(t.status().message().find(what), std::string::npos) << t.status().message();
    }
  }

  fs::path dir_;
};

// Every supported pre-tokenizer over the GPT-2 vocabulary: the whole pipeline runs, the words are
// the pre-tokenizer's (BPE never merges across them), and random text round-trips.
TEST_F(TokenizerBpeFiles, EveryPreTokenizerOverTheGpt2Vocabulary) {
  for (const char* pre : {"default", "gpt-2", "llama-bpe", "qwen2", "falcon", "starcoder",
                          "deepseek-llm", "tekken"}) {
    auto [path, t] = WriteAndLoad(Gpt2With(pre), std::string(pre) + ".gguf");
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_STREQ(PreTokenizerName(t->pre_tokenizer()), pre);
    ExpectRoundTrips(*t, std::array<bool, 256>{}, pre);
    // Every end of a pre-tokenizer word is the end of a token.
    for (const std::string& s : RandomTexts(11, 100)) {
      std::set<size_t> token_ends;
      size_t at = 0;
      for (const int32_t id : t->Encode(s, false)) token_ends.insert(at += t->Decode(-1, id).size());
      at = 0;
      for (const std::string_view w : PreTokenize(t->pre_tokenizer(), s)) {
        at += w.size();
        EXPECT_EQ(token_ends.count(at), 1u) << pre << " \"" << Escaped(s) << "\" word ends at byte " << at;
      }
    }
  }
}

TEST_F(TokenizerBpeFiles, PreTokenizersSplitDigitsDifferently) {
  const auto pieces = [&](const char* pre, const std::string& text) {
    auto [path, t] = WriteAndLoad(Gpt2With(pre), std::string(pre) + "-digits.gguf");
    EXPECT_TRUE(t.ok()) << t.status().message();
    std::vector<std::string> out;
    for (const int32_t id : t->Encode(text, false)) out.push_back(t->piece(id));
    return out;
  };
  using V = std::vector<std::string>;
  // Llama 3 (\p{N}{1,3}), Falcon and default ([0-9]{3} after the GPT-2 regex) cut "12345" into
  // "123" and "45", which the GPT-2 merges make one token each; Qwen 2 (\p{N}) and StarCoder
  // (\p{N} first) give one word per digit.
  EXPECT_EQ(pieces("llama-bpe", "12345"), (V{"123", "45"}));
  EXPECT_EQ(pieces("falcon", "12345"), (V{"123", "45"}));
  EXPECT_EQ(pieces("default", "12345"), (V{"123", "45"}));
  EXPECT_EQ(pieces("qwen2", "12345"), (V{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(pieces("starcoder", "12345"), (V{"1", "2", "3", "4", "5"}));
}

TEST_F(TokenizerBpeFiles, MergeRankOrderTiesAndIgnoreMerges) {
  // Merges by rank: "b c" (rank 0) before "a b" (rank 1), so "abc" is a + bc, never ab + c.
  {
    auto [path, t] = WriteAndLoad(Small({"ab", "bc", "aa"}, {"b c", "a b", "a a"}, "gpt-2"), "rank.gguf");
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ(t->Encode("abc", false), (std::vector<int32_t>{'a', 257}));
    EXPECT_EQ(t->Encode("ab", false), (std::vector<int32_t>{256}));
    // Equal ranks: leftmost first, so "aaa" is aa + a.
    EXPECT_EQ(t->Encode("aaa", false), (std::vector<int32_t>{258, 'a'}));
    // Literals: control "<|end|>" (id 259) and user-defined "<x>" (id 260); the user-defined one
    // decodes to its text, the control one to "".
    EXPECT_EQ(t->Encode("ab<x>ab<|end|>", false), (std::vector<int32_t>{256, 260, 256, 259}));
    EXPECT_EQ(t->Detokenize(t->Encode("ab<x>ab<|end|>", false)), "ab<x>ab");
    EXPECT_TRUE(t->IsEndOfGeneration(259));
    EXPECT_FALSE(t->add_bos());
    EXPECT_EQ(t->bos(), 11);  // llama.cpp's BPE default when the file names none
  }
  // "xyz" is a token no merge reaches: only llama-bpe (ignore_merges) takes the word whole, and
  // its family adds BOS by default.
  for (const char* pre : {"gpt-2", "llama-bpe"}) {
    auto [path, t] = WriteAndLoad(Small({"xyz"}, {"a b"}, pre), std::string(pre) + "-ignore.gguf");
    ASSERT_TRUE(t.ok()) << t.status().message();
    const bool llama = std::string(pre) == "llama-bpe";
    const std::vector<int32_t> want = llama ? std::vector<int32_t>{256} : std::vector<int32_t>{'x', 'y', 'z'};
    EXPECT_EQ(t->Encode("xyz", false), want);
    EXPECT_EQ(t->add_bos(), llama);
  }
}

TEST_F(TokenizerBpeFiles, FlagsAndDefaults) {
  {
    GgufWriter w = Small({}, {"a b"}, "llama-bpe");
    ASSERT_TRUE(w.SetBool("tokenizer.ggml.add_bos_token", false).ok());
    ASSERT_TRUE(w.SetU32("tokenizer.ggml.bos_token_id", 256).ok());
    ASSERT_TRUE(w.SetU32("tokenizer.ggml.unknown_token_id", 0).ok());
    auto [path, t] = WriteAndLoad(w, "flags.gguf");
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_FALSE(t->add_bos());  // the key overrides the Llama 3 family's default
    EXPECT_EQ(t->bos(), 256);
    EXPECT_EQ(t->unk(), 0);
  }
  {
    // No tokenizer.ggml.pre: llama.cpp's "default".
    auto [path, t] = WriteAndLoad(Gpt2With(""), "nopre.gguf");
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ(t->pre_tokenizer(), PreTokenizer::kDefault);
  }
}

TEST_F(TokenizerBpeFiles, UnknownPreTokenizerAndModelAreRefused) {
  ExpectRefused(Small({}, {}, "chatglm-bpe"), "chatglm-bpe.gguf",
                {"tokenizer.ggml.pre", "\"chatglm-bpe\"", "llama-bpe", "qwen2", "tekken"});
  GgufWriter w;
  ASSERT_TRUE(w.SetString("tokenizer.ggml.model", "bert").ok());
  ASSERT_TRUE(w.SetStringArray("tokenizer.ggml.tokens", {"a", "b"}).ok());
  ExpectRefused(w, "bert.gguf", {"tokenizer.ggml.model", "\"bert\""});
}

TEST_F(TokenizerBpeFiles, DamagedVocabulariesAreRefused) {
  {
    GgufWriter w;
    ASSERT_TRUE(w.SetString("tokenizer.ggml.model", "gpt2").ok());
    ASSERT_TRUE(w.SetStringArray("tokenizer.ggml.tokens", {"a", "b"}).ok());
    ExpectRefused(w, "nomerges.gguf", {"tokenizer.ggml.merges"});
  }
  ExpectRefused(Small({}, {"a b", "ab"}, "gpt-2"), "merge.gguf", {"tokenizer.ggml.merges[1]", "\"ab\""});
  {
    GgufWriter w = Small({}, {}, "gpt-2");
    ASSERT_TRUE(w.SetU32("tokenizer.ggml.eos_token_id", 9999).ok());
    ExpectRefused(w, "eos.gguf", {"tokenizer.ggml.eos_token_id", "9999"});
  }
  {
    GgufWriter w;
    ASSERT_TRUE(w.SetString("tokenizer.ggml.model", "gpt2").ok());
    ASSERT_TRUE(w.SetStringArray("tokenizer.ggml.tokens", {"a", "b"}).ok());
    ASSERT_TRUE(w.SetStringArray("tokenizer.ggml.merges", {"a b"}).ok());
    ASSERT_TRUE(w.SetI32Array("tokenizer.ggml.token_type", {1, 7}).ok());
    ExpectRefused(w, "types.gguf", {"type 7"});
  }
}

TEST(TokenizerBpe, LongTextIsFast) {
  const Loaded v = Load(kGpt2);
  std::string text;
  while (text.size() < 1'000'000) text += "The quick brown fox jumps over the lazy dog; 日本語 🦙 12345\n";
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = v.tok.Encode(text, false);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GT(ids.size(), 200'000u);
  EXPECT_EQ(v.tok.Detokenize(ids), text);
  std::printf("gpt-2: %zu bytes -> %zu tokens in %.3f s\n", text.size(), ids.size(), seconds);
  // One word of 100,000 spaces and one of 100,000 letters: merges stay O(n log n).
  for (const std::string& s : {std::string(100'000, ' '), std::string(100'000, 'a')}) {
    EXPECT_EQ(v.tok.Detokenize(v.tok.Encode(s, false)), s);
  }
}

}  // namespace
}  // namespace kvq
