// Byte sizes as users write them ("718MB", "16GiB", "4096") and as kvq prints them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kvq/status.h"

namespace kvq {

/// Parses a byte count: a whole number of bytes, optionally with a unit. Decimal units
/// (kB/KB, MB, GB, TB = 10^3k) and binary units (KiB, MiB, GiB, TiB = 2^10k) are accepted,
/// case-insensitively, with an optional "B" for plain bytes; a fractional number is allowed with a
/// unit ("1.25GiB") and rounded to the nearest byte. Zero, negative, or past 2^63 - 1 is an error.
Result<int64_t> ParseByteSize(std::string_view text);

/// "41,203,008" — thousands separators for exact counts.
std::string FormatCount(int64_t n);

/// "39.29 MiB" — a readable binary-unit figure (two decimals), or "512 B" below 1 KiB.
std::string FormatBytesIec(int64_t bytes);

/// a * b, or nullopt-like failure when the product does not fit in int64.
bool CheckedMul(int64_t a, int64_t b, int64_t* out);
bool CheckedAdd(int64_t a, int64_t b, int64_t* out);

}  // namespace kvq
