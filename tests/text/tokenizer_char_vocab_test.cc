// A llama2.c tokenizer file without the 256 byte pieces (a character-level vocabulary,
// test_util/llama2c_runc.h) loads; text whose characters all have pieces encodes exactly as
// run.c's encode() (written out in the test) and round-trips; a character without a piece becomes
// <unk>, one per character, and the first one is reported once (through the notice sink, or on
// stderr by default); truncated or corrupt files are refused naming the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "test_util/llama2c_runc.h"
#include "text/tokenizer.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

class CharVocabTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("kvq-char-vocab-tok-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    vocab_ = test::CharacterVocab();
    test::WriteLlama2cTokenizer(path(), vocab_.pieces, vocab_.scores);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name = "chars-tok.bin") const { return (dir_ / name).string(); }
  int32_t n() const { return static_cast<int32_t>(vocab_.pieces.size()); }
  int32_t id(const std::string& piece) const {
    const auto it = std::find(vocab_.pieces.begin(), vocab_.pieces.end(), piece);
    return it == vocab_.pieces.end() ? -1 : static_cast<int32_t>(it - vocab_.pieces.begin());
  }
  Tokenizer Load() const {
    Result<Tokenizer> t = Tokenizer::LoadLlama2c(path(), n());
    EXPECT_TRUE(t.ok()) << t.status().message();
    return t.ok() ? std::move(t).value() : Tokenizer();
  }

  fs::path dir_;
  test::CharVocab vocab_;
};

TEST_F(CharVocabTokenizer, LoadsAndEncodesLikeRunC) {
  Tokenizer t = Load();
  std::vector<std::string> notes;
  t.set_notice_sink([&](std::string_view note) { notes.emplace_back(note); });
  EXPECT_FALSE(t.has_byte_pieces());
  EXPECT_EQ(t.vocab_size(), n());
  EXPECT_EQ(t.type(0), Tokenizer::TokenType::kUnknown);
  EXPECT_EQ(t.type(1), Tokenizer::TokenType::kControl);
  EXPECT_EQ(t.type(2), Tokenizer::TokenType::kControl);
  // Known answers first (the merges: "th" before "he", then "the", then " the"; the "an"/"nd" and
  // "er"/"re" ties go to the left pair).
  EXPECT_EQ(t.Encode("the", true), (std::vector<int32_t>{1, id(" the")}));
  EXPECT_EQ(t.Encode("and were", false), (std::vector<int32_t>{id(" and"), id(" "), id("w"), id("er"), id("e")}));
  for (const std::string text : {"the cat and the dog.", "in the end, were her hen ran!\nthen", "a", " ", "  x ",
                                 "they're here?\n\nthe end", "theandthe"}) {
    SCOPED_TRACE("text \"" + text + "\"");
    for (const bool bos : {true, false}) {
      const std::vector<int32_t> ids = t.Encode(text, bos);
      EXPECT_EQ(ids, test::RunCEncode(vocab_.pieces, vocab_.scores, text, bos));
      EXPECT_EQ(t.Detokenize(ids), text);
    }
  }
  EXPECT_EQ(t.Encode("", true), (std::vector<int32_t>{1}));  // run.c: no dummy prefix for ""
  EXPECT_EQ(t.unknown_characters(), 0);
  EXPECT_TRUE(notes.empty());
  // run.c's decode(): the space after BOS is dropped, not elsewhere.
  EXPECT_EQ(t.Decode(1, id(" the")), "the");
  EXPECT_EQ(t.Decode(id("a"), id(" the")), " the");
}

