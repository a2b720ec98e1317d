// fp8-e4m3 codecs (formula and layout in fp8_e4m3.h): keys in groups of 32 rows with an exponent
// per head, values per row with one exponent per row.
#include "formats/fp8_e4m3/fp8_e4m3.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "base/float_codes.h"
#include "formats/codec_helpers.h"

namespace kvq {
namespace {
using namespace format_internal;

constexpr int32_t kMinExp = -126, kMaxExp = 119;  // see fp8_e4m3.h
constexpr int32_t kG = kFp8KeyGroupRows;

// 2^(b − 127) for an exponent byte b in [1, 246]: a normal f32, built from its bits.
float Pow2(uint8_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 23); }

// The smallest e in [kMinExp, kMaxExp] with amax <= 448 · 2^e, as its byte e + 127. Each
// comparison is exact (448 · 2^e is a normal f32 for every e in range).
uint8_t ExponentByte(float amax) {
  int32_t e = amax > 0.0f ? std::ilogb(amax) - 8 : kMinExp;  // a guess within one of the answer
  e = std::clamp(e, kMinExp, kMaxExp);
  while (e < kMaxExp && amax > std::ldexp(kE4m3Max, e)) ++e;
  while (e > kMinExp && amax <= std::ldexp(kE4m3Max, e - 1)) --e;
  return static_cast<uint8_t>(e + 127);
}

// n numbers x -> E4M3 codes of x · 2^-e (the product exact, so RNE happens once, in F32ToE4m3).
void EncodeCodes(const float* x, int64_t n, uint8_t b, uint8_t* codes) {
  const int32_t e = b - 127;
  for (int64_t i = 0; i < n; ++i) codes[i] = F32ToE4m3(std::ldexp(x[i], -e));
}
void DecodeCodes(const uint8_t* codes, int32_t n, uint8_t b, float* out) {
  const float s = Pow2(b);
  for (int32_t i = 0; i < n; ++i) out[i] = E4m3ToF32(codes[i]) * s;  // exact
}
float MaxAbs(const float* x, int64_t n, float amax) {
  for (int64_t i = 0; i < n; ++i) amax = MaxAbsStep(amax, x[i]);
  return amax;
}

// Half an E4M3 ulp of x / s, times s = 2^e (x · 2^-e and E4M3(c) · 2^e are exact): 2^-4 of |x|,
// or 2^-10 · s among E4M3's subnormals. Past 448 · s (only when e stopped at 119) x saturates.
float BoundAt(float x, uint8_t b) {
  const float s = Pow2(b);
  const float ax = std::fabs(x);
  if (ax > kE4m3Max * s) return ax - kE4m3Max * s;
  return std::fmax(ax * 0x1p-4f, s * 0x1p-10f);
}

// ---- keys: groups of kG rows, an exponent per head ----
struct KeyGroups {
  static int64_t HeadBytes(RowShape s) { return 1 + int64_t{kG} * s.head_dim; }
  static int64_t BlockBytes(RowShape s) {
    return (s.n_kv_heads * HeadBytes(s) + kG - 1) / kG * kG;  // zero-padded to whole bytes per row
  }
  static std::string CheckShape(RowShape) { return ""; }

