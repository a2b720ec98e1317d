// InterleaveKQuantBlock and GatherKQuantBlock (see kquant_repack.h): the byte moves between the
// file's Q2_K / Q3_K / Q4_K / Q5_K / Q6_K super-blocks and a 16-row group's super-block, in plain C++ (a load-time
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

// Q6_K group layout: the byte of row j holding element e's code (shifted left by 2) and, for
// the last 4 elements of each sub-block of 16, the bytes holding its bit pairs.
int64_t Q6CodeByte(int64_t j, int e) {
  const int s = e / 16, v = (e % 16) / 4, i = e % 4;  // sub-block, vector, element in the chunk
  return kQ6_KGroupScaleBytes + (3 * s + v) * kVector + 4 * j + i;
}

// Q3_K (q3_k.h): u = code + 4 of element e of a plain block (its low 2 bits in qs, bit 2 in
// hmask), and writing it back.
int Q3U(const uint8_t* block, int e) {
  const int h = e / 128, k = (e % 128) / 32, l = e % 32;
  return ((block[32 + 32 * h + l] >> (2 * k)) & 3) | ((block[l] >> (4 * h + k)) & 1) << 2;
}

void Q3SetU(uint8_t* block, int e, int u) {
  const int h = e / 128, k = (e % 128) / 32, l = e % 32;
  block[32 + 32 * h + l] |= static_cast<uint8_t>((u & 3) << (2 * k));
  block[l] |= static_cast<uint8_t>((u >> 2) << (4 * h + k));
}

// Q3_K group layout: the byte of row j holding u of element e in bits 0-2 (sub-block 2b) or 3-5
// (2b+1), for the chunks v = 0..2 of each sub-block.
int64_t Q3CodeByte(int64_t j, int e) {
  const int b = e / 32, v = (e % 16) / 4, i = e % 4;
  return kQ3_KGroupScaleBytes + (3 * b + v) * kVector + 4 * j + i;
}

void InterleaveQ3_K(const uint8_t* rows, int64_t row_bytes, int64_t sb, uint8_t* out) {
  for (int64_t j = 0; j < kRows; ++j) {
    const uint8_t* src = rows + j * row_bytes + sb * 110;
    std::memcpy(out + 2 * j, src + 108, 2);  // d
    for (int64_t v = 0; v < 3; ++v) std::memcpy(out + 32 + v * kVector + 4 * j, src + 96 + 4 * v, 4);
    for (int b = 0; b < 8; ++b) {
      for (int i = 0; i < 4; ++i) {
        const int u3 = Q3U(src, 32 * b + 12 + i), u7 = Q3U(src, 32 * b + 28 + i);  // the chunks 3
        const int top[3] = {u3 & 3, u7 & 3, (u3 >> 2) | (u7 >> 2) << 1};            // bits 6-7
        for (int v = 0; v < 3; ++v) {
          const int e = 32 * b + 4 * v + i;
          out[Q3CodeByte(j, e)] = static_cast<uint8_t>(Q3U(src, e) | Q3U(src, e + 16) << 3 | top[v] << 6);
        }
      }
    }
  }
}

void GatherQ3_K(const uint8_t* group_block, int64_t j, uint8_t* out) {
  std::memset(out, 0, 96);
  std::memcpy(out + 108, group_block + 2 * j, 2);
  for (int64_t v = 0; v < 3; ++v) std::memcpy(out + 96 + 4 * v, group_block + 32 + v * kVector + 4 * j, 4);
  for (int b = 0; b < 8; ++b) {
    for (int i = 0; i < 4; ++i) {
      const int e0 = 32 * b + i;
      int top[3];  // bits 6-7 of the 3 vectors' bytes
      for (int v = 0; v < 3; ++v) {
        const int byte = group_block[Q3CodeByte(j, e0 + 4 * v)];
        Q3SetU(out, e0 + 4 * v, byte & 7);
        Q3SetU(out, e0 + 16 + 4 * v, (byte >> 3) & 7);
        top[v] = byte >> 6;
      }
      Q3SetU(out, e0 + 12, top[0] | (top[2] & 1) << 2);
      Q3SetU(out, e0 + 28, top[1] | (top[2] >> 1) << 2);
    }
  }
}

// Q2_K (q2_k.h): the byte of a plain block holding element e's code, and its shift; the byte of
// row j in a group's super-block holding it, and its shift.
int64_t Q2PlainByte(int e) { return 16 + 32 * (e / 128) + e % 32; }
int Q2PlainShift(int e) { return 2 * ((e % 128) / 32); }
int64_t Q2GroupByte(int64_t j, int e) {
  const int s = e / 16, c = (e % 16) / 4, i = e % 4;
  return kQ2_KGroupScaleBytes + (4 * (s / 4) + c) * kVector + 4 * j + i;
}
int Q2GroupShift(int e) { return 2 * ((e / 16) % 4); }

void InterleaveQ2_K(const uint8_t* rows, int64_t row_bytes, int64_t sb, uint8_t* out) {
  for (int64_t j = 0; j < kRows; ++j) {
    const uint8_t* src = rows + j * row_bytes + sb * 84;
    std::memcpy(out + 2 * j, src + 80, 2);       // d
    std::memcpy(out + 32 + 2 * j, src + 82, 2);  // dmin
    for (int64_t p = 0; p < 4; ++p) std::memcpy(out + kQ2_KGroupScalesAt + p * kVector + 4 * j, src + 4 * p, 4);
    for (int e = 0; e < 256; ++e) out[Q2GroupByte(j, e)] = 0;
    for (int e = 0; e < 256; ++e) {
      const int code = (src[Q2PlainByte(e)] >> Q2PlainShift(e)) & 3;
      out[Q2GroupByte(j, e)] |= static_cast<uint8_t>(code << Q2GroupShift(e));
    }
  }
}