TEST_F(CharVocabTokenizer, ACharacterWithoutAPieceIsUnknownAndNotedOnce) {
  Tokenizer t = Load();
  std::vector<std::string> notes;
  t.set_notice_sink([&](std::string_view note) { notes.emplace_back(note); });
  // ':' and 'é' (two bytes) have no piece: one <unk> each, whatever its length in bytes. (run.c
  // would emit ':' + 3 = 61 and 0xC3 + 3, 0xA9 + 3: ids past this vocabulary's end.)
  EXPECT_EQ(t.Encode("a:é", false), (std::vector<int32_t>{id(" a"), 0, 0}));
  EXPECT_EQ(t.unknown_characters(), 2);
  ASSERT_EQ(notes.size(), 1u);
  const std::string& note = notes[0];
  for (const std::string& part : std::vector<std::string>{path(), "':' (U+003A)", "no byte pieces", "<unk> (id 0)"}) {
    EXPECT_NE(note.find(part), std::string::npos) << "\"" << part << "\" is not in: " << note;
  }
  // Later unknown characters are counted, not reported again; the pieces around them still merge.
  EXPECT_EQ(t.Encode("the;the", false), (std::vector<int32_t>{id(" the"), 0, id("the")}));
  EXPECT_EQ(t.Encode("\xff", false), (std::vector<int32_t>{id(" "), 0}));  // invalid UTF-8 too
  EXPECT_EQ(t.unknown_characters(), 4);
  EXPECT_EQ(notes.size(), 1u);
  EXPECT_EQ(t.Decode(id("a"), 0), "");  // <unk> decodes to nothing
}

TEST_F(CharVocabTokenizer, TheDefaultNoticeIsOneLineOnStderr) {
  const Tokenizer t = Load();
  ::testing::internal::CaptureStderr();
  const std::vector<int32_t> first = t.Encode("\xc3\xa9t\xc3\xa9", false);
  const std::vector<int32_t> second = t.Encode("#", false);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(first, (std::vector<int32_t>{id(" "), 0, id("t"), 0}));
  EXPECT_EQ(second, (std::vector<int32_t>{id(" "), 0}));
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_EQ(err.rfind("kvq: tokenizer " + path(), 0), 0u) << err;
  EXPECT_NE(err.find("'\xc3\xa9' (U+00E9)"), std::string::npos) << err;
  EXPECT_EQ(t.unknown_characters(), 3);
}

TEST_F(CharVocabTokenizer, AVocabularyWithBytePiecesStillFallsBackToThem) {
  // The same pieces plus the 256 byte pieces at ids 3..258, where run.c assumes them.
  std::vector<std::string> pieces(vocab_.pieces.begin(), vocab_.pieces.begin() + 3);
  std::vector<float> scores(3, 0.0f);
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
    pieces.emplace_back(hex);
    scores.push_back(0);
  }
  pieces.insert(pieces.end(), vocab_.pieces.begin() + 3, vocab_.pieces.end());
  scores.insert(scores.end(), vocab_.scores.begin() + 3, vocab_.scores.end());
  test::WriteLlama2cTokenizer(path("bytes.bin"), pieces, scores);
  Result<Tokenizer> t = Tokenizer::LoadLlama2c(path("bytes.bin"), static_cast<int32_t>(pieces.size()));
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_TRUE(t->has_byte_pieces());
  for (const std::string text : {"a:\xc3\xa9 the", "\xe6\x97\xa5 and", "\x01#"}) {
    const std::vector<int32_t> ids = t->Encode(text, true);
    EXPECT_EQ(ids, test::RunCEncode(pieces, scores, text, true)) << text;
    EXPECT_EQ(t->Detokenize(ids), text);
  }
  EXPECT_EQ(t->unknown_characters(), 0);
}

TEST_F(CharVocabTokenizer, TruncatedOrCorruptFilesAreRefusedNamingTheFile) {
  std::ifstream in(path(), std::ios::binary);
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto refused = [&](const std::string& bytes, int32_t vocab_size, const std::string& why) {
    const std::string p = path("damaged.bin");
    std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    Result<Tokenizer> t = Tokenizer::LoadLlama2c(p, vocab_size);
    EXPECT_FALSE(t.ok()) << why;
    if (t.ok()) return;
    EXPECT_NE(t.status().message().find(p), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find(why), std::string::npos) << t.status().message();
  };
  refused("", n(), "no header");
  refused(data.substr(0, 2), n(), "no header");
  refused(data.substr(0, 10), n(), "ends at token 0");
  refused(data.substr(0, data.size() / 2), n(), "it ends");
  refused(data.substr(0, data.size() - 1), n(), "ends inside token");
  refused(data + "x", n(), "bytes after the last token");
  refused(data, n() + 1, "ends at token");
  refused(data, 2, "at least <unk>, BOS and EOS");
  std::string negative = data;  // token 0's length field: -1
  const int32_t minus_one = -1;
  std::memcpy(negative.data() + 8, &minus_one, 4);
  refused(negative, n(), "token 0 has length -1");
}

}  // namespace
}  // namespace kvq
