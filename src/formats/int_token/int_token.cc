// int8 / int4 / int2 per-token codecs (formula and layout in int_token.h), one template over b.
#include "formats/int_token/int_token.h"

#include <cmath>

#include "base/float_codes.h"
#include "formats/codec_helpers.h"

namespace kvq {
namespace {
using namespace format_internal;

template <int kBits>
struct IntToken {
  static constexpr int32_t kOffset = 1 << (kBits - 1);
  static constexpr float kQmax = static_cast<float>(kOffset - 1);
  static constexpr float kRawMax = static_cast<float>((1 << kBits) - 1);

  static int64_t HeadBytes(RowShape s) { return 2 + static_cast<int64_t>(s.head_dim) * kBits / 8; }
  static int64_t BlockBytes(RowShape s) { return s.n_kv_heads * HeadBytes(s); }
  static std::string CheckShape(RowShape s) { return RequireWholeBytesPerHead(s, kBits); }

  static void DecodeHead(const uint8_t* block, int32_t, int32_t head, float* out,
                         const CodecArgs& a) {
    const uint8_t* p = block + head * HeadBytes(a.shape);
    const float s = F16ToF32(LoadU16(p));
    for (int32_t i = 0; i < a.shape.head_dim; ++i) {
      out[i] = static_cast<float>(static_cast<int32_t>(UnpackCode(p + 2, i, kBits)) - kOffset) * s;
    }
  }

  // |x − x'| ≤ s/2: round() moves x/s by at most half, the clamp never bites (|x|/s ≤ qmax up to
  // f16 rounding of s, well under qmax + 1/2), and (raw − offset)·s is exact; |x|·2^-23 covers the
  // f32 rounding of x/s. Only when s saturated at 65504 does the clamp bite: then x' = ±qmax·s
  // at worst, and the error is |x| − qmax·s.
  static float ErrorBound(float x, const uint8_t* block, int32_t, int32_t head, int32_t,
                          const CodecArgs& a) {
    const float s = F16ToF32(LoadU16(block + head * HeadBytes(a.shape)));
    return std::fmax(0.5f * s, std::fabs(x) - kQmax * s) + std::fabs(x) * 0x1p-23f;
  }

  static void Encode(const float* rows, uint8_t* block, const CodecArgs& a) {
    const int32_t d = a.shape.head_dim;
    for (int32_t h = 0; h < a.shape.n_kv_heads; ++h) {
      const float* x = rows + static_cast<int64_t>(h) * d;
      uint8_t* p = block + h * HeadBytes(a.shape);
      float amax = 0.0f;
      for (int32_t i = 0; i < d; ++i) amax = MaxAbsStep(amax, x[i]);
      uint16_t s16 = F32ToF16(amax / kQmax);
      if ((s16 & 0x7FFF) >= 0x7C00) s16 = 0x7BFF;  // overflow: saturate to 65504
      StoreU16(p, s16);
      const float s = F16ToF32(s16);
      for (int32_t i = 0; i < d; ++i) {
        float raw = static_cast<float>(kOffset);
        if (s != 0.0f) raw = ClampCode(RoundHalfEven(x[i] / s) + kOffset, kRawMax);
        PackCode(p + 2, i, kBits, static_cast<uint32_t>(raw));
      }
    }
  }

  static constexpr Codec kCodec = {
      .element = kBits == 8 ? "int8 offset-binary" : kBits == 4 ? "int4 offset-binary"
                                                                 : "int2 offset-binary",
      .scale = "f16 per head row (symmetric)",
      .layout = "per head: [f16 scale][codes, little-endian within bytes]",
      .element_bits = kBits, .rows_per_block = 1, .calibrated = false,
      .check_shape = CheckShape, .block_bytes = BlockBytes, .encode_block = Encode,
      .decode_row = DecodeRowVia<DecodeHead>, .dot = DotVia<DecodeHead>,
      .axpy = AxpyVia<DecodeHead>, .calibrate = nullptr, .error_bound = ErrorBound,
      .kernels = kBits == 8 ? Int8Kernels : kBits == 4 ? Int4Kernels : Int2Kernels,
  };
};
}  // namespace

const FormatDesc& Int8Format() {
  static constexpr FormatDesc kDesc = {
      .id = FormatId::kInt8, .name = "int8",
      .summary = "int8 per token: symmetric, one f16 scale per head row",
      .key = IntToken<8>::kCodec, .value = IntToken<8>::kCodec, .note = ""};
  return kDesc;
}
const FormatDesc& Int4Format() {
  static constexpr FormatDesc kDesc = {
      .id = FormatId::kInt4, .name = "int4",
      .summary = "int4 per token: symmetric, one f16 scale per head row",
      .key = IntToken<4>::kCodec, .value = IntToken<4>::kCodec,
      .note = "scale packed as f16 (2 bytes): 528 B per layer-position at 4 KV heads x 128 (a "
              "4-byte slot per scale would make it 544)"};
  return kDesc;
}
const FormatDesc& Int2Format() {
  static constexpr FormatDesc kDesc = {
      .id = FormatId::kInt2, .name = "int2",
      .summary = "int2 per token: symmetric, one f16 scale per head row",
      .key = IntToken<2>::kCodec, .value = IntToken<2>::kCodec, .note = ""};
  return kDesc;
}
}  // namespace kvq
