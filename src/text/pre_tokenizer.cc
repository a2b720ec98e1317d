// Pre-tokenizers (see pre_tokenizer.h). The text is decoded once into code points with their
// category and White_Space flag; each regex is a matcher that says how many characters match at a
// position (0: no match), and one driver walks a piece the way a regex iterator does: it tries
// every position left to right, a match becomes a piece, and the text between matches becomes a
// piece too. A matcher reads nothing past the end of its piece, so lookaheads such as (?!\S) and
// anchors such as $ see the piece's end as the end of the text (as llama.cpp's split does).
#include "text/pre_tokenizer.h"

#include <algorithm>
#include <array>

#include "text/unicode.h"

namespace kvq {
namespace {

using unicode::Category;

constexpr uint8_t kCategoryMask = 0x7;
constexpr uint8_t kWhitespaceFlag = 0x8;
constexpr uint8_t kCaseShift = 4;  // bits 4-5: unicode::LetterCase (only where a regex asks for it)
constexpr uint32_t kNone = 0xFFFFFFFF;  // "past the end of the piece": matches no class

// The text as characters: code point, flags (Category | kWhitespaceFlag) and byte offset.
struct Chars {
  std::vector<uint32_t> cp;
  std::vector<uint8_t> flags;
  std::vector<size_t> offset;  // [cp.size() + 1]: byte offset of each character, then the end
};

/// With `cases`, each letter's flags hold its LetterCase too (a table lookup per letter, so only
/// for the regexes that tell cases apart).
Chars DecodeText(std::string_view text, bool cases) {
  Chars c;
  c.cp.reserve(text.size());
  c.flags.reserve(text.size());
  c.offset.reserve(text.size() + 1);
  for (size_t at = 0; at < text.size();) {
    const unicode::Decoded d = unicode::DecodeUtf8(text, at);
    c.cp.push_back(d.code_point);
    const Category category = unicode::GetCategory(d.code_point);
    const uint8_t letter_case = cases && category == Category::kLetter
                                    ? static_cast<uint8_t>(unicode::GetLetterCase(d.code_point))
                                    : 0;
    c.flags.push_back(
        static_cast<uint8_t>(static_cast<uint8_t>(category) | (letter_case << kCaseShift) |
                             (unicode::IsWhitespace(d.code_point) ? kWhitespaceFlag : 0)));
    c.offset.push_back(at);
    at += d.n_bytes;
  }
  c.offset.push_back(text.size());
  return c;
}

// One piece being split: characters [.., end) of `chars`; every accessor is false past `end`.
struct Piece {
  const Chars& chars;
  size_t end;

