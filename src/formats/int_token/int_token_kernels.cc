// int8 / int4 / int2 per-token SIMD kernels for every compiled target; see row_kernels-inl.h.
// A chunk decodes as (raw − 2^(b−1)) · s exactly as the scalar reference does (the subtraction is
// exact in f32), so SIMD and scalar differ only in how the dot product is summed.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "formats/int_token/int_token_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "base/float_codes.h"
#include "formats/codec_helpers.h"
#include "formats/int_token/int_token.h"
#include "formats/row_kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

template <int kBits>
struct IntTokenReader {
  static constexpr float kOffset = static_cast<float>(1 << (kBits - 1));
  struct Row {
    const uint8_t* codes;
    float s;  // the head row's f16 scale: RowScale
  };
  static Row At(const RowTile& t, int32_t i, int32_t kv_head, const CodecArgs& a) {
    const int64_t head_bytes = 2 + static_cast<int64_t>(a.shape.head_dim) * kBits / 8;
    const uint8_t* p = TileRow(t, i) + kv_head * head_bytes;
    return {p + 2, F16ToF32(format_internal::LoadU16(p))};
  }
  // raw − 2^(b−1) as f32: subtracted in 8-bit lanes (wrapping), read back as signed bytes and
  // sign-extended, so no float op is spent on it; the scale s is applied per row (RowScale).
  template <class D>
  static hn::Vec<D> Load(D d, const Row& r, int32_t j, const CodecArgs&) {
    const hn::Rebind<uint8_t, D> du8;
    const hn::Rebind<int8_t, D> di8;
    const hn::Rebind<int32_t, D> di32;
    const auto raw = UnpackCodes<kBits>(d, r.codes + j * kBits / 8);
    const auto centred = hn::BitCast(di8, hn::Sub(raw, hn::Set(du8, static_cast<uint8_t>(kOffset))));
    return hn::ConvertTo(d, hn::PromoteTo(di32, centred));
  }
  static float Scalar(const Row& r, int32_t j, const CodecArgs&) {
    return static_cast<float>(format_internal::UnpackCode(r.codes, j, kBits)) - kOffset;
  }
  static float RowScale(const Row& r, const CodecArgs&) { return r.s; }
};

const CodecKernels& Int8KernelsHere() { return MakeKernels<IntTokenReader<8>>(); }
const CodecKernels& Int4KernelsHere() { return MakeKernels<IntTokenReader<4>>(); }
const CodecKernels& Int2KernelsHere() { return MakeKernels<IntTokenReader<2>>(); }

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq {
HWY_EXPORT(Int8KernelsHere);
HWY_EXPORT(Int4KernelsHere);
HWY_EXPORT(Int2KernelsHere);
const CodecKernels& Int8Kernels() { return HWY_DYNAMIC_DISPATCH(Int8KernelsHere)(); }
const CodecKernels& Int4Kernels() { return HWY_DYNAMIC_DISPATCH(Int4KernelsHere)(); }
const CodecKernels& Int2Kernels() { return HWY_DYNAMIC_DISPATCH(Int2KernelsHere)(); }
}  // namespace kvq
#endif
