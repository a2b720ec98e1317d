// NFC (see nfc.h): the text is cut into stretches of well-formed UTF-8; each stretch is fully
// decomposed (tables + Hangul arithmetic), every run of non-starters is sorted by combining class
// (stable, so equal classes keep their order), and the result is composed left to right: a
// character combines with the last starter when nothing between them blocks it (UAX #15 D115-D117).
#include "text/nfc.h"

#include <algorithm>
#include <vector>

#include "text/unicode.h"

namespace kvq::unicode {
namespace {

// Hangul syllable arithmetic (Unicode §3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr uint32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

/// The well-formed UTF-8 character at text[at], or n_bytes 0 when the bytes there are not one.
Decoded DecodeStrict(std::string_view text, size_t at) {
  const Decoded d = DecodeUtf8(text, at);
  // DecodeUtf8 accepts overlong forms and surrogates and turns a bad byte into U+FFFD taking
  // one byte; a character is well formed when its shortest encoding is the length it took.
  if (d.code_point >= 0xD800 && d.code_point <= 0xDFFF) return {0, 0};
  const uint32_t shortest = d.code_point < 0x80 ? 1 : d.code_point < 0x800 ? 2 : d.code_point < 0x10000 ? 3 : 4;
  if (shortest != d.n_bytes) return {0, 0};
  return d;
}

void Decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const auto* end = detail::kDecompositions + detail::kDecompositionCount;
  const auto* it = std::lower_bound(detail::kDecompositions, end, cp,
                                    [](const detail::NfcDecomposition& d, uint32_t c) { return d.code_point < c; });
  if (it == end || it->code_point != cp) {
    out.push_back(cp);
    return;
  }
  out.insert(out.end(), detail::kDecompositionData + it->offset,
             detail::kDecompositionData + it->offset + it->length);
}

/// The primary composite of (first, second), or 0 when there is none.
uint32_t Compose(uint32_t first, uint32_t second) {
  if (first >= kLBase && first < kLBase + kLCount && second >= kVBase && second < kVBase + kVCount) {
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  }
  if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 && second > kTBase &&
      second < kTBase + kTCount) {
    return first + (second - kTBase);
  }
  const auto* end = detail::kCompositions + detail::kCompositionCount;
  const auto* it = std::lower_bound(detail::kCompositions, end, std::pair{first, second},
                                    [](const detail::NfcComposition& c, std::pair<uint32_t, uint32_t> key) {
                                      return std::pair{c.first, c.second} < key;
                                    });
  return it != end && it->first == first && it->second == second ? it->composite : 0;
}

/// Appends the NFC of one stretch of code points (well-formed text between bad bytes).
void NormalizeStretch(const std::vector<uint32_t>& cps, std::string& out) {
  std::vector<uint32_t> d;  // [n] the full canonical decomposition
  d.reserve(cps.size() + 8);
  for (const uint32_t cp : cps) Decompose(cp, d);
  // Canonical ordering: a stable sort of every run of non-starters by combining class.
  for (size_t i = 0; i < d.size();) {
    if (CombiningClass(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && CombiningClass(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + static_cast<std::ptrdiff_t>(i), d.begin() + static_cast<std::ptrdiff_t>(j),
                     [](uint32_t a, uint32_t b) { return CombiningClass(a) < CombiningClass(b); });
    i = j;
  }
  // Canonical composition. Every starter left uncomposed becomes the new last starter, so a
  // character is unblocked exactly when it follows the starter directly, or the character before
  // it (a non-starter, after ordering) has a lower, non-zero class.
  std::vector<uint32_t> c;  // [<= n] the composed sequence
  c.reserve(d.size());
  ptrdiff_t starter = -1;
  for (const uint32_t cp : d) {
    const uint8_t ccc = CombiningClass(cp);
    if (starter >= 0) {
      const uint8_t last = CombiningClass(c.back());
      const bool adjacent = static_cast<ptrdiff_t>(c.size()) - 1 == starter;
      if (adjacent || (last != 0 && last < ccc)) {
        if (const uint32_t composite = Compose(c[static_cast<size_t>(starter)], cp); composite != 0) {
          c[static_cast<size_t>(starter)] = composite;
          continue;
        }
      }
    }
    if (ccc == 0) starter = static_cast<ptrdiff_t>(c.size());
    c.push_back(cp);
  }
  for (const uint32_t cp : c) AppendUtf8(cp, out);
}

}  // namespace

uint8_t CombiningClass(uint32_t code_point) {
  const uint32_t* end = detail::kCombiningClasses + detail::kCombiningClassCount;
  const uint32_t* it = std::lower_bound(detail::kCombiningClasses, end, code_point << 8);
  if (it == end || (*it >> 8) != code_point) return 0;
  return static_cast<uint8_t>(*it & 0xFF);
}

std::string NormalizeNfc(std::string_view text) {
  // Fast path: ASCII is its own NFC.
  if (std::all_of(text.begin(), text.end(), [](char ch) { return static_cast<uint8_t>(ch) < 0x80; })) {
    return std::string(text);
  }
  std::string out;
  out.reserve(text.size());
  std::vector<uint32_t> stretch;  // [characters] well-formed code points since the last bad byte
  for (size_t at = 0; at < text.size();) {
    const Decoded d = DecodeStrict(text, at);
    if (d.n_bytes == 0) {
      NormalizeStretch(stretch, out);
      stretch.clear();
      out.push_back(text[at]);
      ++at;
      continue;
    }
    stretch.push_back(d.code_point);
    at += d.n_bytes;
  }
  NormalizeStretch(stretch, out);
  return out;
}

const char* NfcUnicodeVersion() { return detail::kNfcUnicodeVersion; }

}  // namespace kvq::unicode
