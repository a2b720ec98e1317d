// Shared plumbing for codec units: a codec defines how to decode one head of one row
// (DecodeHead) and these templates derive decode_row, dot and axpy from it, so every format's
// reference dot/axpy is "decode, then multiply" in one fixed order. Little-endian helpers for the
// byte layouts live here too.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "kvq/format.h"

namespace kvq::format_internal {

using DecodeHeadFn = void (*)(const uint8_t* block, int32_t row, int32_t head, float* out,
                              const CodecArgs& args);

template <DecodeHeadFn DecodeHead>
void DecodeRowVia(const uint8_t* block, int32_t row, float* out, const CodecArgs& args) {
  for (int32_t h = 0; h < args.shape.n_kv_heads; ++h) {
    DecodeHead(block, row, h, out + static_cast<int64_t>(h) * args.shape.head_dim, args);
  }
}

template <DecodeHeadFn DecodeHead>
float DotVia(const float* q, const uint8_t* block, int32_t row, int32_t head,
             const CodecArgs& args) {
  float x[kMaxHeadDim];
  DecodeHead(block, row, head, x, args);
  float sum = 0.0f;
  for (int32_t i = 0; i < args.shape.head_dim; ++i) sum += q[i] * x[i];
  return sum;
}

template <DecodeHeadFn DecodeHead>
void AxpyVia(float w, const uint8_t* block, int32_t row, int32_t head, float* acc,
             const CodecArgs& args) {
  float x[kMaxHeadDim];
  DecodeHead(block, row, head, x, args);
  for (int32_t i = 0; i < args.shape.head_dim; ++i) acc[i] += w * x[i];
}

inline uint16_t LoadU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline void StoreU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
inline float LoadF32(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, 4);  // kvq targets little-endian hosts (x86-64, arm64)
  return f;
}
inline void StoreF32(uint8_t* p, float f) { std::memcpy(p, &f, 4); }

/// b-bit codes packed little-endian within each byte: element i sits at bits
/// (i % (8/b)) * b of byte i / (8/b). For b = 4: element 2j in the low nibble of byte j.
inline uint32_t UnpackCode(const uint8_t* packed, int32_t i, int32_t bits) {
  if (bits == 8) return packed[i];
  const int32_t per_byte = 8 / bits;
  return (packed[i / per_byte] >> ((i % per_byte) * bits)) & ((1u << bits) - 1u);
}
inline void PackCode(uint8_t* packed, int32_t i, int32_t bits, uint32_t code) {
  if (bits == 8) {
    packed[i] = static_cast<uint8_t>(code);
    return;
  }
  const int32_t per_byte = 8 / bits;
  const int32_t shift = (i % per_byte) * bits;
  uint8_t& byte = packed[i / per_byte];
  byte = static_cast<uint8_t>((byte & ~(((1u << bits) - 1u) << shift)) | (code << shift));
}

/// std::fmax(amax, |x|) for amax ≥ 0 (not NaN), written out: a NaN x is passed over, as fmax
/// does, without a libm call per number (encoders run it on every element they write).
inline float MaxAbsStep(float amax, float x) {
  const float ax = std::fabs(x);  // inline (a bit mask); a NaN stays NaN and fails the comparison
  return ax > amax ? ax : amax;
}
/// std::fmin(std::fmax(v, 0), hi) for a code's float value, written out: a NaN v gives 0, as the
/// libm pair does (fmax passes the NaN over), without two libm calls per element.
inline float ClampCode(float v, float hi) {
  const float lo = v > 0.0f ? v : 0.0f;
  return lo < hi ? lo : hi;
}

/// "" when head_dim * bits fills whole bytes per head, else the rule.
inline std::string RequireWholeBytesPerHead(RowShape shape, int32_t bits) {
  if ((static_cast<int64_t>(shape.head_dim) * bits) % 8 != 0) {
    return "head_dim must be a multiple of " + std::to_string(8 / bits) +
           " (packed " + std::to_string(bits) + "-bit codes fill whole bytes per head)";
  }
  return "";
}

}  // namespace kvq::format_internal
