// The one 64-bit checksum kvq writes into files (snapshots, page headers) and uses for model
// fingerprints: fast, not cryptographic, and guaranteed to change on any single flipped bit.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvq {

/// 64-bit checksum of `bytes` bytes at `data`, xxHash64-style. `seed` separates uses (a
/// snapshot seeds each section with its position so a section copied elsewhere fails).
uint64_t Checksum64(const void* data, size_t bytes, uint64_t seed = 0);

}  // namespace kvq