  uint32_t Cp(size_t i) const { return i < end ? chars.cp[i] : kNone; }
  Category Cat(size_t i) const { return static_cast<Category>(chars.flags[i] & kCategoryMask); }
  bool Space(size_t i) const { return i < end && (chars.flags[i] & kWhitespaceFlag) != 0; }
  bool Letter(size_t i) const { return i < end && Cat(i) == Category::kLetter; }
  bool Number(size_t i) const { return i < end && Cat(i) == Category::kNumber; }
  /// [^\s\p{L}\p{N}]
  bool Other(size_t i) const { return i < end && !Space(i) && !Letter(i) && !Number(i); }
  bool Newline(size_t i) const { return Cp(i) == '\r' || Cp(i) == '\n'; }
  bool Mark(size_t i) const { return i < end && Cat(i) == Category::kMark; }
  unicode::LetterCase Case(size_t i) const {
    return static_cast<unicode::LetterCase>((chars.flags[i] >> kCaseShift) & 3);
  }
  /// [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] (needs DecodeText's cases)
  bool Upper(size_t i) const {
    return Mark(i) || (Letter(i) && Case(i) != unicode::LetterCase::kLower);
  }
  /// [\p{Ll}\p{Lm}\p{Lo}\p{M}] (needs DecodeText's cases)
  bool Lower(size_t i) const {
    return Mark(i) || (Letter(i) && Case(i) != unicode::LetterCase::kUpper);
  }
  /// The first position >= i where pred fails.
  template <typename Pred>
  size_t RunEnd(size_t i, Pred pred) const {
    while (pred(i)) ++i;
    return i;
  }
};

using Matcher = size_t (*)(const Piece& p, size_t pos);

// 's|'t|'re|'ve|'m|'ll|'d; with `any_case`, each letter in either ASCII case ('[sS]|'[tT]|...,
// llama.cpp's adaptation of (?i:...)). Returns 0, 2 or 3.
size_t MatchContraction(const Piece& p, size_t pos, bool any_case) {
  if (p.Cp(pos) != '\'') return 0;
  const auto low = [&](size_t i) {
    const uint32_t c = p.Cp(i);
    return any_case && c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c;
  };
  const uint32_t a = low(pos + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  const uint32_t b = low(pos + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t MatchGpt2(const Piece& p, size_t pos) {
  if (const size_t n = MatchContraction(p, pos, false)) return n;
  // " ?X+": with the space when X follows it; without it the space itself would have to be X,
  // which it is for none of the three classes.
  const size_t s = p.Cp(pos) == ' ' ? pos + 1 : pos;
  if (p.Letter(s)) return p.RunEnd(s, [&](size_t i) { return p.Letter(i); }) - pos;
  if (p.Number(s)) return p.RunEnd(s, [&](size_t i) { return p.Number(i); }) - pos;
  if (p.Other(s)) return p.RunEnd(s, [&](size_t i) { return p.Other(i); }) - pos;
  // Every character is a letter, a number, whitespace or "other", so pos is whitespace here.
  const size_t n = p.RunEnd(pos, [&](size_t i) { return p.Space(i); }) - pos;
  // \s+(?!\S): greedy, then give back one character if a non-space follows; a single space
  // before a non-space is left to \s+.
  if (n > 1 && pos + n < p.end) return n - 1;
  return n;
}

size_t MatchSpaces(const Piece& p, size_t pos);

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
//  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
template <size_t kMaxDigits>
size_t MatchLlama3(const Piece& p, size_t pos) {
  if (const size_t n = MatchContraction(p, pos, true)) return n;
  const auto letters_from = [&](size_t i) { return p.RunEnd(i, [&](size_t k) { return p.Letter(k); }) - pos; };
  // [^\r\n\p{L}\p{N}]?\p{L}+: a letter starts the run itself; any other character but \r, \n and
  // numbers may lead one letter run.
  if (p.Letter(pos)) return letters_from(pos);
  if (!p.Newline(pos) && !p.Number(pos) && p.Letter(pos + 1)) return letters_from(pos + 1);
  if (p.Number(pos)) {
    // Look no further than kMaxDigits: scanning the whole run at every match would be quadratic.
    return p.RunEnd(pos, [&](size_t i) { return i < pos + kMaxDigits && p.Number(i); }) - pos;
  }
  const size_t s = p.Cp(pos) == ' ' ? pos + 1 : pos;
  if (p.Other(s)) {
    const size_t e = p.RunEnd(s, [&](size_t i) { return p.Other(i); });
    return p.RunEnd(e, [&](size_t i) { return p.Newline(i); }) - pos;
  }
  return MatchSpaces(p, pos);
}

// \s*[\r\n]+|\s+(?!\S)|\s+ at a whitespace character (the end of Llama 3's and Tekken's regexes).
size_t MatchSpaces(const Piece& p, size_t pos) {
  // \s*[\r\n]+: \s* gives back characters until a newline follows, so the match ends just
  // after the last \r or \n of the whitespace run.
  const size_t e = p.RunEnd(pos, [&](size_t i) { return p.Space(i); });
  for (size_t i = e; i > pos; --i) {
    if (p.Newline(i - 1)) return i - pos;
  }
  const size_t n = e - pos;
  if (n > 1 && e < p.end) return n - 1;  // \s+(?!\S)
  return n;                              // \s+
}

// Mistral's Tekken (Nemo's tokenizer.json):
//   [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|
//   [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|
//    ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with Upper = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and Lower = [\p{Ll}\p{Lm}\p{Lo}\p{M}] (the two
// classes share Lm, Lo and M), so a word splits before an upper-case letter that follows a
// lower-case one ("camelCase" is "camel", "Case").
size_t MatchTekken(const Piece& p, size_t pos) {
  const auto upper = [&](size_t i) { return p.Upper(i); };
  const auto lower = [&](size_t i) { return p.Lower(i); };
  // Upper*Lower+ from s: the end, or 0. Upper* is greedy and gives back characters until Lower+
  // can start: at its end if a Lower follows, else at its last character that is also Lower.
  const auto upper_then_lower = [&](size_t s) -> size_t {
    const size_t e = p.RunEnd(s, upper);
    if (p.Lower(e)) return p.RunEnd(e, lower);
    for (size_t k = e; k > s; --k) {
      // Lower+ from k - 1 stops at k (not Lower, or past Upper*'s end).
      if (p.Lower(k - 1)) return k;
    }
    return 0;
  };
  // Upper+Lower* from s: the end, or 0 (no backtracking needed: Lower* always matches).
  const auto upper_run_then_lower = [&](size_t s) -> size_t {
    return p.Upper(s) ? p.RunEnd(p.RunEnd(s, upper), lower) : 0;
  };
  // Each of the two letter alternatives with its optional leading character, taken first.
  const bool lead = pos < p.end && !p.Newline(pos) && !p.Letter(pos) && !p.Number(pos);
  if (lead) {
    if (const size_t e = upper_then_lower(pos + 1)) return e - pos;
  }
  if (const size_t e = upper_then_lower(pos)) return e - pos;
  if (lead) {
    if (const size_t e = upper_run_then_lower(pos + 1)) return e - pos;
  }
  if (const size_t e = upper_run_then_lower(pos)) return e - pos;
  if (p.Number(pos)) return 1;
  const size_t s = p.Cp(pos) == ' ' ? pos + 1 : pos;
  if (p.Other(s)) {
    const size_t e = p.RunEnd(s, [&](size_t i) { return p.Other(i); });
    return p.RunEnd(e, [&](size_t i) { return p.Newline(i) || p.Cp(i) == '/'; }) - pos;
  }
  return MatchSpaces(p, pos);  // every other character is whitespace
}

// A run of one class: [class]+.
template <bool (*kIn)(uint32_t cp, uint8_t flags)>
size_t MatchRun(const Piece& p, size_t pos) {
  const auto in = [&](size_t i) { return i < p.end && kIn(p.chars.cp[i], p.chars.flags[i]); };
  return p.RunEnd(pos, in) - pos;
}

// One character of a class: [class].
template <bool (*kIn)(uint32_t cp, uint8_t flags)>
size_t MatchOne(const Piece& p, size_t pos) {
  return kIn(p.chars.cp[pos], p.chars.flags[pos]) ? 1 : 0;
}

// \s?[class]+: with the whitespace when the class follows it, else the class from pos (a
// whitespace character may itself be in the class).
template <bool (*kIn)(uint32_t cp, uint8_t flags)>
size_t MatchSpaceThenRun(const Piece& p, size_t pos) {
  const auto in = [&](size_t i) { return i < p.end && kIn(p.chars.cp[i], p.chars.flags[i]); };
  if (p.Space(pos) && in(pos + 1)) return p.RunEnd(pos + 1, in) - pos;
  return p.RunEnd(pos, in) - pos;
}

// [0-9][0-9][0-9]
size_t MatchThreeDigits(const Piece& p, size_t pos) {
  for (size_t i = pos; i < pos + 3; ++i) {
    if (p.Cp(i) < '0' || p.Cp(i) > '9') return 0;
  }
  return 3;
}

Category CategoryOf(uint8_t flags) { return static_cast<Category>(flags & kCategoryMask); }

// [\p{P}\$\+<=>\^~\|]
bool DefaultPunct(uint32_t cp, uint8_t flags) {
  return CategoryOf(flags) == Category::kPunctuation || cp == '$' || cp == '+' || cp == '<' || cp == '=' ||
         cp == '>' || cp == '^' || cp == '~' || cp == '|';
}
// [\p{P}\$\+<=>\^~\|`]
bool FalconPunct(uint32_t cp, uint8_t flags) { return DefaultPunct(cp, flags) || cp == '`'; }
// \p{N}
bool AnyNumber(uint32_t, uint8_t flags) { return CategoryOf(flags) == Category::kNumber; }
// [\r\n]
bool CrOrLf(uint32_t cp, uint8_t) { return cp == '\r' || cp == '\n'; }

struct Range {
  uint32_t first, last;
};
template <size_t N>
bool InRanges(const std::array<Range, N>& ranges, uint32_t cp) {
  for (const Range& r : ranges) {
    if (cp >= r.first && cp <= r.last) return true;
  }
  return false;
}

// DeepSeek LLM's letter class, as llama.cpp lists it (from the model's tokenizer.json), merged
// into sorted ranges: the cased letters of Latin, Greek, Cyrillic, Armenian, Georgian, Cherokee,
// Glagolitic, Coptic, Deseret, Osage, Old Hungarian, Warang Citi, Adlam and the letterlike
// symbols. Some members are singletons NFC would fold away (U+1F71..U+1F7D inside U+1F5F..U+1F7D,
// U+1FBE, U+1FD3, U+1FDB, U+2126 OHM SIGN, U+212A KELVIN SIGN): the class holds these code points.
constexpr std::array<Range, 84> kDeepseekLetters = {{
    {0x0041, 0x005A},   {0x0061, 0x007A},   {0x00B5, 0x00B5},   {0x00C0, 0x00D6},   {0x00D8, 0x00F6},
    {0x00F8, 0x01BA},   {0x01BC, 0x01BF},   {0x01C4, 0x0293},   {0x0295, 0x02AF},   {0x0370, 0x0373},
    {0x0376, 0x0377},   {0x037B, 0x037D},   {0x037F, 0x037F},   {0x0386, 0x0386},   {0x0388, 0x038A},
    {0x038C, 0x038C},   {0x038E, 0x03A1},   {0x03A3, 0x03F5},   {0x03F7, 0x0481},   {0x048A, 0x052F},
    {0x0531, 0x0556},   {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},   {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},   {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},
    {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},   {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},
    {0x1F5B, 0x1F5B},   {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},   {0x1FD6, 0x1FDB},
    {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},   {0x2102, 0x2102},   {0x2107, 0x2107},
    {0x210A, 0x2113},   {0x2115, 0x2115},   {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},
    {0x2128, 0x2128},   {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},   {0x2C7E, 0x2CE4},
    {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},   {0xA680, 0xA69B},   {0xA722, 0xA76F},
    {0xA771, 0xA787},   {0xA78B, 0xA78E},   {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},
    {0xFF21, 0xFF3A},   {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
}};
bool DeepseekLetter(uint32_t cp, uint8_t) { return InRanges(kDeepseekLetters, cp); }

// [!-/:-~！-／：-～‘-‟　-。]. (llama.cpp's std::wregex sees U+3000 as \s only, because it replaces
// non-ASCII whitespace by U+000B first; the regex itself has U+3000 in the class, and so does kvq.)
constexpr std::array<Range, 6> kDeepseekPunct = {{
    {0x21, 0x2F}, {0x3A, 0x7E}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E}, {0x2018, 0x201F}, {0x3000, 0x3002},
}};
bool DeepseekPunct(uint32_t cp, uint8_t) { return InRanges(kDeepseekPunct, cp); }

// [一-龥ࠀ-一가-퟿]
constexpr std::array<Range, 3> kDeepseekCjk = {{{0x4E00, 0x9FA5}, {0x0800, 0x4E00}, {0xAC00, 0xD7FF}}};
bool DeepseekCjk(uint32_t cp, uint8_t) { return InRanges(kDeepseekCjk, cp); }

using Lengths = std::vector<size_t>;  // piece lengths in characters, in order
using Stage = void (*)(const Chars& chars, size_t begin, size_t end, Lengths& out);

// The regex-iterator walk of one piece [begin, end) with one matcher.
template <Matcher kMatch>
void SplitByMatches(const Chars& chars, size_t begin, size_t end, Lengths& out) {
  const Piece piece{chars, end};
  size_t last = begin;  // end of the previous match
  for (size_t pos = begin; pos < end;) {
    const size_t n = kMatch(piece, pos);
    if (n == 0) {
      ++pos;
      continue;
    }
    if (pos > last) out.push_back(pos - last);
    out.push_back(n);
    pos += n;
    last = pos;
  }
  if (end > last) out.push_back(end - last);
}

// \s+$: the whitespace run that ends the piece, if any. (Not a matcher: trying it at every
// position of a long run that does not reach the end would take quadratic time.)
void SplitTrailingSpace(const Chars& chars, size_t begin, size_t end, Lengths& out) {
  size_t start = end;
  while (start > begin && (chars.flags[start - 1] & kWhitespaceFlag) != 0) --start;
  if (start > begin) out.push_back(start - begin);
  if (end > start) out.push_back(end - start);
}

struct StageList {
  std::array<Stage, 6> stages;
  size_t count;
};

StageList StagesFor(PreTokenizer kind) {
  switch (kind) {
    case PreTokenizer::kDefault:
      return {{SplitByMatches<MatchRun<DefaultPunct>>, SplitByMatches<MatchGpt2>,
               SplitByMatches<MatchRun<AnyNumber>>, SplitByMatches<MatchThreeDigits>},
              4};
    case PreTokenizer::kGpt2:
      return {{SplitByMatches<MatchGpt2>}, 1};
    case PreTokenizer::kLlama3:
      return {{SplitByMatches<MatchLlama3<3>>}, 1};
    case PreTokenizer::kQwen2:
      return {{SplitByMatches<MatchLlama3<1>>}, 1};
    case PreTokenizer::kFalcon:
      return {{SplitByMatches<MatchRun<FalconPunct>>, SplitByMatches<MatchGpt2>, SplitByMatches<MatchThreeDigits>},
              3};
    case PreTokenizer::kStarcoder:
      return {{SplitByMatches<MatchOne<AnyNumber>>, SplitByMatches<MatchGpt2>}, 2};
    case PreTokenizer::kTekken:
      return {{SplitByMatches<MatchTekken>}, 1};
    case PreTokenizer::kDeepseekLlm:
      return {{SplitByMatches<MatchOne<CrOrLf>>, SplitByMatches<MatchSpaceThenRun<DeepseekLetter>>,
               SplitByMatches<MatchSpaceThenRun<DeepseekPunct>>, SplitTrailingSpace,
               SplitByMatches<MatchRun<DeepseekCjk>>, SplitByMatches<MatchRun<AnyNumber>>},
              6};
  }
  return {{SplitByMatches<MatchGpt2>}, 1};
}

struct NameEntry {
  const char* name;
  PreTokenizerSpec spec;
};

// llama.cpp's tokenizer.ggml.pre values for the regexes kvq implements, with the flags llama.cpp
// sets for them. The first name of each kind is its canonical name.
constexpr NameEntry kNames[] = {
    {"default", {PreTokenizer::kDefault}},
    {"gpt-2", {PreTokenizer::kGpt2}},
    {"phi-2", {PreTokenizer::kGpt2}},
    {"mpt", {PreTokenizer::kGpt2}},
    {"olmo", {PreTokenizer::kGpt2}},
    {"jais", {PreTokenizer::kGpt2}},
    {"gigachat", {PreTokenizer::kGpt2}},
    {"exaone4", {PreTokenizer::kGpt2}},
    {"trillion", {PreTokenizer::kGpt2}},
    {"llama-bpe", {PreTokenizer::kLlama3, true, true}},
    {"llama3", {PreTokenizer::kLlama3, true, true}},
    {"llama-v3", {PreTokenizer::kLlama3, true, true}},
    {"falcon3", {PreTokenizer::kLlama3, true, true}},
    {"pixtral", {PreTokenizer::kLlama3, true, true}},
    {"dbrx", {PreTokenizer::kLlama3}},
    {"smaug-bpe", {PreTokenizer::kLlama3}},
    {"qwen2", {PreTokenizer::kQwen2}},
    {"deepseek-r1-qwen", {PreTokenizer::kQwen2}},
    {"stablelm2", {PreTokenizer::kQwen2}},
    {"megrez", {PreTokenizer::kQwen2}},
    {"falcon", {PreTokenizer::kFalcon}},
    {"starcoder", {PreTokenizer::kStarcoder}},
    {"refact", {PreTokenizer::kStarcoder}},
    {"command-r", {PreTokenizer::kStarcoder}},
    {"smollm", {PreTokenizer::kStarcoder}},
    {"codeshell", {PreTokenizer::kStarcoder}},
    {"exaone", {PreTokenizer::kStarcoder}},
    {"minerva-7b", {PreTokenizer::kStarcoder}},
    {"deepseek-llm", {PreTokenizer::kDeepseekLlm}},
    {"tekken", {PreTokenizer::kTekken, true, true}},
};

}  // namespace

std::optional<PreTokenizerSpec> FindPreTokenizer(std::string_view ggml_pre) {
  for (const NameEntry& e : kNames) {
    if (ggml_pre == e.name) return e.spec;
  }
  return std::nullopt;
}

std::string SupportedPreTokenizers() {
  std::string out;
  for (const NameEntry& e : kNames) {
    if (!out.empty()) out += ", ";
    out += e.name;
  }
  return out;
}

const char* PreTokenizerName(PreTokenizer kind) {
  for (const NameEntry& e : kNames) {
    if (e.spec.kind == kind) return e.name;
  }
  return "?";
}

std::vector<std::string_view> PreTokenize(PreTokenizer kind, std::string_view text) {
  std::vector<std::string_view> words;
  if (text.empty()) return words;
  const Chars chars = DecodeText(text, /*cases=*/kind == PreTokenizer::kTekken);
  Lengths lengths{chars.cp.size()};
  Lengths next;
  const StageList list = StagesFor(kind);
  for (size_t s = 0; s < list.count; ++s) {
    next.clear();
    size_t begin = 0;
    for (const size_t n : lengths) {
      list.stages[s](chars, begin, begin + n, next);
      begin += n;
    }
    lengths.swap(next);
  }
  words.reserve(lengths.size());
  size_t begin = 0;
  for (const size_t n : lengths) {
    const size_t from = chars.offset[begin], to = chars.offset[begin + n];
    words.push_back(text.substr(from, to - from));
    begin += n;
  }
  return words;
}

}  // namespace kvq