void GatherQ2_K(const uint8_t* group_block, int64_t j, uint8_t* out) {
  std::memset(out, 0, 84);
  std::memcpy(out + 80, group_block + 2 * j, 2);
  std::memcpy(out + 82, group_block + 32 + 2 * j, 2);
  for (int64_t p = 0; p < 4; ++p) std::memcpy(out + 4 * p, group_block + kQ2_KGroupScalesAt + p * kVector + 4 * j, 4);
  for (int e = 0; e < 256; ++e) {
    const int code = (group_block[Q2GroupByte(j, e)] >> Q2GroupShift(e)) & 3;
    out[Q2PlainByte(e)] |= static_cast<uint8_t>(code << Q2PlainShift(e));
  }
}

}  // namespace

bool IsInterleavedKQuant(WeightType type) {
  return type == WeightType::kQ2_K || type == WeightType::kQ3_K || type == WeightType::kQ4_K || type == WeightType::kQ5_K ||
         type == WeightType::kQ6_K;
}

void InterleaveKQuantBlock(WeightType type, const uint8_t* rows, int64_t row_bytes, int64_t sb, uint8_t* out) {
  if (type == WeightType::kQ2_K) return InterleaveQ2_K(rows, row_bytes, sb, out);
  if (type == WeightType::kQ3_K) return InterleaveQ3_K(rows, row_bytes, sb, out);
  if (type == WeightType::kQ4_K || type == WeightType::kQ5_K) {
    const bool q5 = type == WeightType::kQ5_K;
    const int64_t bb = q5 ? 176 : 144, qs_at = q5 ? 48 : 16;  // the plain block's size and codes
    const int64_t codes_at = q5 ? kQ5_KGroupScaleBytes : kQ4_KGroupScaleBytes;
    for (int64_t j = 0; j < kRows; ++j) {
      const uint8_t* src = rows + j * row_bytes + sb * bb;
      std::memcpy(out + 2 * j, src, 2);           // d
      std::memcpy(out + 32 + 2 * j, src + 2, 2);  // dmin
      for (int64_t v = 0; v < 3; ++v) std::memcpy(out + 64 + v * kVector + 4 * j, src + 4 + 4 * v, 4);
      for (int64_t k = 0; q5 && k < 8; ++k) {
        std::memcpy(out + kQ5_KGroupHighBitsAt + k * kVector + 4 * j, src + 16 + 4 * k, 4);  // qh
      }
      for (int64_t n = 0; n < 32; ++n) std::memcpy(out + codes_at + n * kVector + 4 * j, src + qs_at + 4 * n, 4);
    }
    return;
  }
  for (int64_t j = 0; j < kRows; ++j) {
    const uint8_t* src = rows + j * row_bytes + sb * 210;
    std::memcpy(out + 2 * j, src + 208, 2);  // d
    for (int64_t s = 0; s < 16; ++s) out[kQ6_KGroupScalesAt + 16 * s + j] = src[192 + s];
    uint8_t code[256];  // [element] the 6-bit codes
    for (int e = 0; e < 256; ++e) code[e] = static_cast<uint8_t>(Q6Code(src, e));
    for (int s = 0; s < 16; ++s) {
      const uint8_t* c = code + 16 * s;  // the sub-block's codes; c[12..15] give the bit pairs
      for (int v = 0; v < 3; ++v) {
        uint8_t* at = out + kQ6_KGroupScaleBytes + (3 * s + v) * kVector + 4 * j;
        for (int i = 0; i < 4; ++i) at[i] = static_cast<uint8_t>(c[4 * v + i] << 2 | ((c[12 + i] >> (2 * v)) & 3));
      }
    }
  }
}

void GatherKQuantBlock(WeightType type, const uint8_t* group_block, int64_t j, uint8_t* out) {
  if (type == WeightType::kQ2_K) return GatherQ2_K(group_block, j, out);
  if (type == WeightType::kQ3_K) return GatherQ3_K(group_block, j, out);
  if (type == WeightType::kQ4_K || type == WeightType::kQ5_K) {
    const bool q5 = type == WeightType::kQ5_K;
    const int64_t qs_at = q5 ? 48 : 16, codes_at = q5 ? kQ5_KGroupScaleBytes : kQ4_KGroupScaleBytes;
    std::memcpy(out, group_block + 2 * j, 2);
    std::memcpy(out + 2, group_block + 32 + 2 * j, 2);
    for (int64_t v = 0; v < 3; ++v) std::memcpy(out + 4 + 4 * v, group_block + 64 + v * kVector + 4 * j, 4);
    for (int64_t k = 0; q5 && k < 8; ++k) {
      std::memcpy(out + 16 + 4 * k, group_block + kQ5_KGroupHighBitsAt + k * kVector + 4 * j, 4);
    }
    for (int64_t n = 0; n < 32; ++n) std::memcpy(out + qs_at + 4 * n, group_block + codes_at + n * kVector + 4 * j, 4);
    return;
  }
  std::memset(out, 0, 192);
  std::memcpy(out + 208, group_block + 2 * j, 2);
  for (int64_t s = 0; s < 16; ++s) out[192 + s] = group_block[kQ6_KGroupScalesAt + 16 * s + j];
  for (int e = 0; e < 256; ++e) {
    const int v = (e % 16) / 4;
    int code = 0;
    if (v < 3) {
      code = group_block[Q6CodeByte(j, e)] >> 2;
    } else {
      for (int w = 0; w < 3; ++w) code |= (group_block[Q6CodeByte(j, e - 12 + 4 * w)] & 3) << (2 * w);
    }
    Q6SetCode(out, e, code);
  }
}

}  // namespace kvq
