// KIVI codecs (formula and layout in kivi.h): keys per channel over a group, values per token.
#include "formats/kivi/kivi.h"

#include <cmath>

#include "base/float_codes.h"
#include "formats/codec_helpers.h"

namespace kvq {
namespace {
using namespace format_internal;

// The min and max of a channel or head, as every target must find them: a NaN operand gives the
// other one, and of two equal numbers (+0 and −0) the first is kept. Not std::fmin/fmax: which of
// two equal zeros they return is the C library's choice (glibc returns the second operand, musl —
// the WebAssembly module's — prefers −0), and g++ swaps their operands (it treats them as
// commutative), so z's sign bit, and the master's bytes, depended on the compiler and the library.
// web/gpu/kv_formats.js's fmin_bits/fmax_bits are these two.
inline float MinKeepFirst(float lo, float x) { return x < lo || std::isnan(lo) ? x : lo; }
inline float MaxKeepFirst(float hi, float x) { return x > hi || std::isnan(hi) ? x : hi; }

uint16_t F16Saturated(float f) {
  uint16_t h = F32ToF16(f);
  if ((h & 0x7FFF) >= 0x7C00) h = (h & 0x8000) | 0x7BFF;  // ±inf -> ±65504 (inputs are finite)
  return h;
}

template <int kBits>
struct Asym {
  static constexpr float kRawMax = static_cast<float>((1 << kBits) - 1);

  // Quantisation parameters for numbers in [lo, hi].
  static void Params(float lo, float hi, uint16_t* s16, uint16_t* z16) {
    *z16 = F16Saturated(lo);
    *s16 = F16Saturated((hi - F16ToF32(*z16)) / kRawMax);
  }
  static uint32_t Code(float x, float s, float z) {
    if (s == 0.0f) return 0;
    return static_cast<uint32_t>(ClampCode(RoundHalfEven((x - z) / s), kRawMax));
  }
  static float Value(uint32_t raw, float s, float z) { return static_cast<float>(raw) * s + z; }
  // |x − x'| ≤ s/2 + |min − z| + R·|t − s| + saturation, where t = (max − z)/R is the exact step:
  // rounding moves (x − z)/s by at most half; x ≥ min and z is min rounded to f16 (half an f16
  // ulp: 2^-11 relative, 2^-25 among subnormals), so the clamp at 0 costs at most |min − z|; at
  // the top, raw ≤ R reaches z + R·s, short of max by R·|t − s| ≤ R·max(2^-10·s, 2^-25) (f16
  // rounding of t, which also covers s = 0). Values past ±65504 clamp to the saturated z or s.
  // (|x| + |z|)·2^-22 covers the f32 subtraction and division.
  static float Bound(float x, float s, float z) {
    return 0.5f * s + std::fmax(std::fabs(z) * 0x1p-11f, 0x1p-25f) +
           kRawMax * std::fmax(s * 0x1p-10f, 0x1p-25f) + std::fmax(std::fabs(x) - kF16Max, 0.0f) +
           (std::fabs(x) + std::fabs(z)) * 0x1p-22f;
  }
};

// ---- keys: per channel, groups of G rows ----
template <int kBits>
struct KiviKeys {
  using Q = Asym<kBits>;
  static constexpr int32_t kG = kKiviGroupRows;
  static int64_t RowCodeBytes(RowShape s) { return static_cast<int64_t>(s.head_dim) * kBits / 8; }
  static int64_t HeadBytes(RowShape s) { return 4LL * s.head_dim + kG * RowCodeBytes(s); }
  static int64_t BlockBytes(RowShape s) { return s.n_kv_heads * HeadBytes(s); }
  static std::string CheckShape(RowShape s) {
    if (s.head_dim % 8 != 0) {
      return "head_dim must be a multiple of 8 (whole bytes of codes and of per-channel scales "
             "per position)";
    }
    return "";
  }

  static void DecodeHead(const uint8_t* block, int32_t row, int32_t head, float* out,
                         const CodecArgs& a) {
    const int32_t d = a.shape.head_dim;
    const uint8_t* p = block + head * HeadBytes(a.shape);
    const uint8_t* codes = p + 4LL * d + row * RowCodeBytes(a.shape);
    for (int32_t i = 0; i < d; ++i) {
      const float s = F16ToF32(LoadU16(p + 2 * i));
      const float z = F16ToF32(LoadU16(p + 2 * (d + i)));
      out[i] = Q::Value(UnpackCode(codes, i, kBits), s, z);
    }
  }

  static float ErrorBound(float x, const uint8_t* block, int32_t, int32_t head, int32_t i,
                          const CodecArgs& a) {
    const uint8_t* p = block + head * HeadBytes(a.shape);
    return Q::Bound(x, F16ToF32(LoadU16(p + 2 * i)), F16ToF32(LoadU16(p + 2 * (a.shape.head_dim + i))));
  }

  static void Encode(const float* rows, uint8_t* block, const CodecArgs& a) {
    const int32_t d = a.shape.head_dim;
    const int64_t row_elems = a.shape.elems();
    for (int32_t h = 0; h < a.shape.n_kv_heads; ++h) {
      uint8_t* p = block + h * HeadBytes(a.shape);
      for (int32_t i = 0; i < d; ++i) {
        const float* x = rows + static_cast<int64_t>(h) * d + i;  // channel i, stride row_elems
        float lo = x[0], hi = x[0];
        for (int32_t r = 1; r < kG; ++r) {
          lo = MinKeepFirst(lo, x[r * row_elems]);
          hi = MaxKeepFirst(hi, x[r * row_elems]);
        }
        uint16_t s16, z16;
        Q::Params(lo, hi, &s16, &z16);
        StoreU16(p + 2 * i, s16);
        StoreU16(p + 2 * (d + i), z16);
        const float s = F16ToF32(s16), z = F16ToF32(z16);
        for (int32_t r = 0; r < kG; ++r) {
          PackCode(p + 4LL * d + r * RowCodeBytes(a.shape), i, kBits, Q::Code(x[r * row_elems], s, z));
        }
      }
    }
  }

