// Checksum64 (see checksum.h).
#include "base/checksum.h"

#include <bit>
#include <cstring>

namespace kvq {
namespace {

// The xxHash64 primes: odd, so every multiply below is a bijection on 64-bit words.
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ULL;

uint64_t Round(uint64_t acc, uint64_t word) { return std::rotl(acc + word * kP2, 31) * kP1; }

uint64_t LoadU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

}  // namespace

uint64_t Checksum64(const void* data, size_t bytes, uint64_t seed) {
  // xxHash64-style. Each step is a bijection of the running state for a fixed input word and of
  // the input word for a fixed state, so two inputs that differ in a single 8-byte word (any
  // single flipped bit) always hash differently, not just with high probability.
  const uint8_t* p = static_cast<const uint8_t*>(data);
  const uint8_t* const end = p + bytes;
  uint64_t h;
  if (bytes >= 32) {
    uint64_t v[4] = {seed + kP1 + kP2, seed + kP2, seed, seed - kP1};
    do {
      for (int k = 0; k < 4; ++k) v[k] = Round(v[k], LoadU64(p + 8 * k));
      p += 32;
    } while (end - p >= 32);
    h = v[0];
    for (int k = 1; k < 4; ++k) h = (h ^ Round(0, v[k])) * kP1 + kP4;
  } else {
    h = seed + kP5;
  }
  h += bytes;
  for (; end - p >= 8; p += 8) h = std::rotl(h ^ Round(0, LoadU64(p)), 27) * kP1 + kP4;
  if (p < end) {
    uint64_t tail = 0;
    std::memcpy(&tail, p, static_cast<size_t>(end - p));
    h = std::rotl(h ^ Round(0, tail), 23) * kP2 + kP3;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

}  // namespace kvq
