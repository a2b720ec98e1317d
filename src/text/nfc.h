// Unicode Normalization Form C (UAX #15), for byte-level BPE vocabularies whose Hugging Face
// tokenizer.json asks for it (normalizer {"type": "NFC"}, e.g. Qwen 2/3): canonical decomposition,
// canonical ordering by combining class, canonical composition; Hangul syllables algorithmically.
// The tables are generated at build time from Debian's unicode-data package
// (scripts/gen_nfc_tables.py); NfcUnicodeVersion() says which version.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvq::unicode {

/// `text` in NFC. Valid UTF-8 is normalised; any byte that is not part of a well-formed UTF-8
/// character (stray or truncated sequences, overlong forms, surrogates, above U+10FFFF) is kept as
/// it is and, like a character with combining class 0 that composes with nothing, ends the
/// stretch that composition and reordering work within. So NormalizeNfc of valid UTF-8 equals
/// the standard's NFC, and bytes that are not UTF-8 pass through unchanged.
std::string NormalizeNfc(std::string_view text);

/// The canonical combining class of a code point (0 for starters and unassigned code points).
uint8_t CombiningClass(uint32_t code_point);

/// The Unicode version of the NFC tables, e.g. "15.0.0".
const char* NfcUnicodeVersion();

namespace detail {
struct NfcDecomposition {
  uint32_t code_point;
  uint16_t offset;  // into kDecompositionData
  uint8_t length;
};
struct NfcComposition {
  uint32_t first, second, composite;
};
// Defined in the generated nfc_tables.cc.
extern const char kNfcUnicodeVersion[];
extern const uint32_t kCombiningClasses[];  // (code point << 8) | ccc, sorted
extern const size_t kCombiningClassCount;
extern const NfcDecomposition kDecompositions[];  // sorted by code point
extern const size_t kDecompositionCount;
extern const uint32_t kDecompositionData[];
extern const NfcComposition kCompositions[];  // sorted by (first, second)
extern const size_t kCompositionCount;
}  // namespace detail

}  // namespace kvq::unicode