  static void DecodeHead(const uint8_t* block, int32_t row, int32_t head, float* out,
                         const CodecArgs& a) {
    const uint8_t* p = block + head * HeadBytes(a.shape);
    DecodeCodes(p + 1 + int64_t{row} * a.shape.head_dim, a.shape.head_dim, p[0], out);
  }
  static float ErrorBound(float x, const uint8_t* block, int32_t, int32_t head, int32_t,
                          const CodecArgs& a) {
    return BoundAt(x, block[head * HeadBytes(a.shape)]);
  }
  // rows: [kG][n_kv_heads][head_dim].
  static void Encode(const float* rows, uint8_t* block, const CodecArgs& a) {
    const int32_t d = a.shape.head_dim;
    const int64_t row_elems = a.shape.elems();
    const int64_t used = a.shape.n_kv_heads * HeadBytes(a.shape);
    std::fill(block + used, block + BlockBytes(a.shape), uint8_t{0});
    for (int32_t h = 0; h < a.shape.n_kv_heads; ++h) {
      uint8_t* p = block + h * HeadBytes(a.shape);
      float amax = 0.0f;
      for (int32_t r = 0; r < kG; ++r) amax = MaxAbs(rows + r * row_elems + int64_t{h} * d, d, amax);
      p[0] = ExponentByte(amax);
      for (int32_t r = 0; r < kG; ++r) {
        EncodeCodes(rows + r * row_elems + int64_t{h} * d, d, p[0], p + 1 + int64_t{r} * d);
      }
    }
  }

  static constexpr Codec kCodec = {
      .element = "fp8 E4M3",
      .scale = "E8M0 power of two per head per group of 32 tokens; residual rows f32",
      .layout = "per head: [E8M0 exponent byte][32 rows x head_dim E4M3 codes]; zero pad to a "
                "multiple of 32 bytes",
      .element_bits = 8, .rows_per_block = kG, .calibrated = false,
      .check_shape = CheckShape, .block_bytes = BlockBytes, .encode_block = Encode,
      .decode_row = DecodeRowVia<DecodeHead>, .dot = DotVia<DecodeHead>,
      .axpy = AxpyVia<DecodeHead>, .calibrate = nullptr, .error_bound = ErrorBound,
      .kernels = Fp8E4m3KeyKernels,
  };
};

// ---- values: one row per block, one exponent per row ----
struct ValueRows {
  static int64_t BlockBytes(RowShape s) { return 1 + s.elems(); }
  static std::string CheckShape(RowShape) { return ""; }
  static void DecodeHead(const uint8_t* block, int32_t, int32_t head, float* out,
                         const CodecArgs& a) {
    DecodeCodes(block + 1 + int64_t{head} * a.shape.head_dim, a.shape.head_dim, block[0], out);
  }
  static float ErrorBound(float x, const uint8_t* block, int32_t, int32_t, int32_t,
                          const CodecArgs&) {
    return BoundAt(x, block[0]);
  }
  // rows: [n_kv_heads][head_dim].
  static void Encode(const float* rows, uint8_t* block, const CodecArgs& a) {
    block[0] = ExponentByte(MaxAbs(rows, a.shape.elems(), 0.0f));
    EncodeCodes(rows, a.shape.elems(), block[0], block + 1);
  }

  static constexpr Codec kCodec = {
      .element = "fp8 E4M3", .scale = "E8M0 power of two per row (all heads)",
      .layout = "[E8M0 exponent byte][n_kv_heads x head_dim E4M3 codes]",
      .element_bits = 8, .rows_per_block = 1, .calibrated = false,
      .check_shape = CheckShape, .block_bytes = BlockBytes, .encode_block = Encode,
      .decode_row = DecodeRowVia<DecodeHead>, .dot = DotVia<DecodeHead>,
      .axpy = AxpyVia<DecodeHead>, .calibrate = nullptr, .error_bound = ErrorBound,
      .kernels = Fp8E4m3ValueKernels,
  };
};
}  // namespace

const FormatDesc& Fp8E4m3Format() {
  static constexpr FormatDesc kDesc = {
      .id = FormatId::kFp8E4m3, .name = "fp8-e4m3",
      .summary = "OCP FP8 E4M3 scaled by powers of two from each block's own amax (never "
                 "saturates): keys per head per group of 32 tokens, values per row",
      .key = KeyGroups::kCodec, .value = ValueRows::kCodec,
      .note = "exponent bytes: keys one per head per 32 tokens, zero-padded to 32 bytes per group "
              "(whole bytes per position); values one per row"};
  return kDesc;
}

}  // namespace kvq
