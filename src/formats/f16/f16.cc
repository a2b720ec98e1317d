// f16 codec: 2 bytes per number, no scale; conversion rounds to nearest even (base/float_codes).
#include "formats/f16/f16.h"

#include <cmath>

#include "base/float_codes.h"
#include "formats/codec_helpers.h"

namespace kvq {
namespace {
using namespace format_internal;

void DecodeHead(const uint8_t* block, int32_t, int32_t head, float* out, const CodecArgs& a) {
  const uint8_t* p = block + static_cast<int64_t>(head) * a.shape.head_dim * 2;
  for (int32_t i = 0; i < a.shape.head_dim; ++i) out[i] = F16ToF32(LoadU16(p + 2 * i));
}
void Encode(const float* rows, uint8_t* block, const CodecArgs& a) {
  for (int64_t i = 0; i < a.shape.elems(); ++i) StoreU16(block + 2 * i, F32ToF16(rows[i]));
}
int64_t BlockBytes(RowShape s) { return s.elems() * 2; }
std::string CheckShape(RowShape) { return ""; }

// Half an f16 ulp: 2^-11 relative in the normal range, 2^-25 absolute among subnormals.
float ErrorBound(float x, const uint8_t*, int32_t, int32_t, int32_t, const CodecArgs&) {
  return std::fmax(std::fabs(x) * 0x1p-11f, 0x1p-25f);
}

constexpr Codec kCodec = {
    .element = "f16", .scale = "none", .layout = "row of f16, heads in order",
    .element_bits = 16, .rows_per_block = 1, .calibrated = false,
    .check_shape = CheckShape, .block_bytes = BlockBytes, .encode_block = Encode,
    .decode_row = DecodeRowVia<DecodeHead>, .dot = DotVia<DecodeHead>,
    .axpy = AxpyVia<DecodeHead>, .calibrate = nullptr, .error_bound = ErrorBound, .kernels = F16Kernels,
};
}  // namespace

const FormatDesc& F16Format() {
  static constexpr FormatDesc kDesc = {
      .id = FormatId::kF16, .name = "f16", .summary = "IEEE binary16, round to nearest even; kvq's default cache",
      .key = kCodec, .value = kCodec, .note = ""};
  return kDesc;
}
}  // namespace kvq
