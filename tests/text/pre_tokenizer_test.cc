// Pre-tokenizer splits on hand-written inputs, each expected split derived by hand from the regex
// definitions in pre_tokenizer.h (the derivation is in the comment beside it); the Unicode tables
// (categories, White_Space) and the UTF-8 decoder's handling of invalid bytes; splits always
// cover the text; long runs stay linear.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "text/pre_tokenizer.h"
#include "text/unicode.h"

namespace kvq {
namespace {

using Words = std::vector<std::string>;

Words Split(const char* pre, const std::string& text) {
  const std::optional<PreTokenizerSpec> spec = FindPreTokenizer(pre);
  EXPECT_TRUE(spec.has_value()) << pre;
  Words out;
  for (const std::string_view w : PreTokenize(spec->kind, text)) out.emplace_back(w);
  return out;
}

TEST(PreTokenizer, Gpt2) {
  EXPECT_EQ(Split("gpt-2", "Hello world"), (Words{"Hello", " world"}));
  // Contractions are case-sensitive: "'M" is "'" (a run of [^\s\p{L}\p{N}]) then "M".
  EXPECT_EQ(Split("gpt-2", "I'm don't"), (Words{"I", "'m", " don", "'t"}));
  EXPECT_EQ(Split("gpt-2", "I'M"), (Words{"I", "'", "M"}));
  EXPECT_EQ(Split("gpt-2", "we'll've"), (Words{"we", "'ll", "'ve"}));
  // ` ?\p{N}+` takes any number of digits.
  EXPECT_EQ(Split("gpt-2", "12345 678"), (Words{"12345", " 678"}));
  // \s+(?!\S): of two spaces before a letter the first is a word, the second leads " b".
  EXPECT_EQ(Split("gpt-2", "a  b"), (Words{"a", " ", " b"}));
  EXPECT_EQ(Split("gpt-2", "a \n b"), (Words{"a", " \n", " b"}));
  // Trailing whitespace: \s+(?!\S) takes the whole run at the end.
  EXPECT_EQ(Split("gpt-2", "end   "), (Words{"end", "   "}));
  // One whitespace character that is not a space, before a letter: \s+ alone.
  EXPECT_EQ(Split("gpt-2", "\tfoo"), (Words{"\t", "foo"}));
  EXPECT_EQ(Split("gpt-2", "!!! ??"), (Words{"!!!", " ??"}));
  EXPECT_EQ(Split("gpt-2", "日本語 テキスト"), (Words{"日本語", " テキスト"}));
  // A combining mark (U+0301, category M) is not \p{L}: it ends the letter run.
  EXPECT_EQ(Split("gpt-2", "cafe\xCC\x81s"), (Words{"cafe", "\xCC\x81", "s"}));
  EXPECT_TRUE(Split("gpt-2", "").empty());
}

TEST(PreTokenizer, Llama3) {
  // (?i:...) contractions: "'M" and "'LL" are words.
  EXPECT_EQ(Split("llama-bpe", "I'M don't WE'LL"), (Words{"I", "'M", " don", "'t", " WE", "'LL"}));
  // \p{N}{1,3}: digits in threes from the left.
  EXPECT_EQ(Split("llama-bpe", "12345"), (Words{"123", "45"}));
  EXPECT_EQ(Split("llama-bpe", "1234567"), (Words{"123", "456", "7"}));
  // [^\r\n\p{L}\p{N}]?\p{L}+: any one non-letter, non-digit but \r and \n may lead the letters.
  EXPECT_EQ(Split("llama-bpe", "\tfoo"), (Words{"\tfoo"}));
  EXPECT_EQ(Split("llama-bpe", "(foo)"), (Words{"(foo", ")"}));
  EXPECT_EQ(Split("llama-bpe", "\nfoo"), (Words{"\n", "foo"}));
  EXPECT_EQ(Split("llama-bpe", "a  b"), (Words{"a", " ", " b"}));
  // \s*[\r\n]+: the whitespace run up to and including its last newline.
  EXPECT_EQ(Split("llama-bpe", "x \n\n y"), (Words{"x", " \n\n", " y"}));
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`: punctuation takes the newlines after it.
  EXPECT_EQ(Split("llama-bpe", "hello!!!\n\nworld"), (Words{"hello", "!!!\n\n", "world"}));
  EXPECT_EQ(Split("llama-bpe", "foo   "), (Words{"foo", "   "}));
  EXPECT_EQ(Split("llama-bpe", "3.14"), (Words{"3", ".", "14"}));
  EXPECT_EQ(Split("llama-bpe", "...abc"), (Words{"...", "abc"}));
  // Emoji are \p{S}: a run of them, then " ok".
  EXPECT_EQ(Split("llama-bpe", "\xF0\x9F\x98\x80\xF0\x9F\x98\x80 ok"), (Words{"\xF0\x9F\x98\x80\xF0\x9F\x98\x80", " ok"}));
  // CJK ideographs are letters (Lo).
  EXPECT_EQ(Split("llama-bpe", "我爱你 12"), (Words{"我爱你", " ", "12"}));
}

TEST(PreTokenizer, Qwen2) {
  // \p{N}: one digit per word.
  EXPECT_EQ(Split("qwen2", "12345"), (Words{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(Split("qwen2", "I'M"), (Words{"I", "'M"}));
  // " " before a digit: not a letter lead, not [^\s..]; a single whitespace before \S is \s+.
  EXPECT_EQ(Split("qwen2", "version 2.5"), (Words{"version", " ", "2", ".", "5"}));
  EXPECT_EQ(Split("qwen2", "a\r\n\r\nb"), (Words{"a", "\r\n\r\n", "b"}));
}

TEST(PreTokenizer, DeepseekLlm) {
  // [\r\n] first; then \s?[letters]+ gives "Hello", " world"; [!-/:-~] also holds the ASCII
  // letters, so the letter words stay whole; the newline is a trailing \s+$ of its own.
  EXPECT_EQ(Split("deepseek-llm", "Hello, world!\n"), (Words{"Hello", ",", " world", "!", "\n"}));
  // " 123" survives the letter and punctuation regexes ('1' is in neither class); the CJK regex
  // cuts "中文"; \p{N}+ then splits " " from "123".
  EXPECT_EQ(Split("deepseek-llm", "中文abc 123"), (Words{"中文", "abc", " ", "123"}));
  EXPECT_EQ(Split("deepseek-llm", "价格 123456 元"), (Words{"价格", " ", "123456", " ", "元"}));
  EXPECT_EQ(Split("deepseek-llm", "a  "), (Words{"a", "  "}));
  // Greek and fullwidth letters are in the letter class, and KELVIN SIGN (U+212A) is too, but
  // it is also in the CJK regex's range U+0800..U+4E00, which then cuts it from its space.
  EXPECT_EQ(Split("deepseek-llm", "αβγ ＡＢ \xE2\x84\xAA"), (Words{"αβγ", " ＡＢ", " ", "\xE2\x84\xAA"}));
  // U+3000 is both \s and in the punctuation class: "\u3000\u3000!" is one match of
  // \s?[...]+, which the CJK range (it holds U+3000 as well) cuts before "!". (llama.cpp's
  // wregex sees U+3000 as \s only and gets "\u3000", "\u3000", "!"; see pre_tokenizer.cc.)
  EXPECT_EQ(Split("deepseek-llm", "x\xE3\x80\x80\xE3\x80\x80!"), (Words{"x", "\xE3\x80\x80\xE3\x80\x80", "!"}));
}

TEST(PreTokenizer, Tekken) {
  // [^\r\n\p{L}\p{N}]?Upper*Lower+ first: a word ends before an upper-case letter that follows a
  // lower-case one; Upper* takes "HTTPS" and Lower+ "erver".
  EXPECT_EQ(Split("tekken", "camelCase HTTPServer"), (Words{"camel", "Case", " HTTPServer"}));
  EXPECT_EQ(Split("tekken", " iPhone"), (Words{" i", "Phone"}));
  // All upper case: Upper*Lower+ finds no Lower to end on; Upper+Lower* takes the run.
  EXPECT_EQ(Split("tekken", "ÉCOLE École"), (Words{"ÉCOLE", " École"}));
  // Lo (CJK) is in both classes; a mark (M) too, even after a space that leads it.
  EXPECT_EQ(Split("tekken", "日本語 \xCC\x81x"), (Words{"日本語", " \xCC\x81x"}));
  // Title case (Lt, U+01C5) is upper; a modifier letter (Lm, U+02B0) is both.
  EXPECT_EQ(Split("tekken", "a\u01C5b a\u02B0B"), (Words{"a", "\u01C5b", " a\u02B0", "B"}));
  // Any non-letter, non-digit but \r and \n may lead a letter word; \p{N} is one digit.
  EXPECT_EQ(Split("tekken", "a/b 2024"), (Words{"a", "/b", " ", "2", "0", "2", "4"}));
  // ` ?[^\s\p{L}\p{N}]+[\r\n/]*`, then the whitespace rules as Llama 3's.
  EXPECT_EQ(Split("tekken", "x //\n\n y  "), (Words{"x", " //\n\n", " y", "  "}));
}

TEST(PreTokenizer, Falcon) {
  // [\p{P}\$\+<=>\^~\|`]+ first, then GPT-2's regex inside each piece, then [0-9]{3}.
  EXPECT_EQ(Split("falcon", "hello... world!!"), (Words{"hello", "...", " world", "!!"}));
  EXPECT_EQ(Split("falcon", "x=12345;"), (Words{"x", "=", "123", "45", ";"}));
  // The backtick is cut first; the space before it ends its piece, where \s+(?!\S) takes it.
  EXPECT_EQ(Split("falcon", "a `b`"), (Words{"a", " ", "`", "b", "`"}));
  // "'" is punctuation, cut before GPT-2's contractions could see it.
  EXPECT_EQ(Split("falcon", "don't"), (Words{"don", "'", "t"}));
}

TEST(PreTokenizer, Starcoder) {
  // \p{N} first (one digit per piece), then GPT-2's regex.
  EXPECT_EQ(Split("starcoder", "x = 42"), (Words{"x", " =", " ", "4", "2"}));
  EXPECT_EQ(Split("starcoder", "don't"), (Words{"don", "'t"}));
}

TEST(PreTokenizer, Default) {
  // [\p{P}\$\+<=>\^~\|]+ ; GPT-2 ; \p{N}+ splits " " from "12345" ; [0-9]{3}.
  EXPECT_EQ(Split("default", "hello... 12345"), (Words{"hello", "...", " ", "123", "45"}));
  EXPECT_EQ(Split("default", "a$b"), (Words{"a", "$", "b"}));
}

TEST(PreTokenizer, InvalidUtf8IsSplitAsReplacementCharacters) {
  // Each invalid byte is U+FFFD (a symbol: [^\s\p{L}\p{N}]), and the words keep the bytes.
  EXPECT_EQ(Split("gpt-2", "a\xFF\xFE" "b"), (Words{"a", "\xFF\xFE", "b"}));
  EXPECT_EQ(Split("gpt-2", " \x80x"), (Words{" \x80", "x"}));
  // A lead byte without its continuation bytes is one bad byte; the letters after it are text.
  EXPECT_EQ(Split("llama-bpe", "\xE0" "ab"), (Words{"\xE0" "ab"}));  // U+FFFD leads the letters
  EXPECT_EQ(Split("gpt-2", "\xE0" "ab"), (Words{"\xE0", "ab"}));
}

TEST(PreTokenizer, WordsCoverTheTextAndLongRunsAreLinear) {
  const char* kinds[] = {"default", "gpt-2",     "llama-bpe",    "qwen2",
                         "falcon",  "starcoder", "deepseek-llm", "tekken"};
  std::mt19937 rng(5);
  for (int i = 0; i < 300; ++i) {
    std::string s;
    const int n = static_cast<int>(rng() % 40);
    for (int k = 0; k < n; ++k) s.push_back(static_cast<char>(rng() % 4 == 0 ? rng() % 256 : " \n\ta1'.\xC3\xA9"[rng() % 10]));
    for (const char* kind : kinds) {
      std::string joined;
      for (const std::string& w : Split(kind, s)) {
        EXPECT_FALSE(w.empty()) << kind;
        joined += w;
      }
      EXPECT_EQ(joined, s) << kind;
    }
  }
  // 200,000 characters of one class, then something else: each regex must stay linear (a
  // quadratic scan would take minutes; linear takes milliseconds, so 10 s is generous).
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& s :
       {std::string(200'000, ' ') + "a", std::string(200'000, 'a') + " ",
        std::string(200'000, '1') + "x", std::string(200'000, '!') + "\n",
        std::string(100'000, '\n') + " x", std::string(200'000, 'A') + "1"}) {
    for (const char* kind : kinds) {
      size_t total = 0;
      for (const std::string& w : Split(kind, s)) total += w.size();
      EXPECT_EQ(total, s.size()) << kind;
    }
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
}

TEST(PreTokenizer, Names) {
  const std::optional<PreTokenizerSpec> llama = FindPreTokenizer("llama-bpe");
  ASSERT_TRUE(llama.has_value());
  EXPECT_EQ(llama->kind, PreTokenizer::kLlama3);
  EXPECT_TRUE(llama->ignore_merges);
  EXPECT_TRUE(llama->add_bos);
  EXPECT_EQ(FindPreTokenizer("qwen2")->kind, PreTokenizer::kQwen2);
  EXPECT_FALSE(FindPreTokenizer("qwen2")->ignore_merges);
  EXPECT_EQ(FindPreTokenizer("tekken")->kind, PreTokenizer::kTekken);
  EXPECT_TRUE(FindPreTokenizer("tekken")->ignore_merges);  // as llama.cpp sets for Tekken
  EXPECT_TRUE(FindPreTokenizer("tekken")->add_bos);
  EXPECT_FALSE(FindPreTokenizer("mistral").has_value());
  EXPECT_FALSE(FindPreTokenizer("").has_value());
  for (const char* name : {"default", "gpt-2", "llama-bpe", "qwen2", "falcon", "starcoder",
                           "deepseek-llm", "tekken"}) {
    EXPECT_NE(SupportedPreTokenizers().find(name), std::string::npos) << name;
    EXPECT_STREQ(PreTokenizerName(FindPreTokenizer(name)->kind), name);
  }
}

TEST(Unicode, Categories) {
  using unicode::Category;
  using unicode::GetCategory;
  EXPECT_EQ(GetCategory('A'), Category::kLetter);
  EXPECT_EQ(GetCategory('5'), Category::kNumber);
  EXPECT_EQ(GetCategory('!'), Category::kPunctuation);
  EXPECT_EQ(GetCategory('$'), Category::kSymbol);
  EXPECT_EQ(GetCategory('`'), Category::kSymbol);  // Sk, not punctuation
  EXPECT_EQ(GetCategory(' '), Category::kSeparator);
  EXPECT_EQ(GetCategory('\n'), Category::kControl);
  EXPECT_EQ(GetCategory(0x00E9), Category::kLetter);     // é
  EXPECT_EQ(GetCategory(0x0661), Category::kNumber);     // Arabic-Indic one (Nd)
  EXPECT_EQ(GetCategory(0x2167), Category::kNumber);     // Roman numeral eight (Nl)
  EXPECT_EQ(GetCategory(0x00BD), Category::kNumber);     // ½ (No)
  EXPECT_EQ(GetCategory(0x0301), Category::kMark);       // combining acute
  EXPECT_EQ(GetCategory(0x1F600), Category::kSymbol);    // 😀
  EXPECT_EQ(GetCategory(0x4E2D), Category::kLetter);     // 中
  EXPECT_EQ(GetCategory(0x20000), Category::kLetter);    // CJK extension B
  EXPECT_EQ(GetCategory(0x3000), Category::kSeparator);  // ideographic space
  EXPECT_EQ(GetCategory(0x2028), Category::kSeparator);  // line separator (Zl)
  using unicode::GetLetterCase;
  using unicode::LetterCase;
  EXPECT_EQ(GetLetterCase('A'), LetterCase::kUpper);
  EXPECT_EQ(GetLetterCase('z'), LetterCase::kLower);
  EXPECT_EQ(GetLetterCase(0x01C5), LetterCase::kUpper);   // ǅ (Lt)
  EXPECT_EQ(GetLetterCase(0x02B0), LetterCase::kOther);   // ʰ (Lm)
  EXPECT_EQ(GetLetterCase(0x4E2D), LetterCase::kOther);   // 中 (Lo)
  EXPECT_EQ(GetLetterCase(0x1D400), LetterCase::kUpper);  // mathematical bold A (Lu)
  EXPECT_EQ(GetLetterCase(0x0301), LetterCase::kNone);    // a mark is no letter
  EXPECT_EQ(GetLetterCase('1'), LetterCase::kNone);
  EXPECT_EQ(GetLetterCase(0x110000), LetterCase::kNone);
  EXPECT_EQ(GetCategory(0xE000), Category::kControl);    // private use (Co)
  EXPECT_EQ(GetCategory(0xD800), Category::kControl);    // surrogate (Cs)
  EXPECT_EQ(GetCategory(0x200B), Category::kControl);    // zero width space (Cf)
  EXPECT_EQ(GetCategory(0x0378), Category::kUndefined);  // unassigned
  EXPECT_EQ(GetCategory(0x10FFFF), Category::kUndefined);
  EXPECT_EQ(GetCategory(0x110000), Category::kUndefined);
  EXPECT_EQ(GetCategory(0x0870), Category::kLetter);  // new in Unicode 14.0: the tables are >= 14
  const std::string version = unicode::UnicodeVersion();
  EXPECT_EQ(std::count(version.begin(), version.end(), '.'), 2) << version;
  std::printf("Unicode tables: version %s\n", version.c_str());
}

TEST(Unicode, WhitespaceIsTheWhiteSpaceProperty) {
  const std::vector<uint32_t> want = {0x09,   0x0A,   0x0B,   0x0C,   0x0D,   0x20,   0x85,   0xA0,   0x1680,
                                      0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008,
                                      0x2009, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000};
  std::vector<uint32_t> got;
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (unicode::IsWhitespace(cp)) got.push_back(cp);
  }
  EXPECT_EQ(got, want);  // not U+001C..U+001F (Python's str.isspace), not U+200B, U+180E, U+FEFF
}

