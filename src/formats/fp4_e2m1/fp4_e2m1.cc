// fp4-e2m1 codec (formula and layout in fp4_e2m1.h).
#include "formats/fp4_e2m1/fp4_e2m1.h"

#include <cmath>

#include "base/float_codes.h"
#include "formats/codec_helpers.h"

namespace kvq {
namespace {
using namespace format_internal;

constexpr int32_t kG = kFp4GroupElems;
constexpr int32_t kGroupBytes = 1 + kG / 2;

int64_t BlockBytes(RowShape s) { return s.elems() / kG * kGroupBytes; }

std::string CheckShape(RowShape s) {
  if (s.elems() % kG != 0) {
    return "n_kv_heads x head_dim must be a multiple of 16 (one E4M3 scale per 16 numbers)";
  }
  if (s.head_dim % kG != 0 && kG % s.head_dim != 0) {
    return "head_dim must be a multiple of 16 or divide 16 (scale groups of 16 numbers)";
  }
  return "";
}

void DecodeHead(const uint8_t* block, int32_t, int32_t head, float* out, const CodecArgs& a) {
  const int64_t first = static_cast<int64_t>(head) * a.shape.head_dim;
  for (int32_t i = 0; i < a.shape.head_dim; ++i) {
    const int64_t j = first + i;
    const uint8_t* g = block + (j / kG) * kGroupBytes;
    const float s = E4m3ToF32(g[0]);
    out[i] = E2m1ToF32(static_cast<uint8_t>(UnpackCode(g + 1, static_cast<int32_t>(j % kG), 4))) * s;
  }
}

// Half the E2M1 spacing at |x|/s (0.5 up to 2, 1 up to 4, 2 up to 6) times s; past 6·s the
// element saturates. |x|·2^-22 covers the f32 division.
float ErrorBound(float x, const uint8_t* block, int32_t, int32_t head, int32_t i,
                 const CodecArgs& a) {
  const int64_t j = static_cast<int64_t>(head) * a.shape.head_dim + i;
  const float s = E4m3ToF32(block[(j / kG) * kGroupBytes]);
  const float v = std::fabs(x) / s;
  const float slack = std::fabs(x) * 0x1p-22f;
  if (v > kE2m1Max) return (v - kE2m1Max) * s + slack;
  return (v <= 2.0f ? 0.25f : v <= 4.0f ? 0.5f : 1.0f) * s + slack;
}

void Encode(const float* rows, uint8_t* block, const CodecArgs& a) {
  for (int64_t g0 = 0; g0 < a.shape.elems(); g0 += kG) {
    uint8_t* g = block + (g0 / kG) * kGroupBytes;
    float amax = 0.0f;
    for (int32_t k = 0; k < kG; ++k) amax = MaxAbsStep(amax, rows[g0 + k]);
    uint8_t s8 = F32ToE4m3(amax / 6.0f);
    if (E4m3ToF32(s8) == 0.0f) s8 = 0x01;  // smallest subnormal, 2^-9
    g[0] = s8;
    const float s = E4m3ToF32(s8);
    for (int32_t k = 0; k < kG; ++k) PackCode(g + 1, k, 4, F32ToE2m1(rows[g0 + k] / s));
  }
}

constexpr Codec kCodec = {
    .element = "fp4 E2M1", .scale = "E4M3 per 16 numbers",
    .layout = "per 16 numbers: [E4M3 scale][8 bytes of E2M1 nibbles, low nibble first]",
    .element_bits = 4, .rows_per_block = 1, .calibrated = false,
    .check_shape = CheckShape, .block_bytes = BlockBytes, .encode_block = Encode,
    .decode_row = DecodeRowVia<DecodeHead>, .dot = DotVia<DecodeHead>,
    .axpy = AxpyVia<DecodeHead>, .calibrate = nullptr, .error_bound = ErrorBound, .kernels = Fp4E2m1Kernels,
};
}  // namespace

const FormatDesc& Fp4E2m1Format() {
  static constexpr FormatDesc kDesc = {
      .id = FormatId::kFp4E2m1, .name = "fp4-e2m1",
      .summary = "OCP FP4 E2M1 with one E4M3 scale per 16 numbers (4.5 bits per number)",
      .key = kCodec, .value = kCodec, .note = ""};
  return kDesc;
}
}  // namespace kvq
