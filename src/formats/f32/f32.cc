// f32 codec: the reference format, stored exactly.
#include "formats/f32/f32.h"

#include "formats/codec_helpers.h"

namespace kvq {
namespace {
using namespace format_internal;

void DecodeHead(const uint8_t* block, int32_t, int32_t head, float* out, const CodecArgs& a) {
  const uint8_t* p = block + static_cast<int64_t>(head) * a.shape.head_dim * 4;
  for (int32_t i = 0; i < a.shape.head_dim; ++i) out[i] = LoadF32(p + 4 * i);
}
void Encode(const float* rows, uint8_t* block, const CodecArgs& a) {
  for (int64_t i = 0; i < a.shape.elems(); ++i) StoreF32(block + 4 * i, rows[i]);
}
int64_t BlockBytes(RowShape s) { return s.elems() * 4; }
std::string CheckShape(RowShape) { return ""; }

float ErrorBound(float, const uint8_t*, int32_t, int32_t, int32_t, const CodecArgs&) { return 0.0f; }

constexpr Codec kCodec = {
    .element = "f32", .scale = "none", .layout = "row of f32, heads in order",
    .element_bits = 32, .rows_per_block = 1, .calibrated = false,
    .check_shape = CheckShape, .block_bytes = BlockBytes, .encode_block = Encode,
    .decode_row = DecodeRowVia<DecodeHead>, .dot = DotVia<DecodeHead>,
    .axpy = AxpyVia<DecodeHead>, .calibrate = nullptr, .error_bound = ErrorBound, .kernels = F32Kernels,
};
}  // namespace

const FormatDesc& F32Format() {
  static constexpr FormatDesc kDesc = {
      .id = FormatId::kF32, .name = "f32", .summary = "IEEE f32, exact: the reference cache",
      .key = kCodec, .value = kCodec, .note = ""};
  return kDesc;
}
}  // namespace kvq