TEST(Unicode, DecodeUtf8) {
  const auto decode = [](const std::string& s) {
    const unicode::Decoded d = unicode::DecodeUtf8(s, 0);
    return std::pair<uint32_t, uint32_t>(d.code_point, d.n_bytes);
  };
  using P = std::pair<uint32_t, uint32_t>;
  EXPECT_EQ(decode("A"), (P{'A', 1}));
  EXPECT_EQ(decode("\xC3\xA9"), (P{0xE9, 2}));
  EXPECT_EQ(decode("\xE4\xB8\xAD"), (P{0x4E2D, 3}));
  EXPECT_EQ(decode("\xF0\x9F\x98\x80"), (P{0x1F600, 4}));
  EXPECT_EQ(decode("\xF4\x8F\xBF\xBF"), (P{0x10FFFF, 4}));
  // As llama.cpp: overlong forms and surrogates decode to the value they spell.
  EXPECT_EQ(decode("\xC0\xAF"), (P{0x2F, 2}));
  EXPECT_EQ(decode("\xED\xA0\x80"), (P{0xD800, 3}));
  // Invalid: U+FFFD taking one byte.
  for (const std::string bad : {"\x80", "\xBF", "\xC3", "\xC3" "A", "\xE0" "ab", "\xE4\xB8", "\xF0\x9F\x98",
                                "\xF8\x88\x80\x80\x80", "\xFF", "\xF4\x90\x80\x80", "\xF7\xBF\xBF\xBF"}) {
    EXPECT_EQ(decode(bad), (P{0xFFFD, 1})) << bad.size();
  }
  std::string out;
  for (const uint32_t cp : {0x41u, 0xE9u, 0x4E2Du, 0x1F600u}) unicode::AppendUtf8(cp, out);
  EXPECT_EQ(out, "A\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80");
}

}  // namespace
}  // namespace kvq
