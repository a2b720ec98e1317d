// fp8-e4m3 codec (layout in fp8_e4m3.h).
#include "formats/fp8_e4m3/fp8_e4m3.h"

#include <cmath>

#include "base/float_codes.h"
#include "formats/codec_helpers.h"

namespace kvq {
namespace {
using namespace format_internal;

void DecodeHead(const uint8_t* block, int32_t, int32_t head, float* out, const CodecArgs& a) {
  const uint8_t* p = block + static_cast<int64_t>(head) * a.shape.head_dim;
  for (int32_t i = 0; i < a.shape.head_dim; ++i) out[i] = E4m3ToF32(p[i]) * a.tensor_scale;
}
void Encode(const float* rows, uint8_t* block, const CodecArgs& a) {
  for (int64_t i = 0; i < a.shape.elems(); ++i) block[i] = F32ToE4m3(rows[i] / a.tensor_scale);
}
float Calibrate(const float* values, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(values[i])) amax = std::fmax(amax, std::fabs(values[i]));
  }
  return amax > 0.0f ? amax / kE4m3Max : 1.0f;
}
// Within range, half an E4M3 ulp of x/scale (2^-4 relative; 2^-10 among subnormals) times the
// scale, plus f32 slack for the division; past 448 · scale the value saturates.
float ErrorBound(float x, const uint8_t*, int32_t, int32_t, int32_t, const CodecArgs& a) {
  const float ax = std::fabs(x);
  const float slack = ax * 0x1p-22f;
  if (ax > kE4m3Max * a.tensor_scale) return ax - kE4m3Max * a.tensor_scale + slack;
  return std::fmax(ax * 0x1p-4f, a.tensor_scale * 0x1p-10f) + slack;
}
int64_t BlockBytes(RowShape s) { return s.elems(); }
std::string CheckShape(RowShape) { return ""; }

constexpr Codec kCodec = {
    .element = "fp8 E4M3", .scale = "f32 per tensor (calibrated: amax/448)",
    .layout = "row of E4M3 codes; tensor scale kept beside the pages",
    .element_bits = 8, .rows_per_block = 1, .calibrated = true,
    .check_shape = CheckShape, .block_bytes = BlockBytes, .encode_block = Encode,
    .decode_row = DecodeRowVia<DecodeHead>, .dot = DotVia<DecodeHead>,
    .axpy = AxpyVia<DecodeHead>, .calibrate = Calibrate, .error_bound = ErrorBound, .kernels = Fp8E4m3Kernels,
};
}  // namespace

const FormatDesc& Fp8E4m3Format() {
  static constexpr FormatDesc kDesc = {
      .id = FormatId::kFp8E4m3, .name = "fp8-e4m3",
      .summary = "OCP FP8 E4M3, one f32 scale per tensor set at calibration, saturating",
      .key = kCodec, .value = kCodec,
      .note = "8 bits per number; the per-tensor scale adds 4 bytes per layer for K and for V"};
  return kDesc;
}
}  // namespace kvq
