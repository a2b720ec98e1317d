// Unicode lookups over the generated tables (see unicode.h).
#include "text/unicode.h"

#include <algorithm>
#include <array>

namespace kvq::unicode {

Decoded DecodeUtf8(std::string_view text, size_t at) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const auto continuation = [&](size_t i) { return i < text.size() && (byte(i) & 0xC0) == 0x80; };
  const uint8_t lead = byte(at);
  const Decoded invalid{kReplacementCharacter, 1};
  if (lead < 0x80) return {lead, 1};
  if ((lead & 0x40) == 0) return invalid;  // a continuation byte with no lead
  if ((lead & 0x20) == 0) {
    if (!continuation(at + 1)) return invalid;
    return {(static_cast<uint32_t>(lead & 0x1F) << 6) | (byte(at + 1) & 0x3F), 2};
  }
  if ((lead & 0x10) == 0) {
    if (!continuation(at + 1) || !continuation(at + 2)) return invalid;
    return {(static_cast<uint32_t>(lead & 0x0F) << 12) | (static_cast<uint32_t>(byte(at + 1) & 0x3F) << 6) |
                (byte(at + 2) & 0x3F),
            3};
  }
  if ((lead & 0x08) == 0) {
    if (!continuation(at + 1) || !continuation(at + 2) || !continuation(at + 3)) return invalid;
    const uint32_t cp = (static_cast<uint32_t>(lead & 0x07) << 18) |
                        (static_cast<uint32_t>(byte(at + 1) & 0x3F) << 12) |
                        (static_cast<uint32_t>(byte(at + 2) & 0x3F) << 6) | (byte(at + 3) & 0x3F);
    if (cp > 0x10FFFF) return invalid;
    return {cp, 4};
  }
  return invalid;  // 0xF8..0xFF never start a character
}

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

LetterCase GetLetterCase(uint32_t cp) {
  if (cp > 0x10FFFF) return LetterCase::kNone;
  const uint32_t* end = detail::kLetterCaseRanges + detail::kLetterCaseRangeCount;
  // The last run whose first code point is <= cp: (cp << 2) | 3 sorts after every run starting at
  // cp.
  const uint32_t* run = std::upper_bound(detail::kLetterCaseRanges, end, (cp << 2) | 3) - 1;
  return static_cast<LetterCase>(*run & 3);
}

Category GetCategory(uint32_t cp) {
  // ASCII is most of most text: answer it from a small table built once from the ranges.
  static const auto ascii = [] {
    std::array<Category, 128> t{};
    for (uint32_t c = 0; c < 128; ++c) {
      const uint32_t* end = detail::kCategoryRanges + detail::kCategoryRangeCount;
      t[c] = static_cast<Category>(*(std::upper_bound(detail::kCategoryRanges, end, (c << 3) | 7) - 1) & 7);
    }
    return t;
  }();
  if (cp < 128) return ascii[cp];
  if (cp > 0x10FFFF) return Category::kUndefined;
  const uint32_t* end = detail::kCategoryRanges + detail::kCategoryRangeCount;
  // The last run whose first code point is <= cp: (cp << 3) | 7 sorts after every run starting at cp.
  const uint32_t* run = std::upper_bound(detail::kCategoryRanges, end, (cp << 3) | 7) - 1;
  return static_cast<Category>(*run & 7);
}

bool IsWhitespace(uint32_t cp) {
  if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20;
  return std::binary_search(detail::kWhitespace, detail::kWhitespace + detail::kWhitespaceCount, cp);
}

const char* UnicodeVersion() { return detail::kUnicodeVersion; }

}  // namespace kvq::unicode