  static constexpr Codec kCodec = {
      .element = kBits == 4 ? "int4 asymmetric" : "int2 asymmetric",
      .scale = "f16 scale + f16 min per channel per group of 32 tokens; residual rows f32",
      .layout = "per head: [f16 s x head_dim][f16 z x head_dim][32 rows of codes]",
      .element_bits = kBits, .rows_per_block = kG, .calibrated = false,
      .check_shape = CheckShape, .block_bytes = BlockBytes, .encode_block = Encode,
      .decode_row = DecodeRowVia<DecodeHead>, .dot = DotVia<DecodeHead>,
      .axpy = AxpyVia<DecodeHead>, .calibrate = nullptr, .error_bound = ErrorBound,
      .kernels = kBits == 4 ? Int4KiviKeyKernels : Int2KiviKeyKernels,
  };
};

// ---- values: per token ----
template <int kBits>
struct KiviValues {
  using Q = Asym<kBits>;
  static int64_t HeadBytes(RowShape s) { return 4 + static_cast<int64_t>(s.head_dim) * kBits / 8; }
  static int64_t BlockBytes(RowShape s) { return s.n_kv_heads * HeadBytes(s); }
  static std::string CheckShape(RowShape s) { return KiviKeys<kBits>::CheckShape(s); }

  static void DecodeHead(const uint8_t* block, int32_t, int32_t head, float* out,
                         const CodecArgs& a) {
    const uint8_t* p = block + head * HeadBytes(a.shape);
    const float s = F16ToF32(LoadU16(p)), z = F16ToF32(LoadU16(p + 2));
    for (int32_t i = 0; i < a.shape.head_dim; ++i) out[i] = Q::Value(UnpackCode(p + 4, i, kBits), s, z);
  }

  static float ErrorBound(float x, const uint8_t* block, int32_t, int32_t head, int32_t,
                          const CodecArgs& a) {
    const uint8_t* p = block + head * HeadBytes(a.shape);
    return Q::Bound(x, F16ToF32(LoadU16(p)), F16ToF32(LoadU16(p + 2)));
  }

  static void Encode(const float* rows, uint8_t* block, const CodecArgs& a) {
    const int32_t d = a.shape.head_dim;
    for (int32_t h = 0; h < a.shape.n_kv_heads; ++h) {
      const float* x = rows + static_cast<int64_t>(h) * d;
      uint8_t* p = block + h * HeadBytes(a.shape);
      float lo = x[0], hi = x[0];
      for (int32_t i = 1; i < d; ++i) {
        lo = MinKeepFirst(lo, x[i]);
        hi = MaxKeepFirst(hi, x[i]);
      }
      uint16_t s16, z16;
      Q::Params(lo, hi, &s16, &z16);
      StoreU16(p, s16);
      StoreU16(p + 2, z16);
      const float s = F16ToF32(s16), z = F16ToF32(z16);
      for (int32_t i = 0; i < d; ++i) PackCode(p + 4, i, kBits, Q::Code(x[i], s, z));
    }
  }

  static constexpr Codec kCodec = {
      .element = kBits == 4 ? "int4 asymmetric" : "int2 asymmetric",
      .scale = "f16 scale + f16 min per head row",
      .layout = "per head: [f16 s][f16 z][codes]",
      .element_bits = kBits, .rows_per_block = 1, .calibrated = false,
      .check_shape = CheckShape, .block_bytes = BlockBytes, .encode_block = Encode,
      .decode_row = DecodeRowVia<DecodeHead>, .dot = DotVia<DecodeHead>,
      .axpy = AxpyVia<DecodeHead>, .calibrate = nullptr, .error_bound = ErrorBound,
      .kernels = kBits == 4 ? Int4KiviValueKernels : Int2KiviValueKernels,
  };
};

constexpr const char* kKiviNote =
    "a per-token figure understates KIVI: the exact cost is keys b + 32/G (G = 32), values "
    "b + 32/head_dim (f16 scale + f16 min), plus f32 residual rows of an incomplete key group";
}  // namespace

const FormatDesc& Int4KiviFormat() {
  static constexpr FormatDesc kDesc = {
      .id = FormatId::kInt4Kivi, .name = "int4-kivi",
      .summary = "int4 KIVI: keys per channel (groups of 32 tokens), values per token, asymmetric",
      .key = KiviKeys<4>::kCodec, .value = KiviValues<4>::kCodec, .note = kKiviNote};
  return kDesc;
}
const FormatDesc& Int2KiviFormat() {
  static constexpr FormatDesc kDesc = {
      .id = FormatId::kInt2Kivi, .name = "int2-kivi",
      .summary = "int2 KIVI: keys per channel (groups of 32 tokens), values per token, asymmetric",
      .key = KiviKeys<2>::kCodec, .value = KiviValues<2>::kCodec, .note = kKiviNote};
  return kDesc;
}
}  // namespace kvq
