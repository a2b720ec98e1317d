// InterleaveKQuantBlock and GatherKQuantBlock (see kquant_repack.h): the byte moves between the
// file's Q4_K / Q6_K super-blocks and a 16-row group's super-block, in plain C++ (a load-time
// pass, and the oracle's view of a repacked matrix).
#include "weights/kquant_repack.h"

#include <cstring>

namespace kvq {
namespace {

constexpr int64_t kRows = 16;
constexpr int64_t kVector = 64;  // bytes of one vector: 4 per row

// Q6_K (q6_k.h): the 6-bit code of element e of a plain block, and writing it back.
int Q6Code(const uint8_t* block, int e) {
  const int h = e / 128, k = (e % 128) / 32, l = e % 32;
  const int low = (block[64 * h + 32 * (k % 2) + l] >> (k < 2 ? 0 : 4)) & 15;
  const int high = (block[128 + 32 * h + l] >> (2 * k)) & 3;
  return low | high << 4;
}

void Q6SetCode(uint8_t* block, int e, int code) {
  const int h = e / 128, k = (e % 128) / 32, l = e % 32;
  block[64 * h + 32 * (k % 2) + l] |= static_cast<uint8_t>((code & 15) << (k < 2 ? 0 : 4));
  block[128 + 32 * h + l] |= static_cast<uint8_t>((code >> 4) << (2 * k));
}

// Q6_K group layout: where element e of row j has its low 4 bits (byte, shift) and its high 2 bits.
struct Q6Place {
  int64_t low_byte, low_shift, high_byte, high_shift;
};

Q6Place Q6Where(int64_t j, int e) {
  const int p = e / 64, r = e % 64;       // 64-element part, element within it
  const int ch = r / 4, i = r % 4;         // chunk of 4 (0..15), element within it
  const int k = ch % 8, nib = ch / 8;      // code vector, nibble
  const int h = ch % 4, t = ch / 4;        // high-bit vector, bit pair
  return {.low_byte = kQ6_KGroupScaleBytes + (8 * p + k) * kVector + 4 * j + i,
          .low_shift = 4 * nib,
          .high_byte = kQ6_KGroupHighAt + (4 * p + h) * kVector + 4 * j + i,
          .high_shift = 2 * t};
}

}  // namespace

bool IsInterleavedKQuant(WeightType type) { return type == WeightType::kQ4_K || type == WeightType::kQ6_K; }

void InterleaveKQuantBlock(WeightType type, const uint8_t* rows, int64_t row_bytes, int64_t sb, uint8_t* out) {
  if (type == WeightType::kQ4_K) {
    for (int64_t j = 0; j < kRows; ++j) {
      const uint8_t* src = rows + j * row_bytes + sb * 144;
      std::memcpy(out + 2 * j, src, 2);           // d
      std::memcpy(out + 32 + 2 * j, src + 2, 2);  // dmin
      for (int64_t v = 0; v < 3; ++v) std::memcpy(out + 64 + v * kVector + 4 * j, src + 4 + 4 * v, 4);
      for (int64_t n = 0; n < 32; ++n) std::memcpy(out + 256 + n * kVector + 4 * j, src + 16 + 4 * n, 4);
    }
    return;
  }
  for (int64_t j = 0; j < kRows; ++j) {
    const uint8_t* src = rows + j * row_bytes + sb * 210;
    std::memcpy(out + 2 * j, src + 208, 2);  // d
    for (int64_t v = 0; v < 4; ++v) std::memcpy(out + 32 + v * kVector + 4 * j, src + 192 + 4 * v, 4);
    uint8_t code[256];  // [element] the 6-bit codes
    for (int e = 0; e < 256; ++e) code[e] = static_cast<uint8_t>(Q6Code(src, e));
    // Q6Where's places, written a byte at a time.
    for (int p = 0; p < 4; ++p) {
      const uint8_t* c = code + 64 * p;
      for (int i = 0; i < 4; ++i) {
        for (int k = 0; k < 8; ++k) {
          out[kQ6_KGroupScaleBytes + (8 * p + k) * kVector + 4 * j + i] =
              static_cast<uint8_t>((c[4 * k + i] & 15) | (c[32 + 4 * k + i] & 15) << 4);
        }
        for (int h = 0; h < 4; ++h) {
          int high = 0;
          for (int t = 0; t < 4; ++t) high |= (c[4 * (4 * t + h) + i] >> 4) << (2 * t);
          out[kQ6_KGroupHighAt + (4 * p + h) * kVector + 4 * j + i] = static_cast<uint8_t>(high);
        }
      }
    }
  }
}

void GatherKQuantBlock(WeightType type, const uint8_t* group_block, int64_t j, uint8_t* out) {
  if (type == WeightType::kQ4_K) {
    std::memcpy(out, group_block + 2 * j, 2);
    std::memcpy(out + 2, group_block + 32 + 2 * j, 2);
    for (int64_t v = 0; v < 3; ++v) std::memcpy(out + 4 + 4 * v, group_block + 64 + v * kVector + 4 * j, 4);
    for (int64_t n = 0; n < 32; ++n) std::memcpy(out + 16 + 4 * n, group_block + 256 + n * kVector + 4 * j, 4);
    return;
  }
  std::memset(out, 0, 192);
  std::memcpy(out + 208, group_block + 2 * j, 2);
  for (int64_t v = 0; v < 4; ++v) std::memcpy(out + 192 + 4 * v, group_block + 32 + v * kVector + 4 * j, 4);
  for (int e = 0; e < 256; ++e) {
    const Q6Place at = Q6Where(j, e);
    const int code = ((group_block[at.low_byte] >> at.low_shift) & 15) |
                     ((group_block[at.high_byte] >> at.high_shift) & 3) << 4;
    Q6SetCode(out, e, code);
  }
}

}  // namespace kvq
