// fp8-e4m3 SIMD kernels for every compiled target; see format/row_kernels-inl.h.
// Decoding trick: an E4M3 code S.EEEE.MMM placed as f16 bits S.0EEEE.MMM0000000 is the same
// number divided by 2^8 (f16's exponent bias is 15, E4M3's is 7), subnormals included; so one
// u8 -> u16 shift, a hardware f16 -> f32 conversion and a multiply by 256 · tensor_scale decode it
// exactly as E4m3ToF32(code) · tensor_scale does.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "formats/fp8_e4m3/fp8_e4m3_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "base/float_codes.h"
#include "formats/fp8_e4m3/fp8_e4m3.h"
#include "formats/row_kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

struct Fp8E4m3Reader {
  struct Row {
    const uint8_t* p;
  };
  static Row At(const RowTile& t, int32_t i, int32_t kv_head, const CodecArgs& a) {
    return {TileRow(t, i) + static_cast<int64_t>(kv_head) * a.shape.head_dim};
  }
  template <class D>
  static hn::Vec<D> Load(D d, const Row& r, int32_t j, const CodecArgs& a) {
    const hn::Rebind<uint8_t, D> du8;
    const hn::Rebind<uint16_t, D> du16;
    const hn::Rebind<hwy::float16_t, D> df16;
    const auto w = hn::PromoteTo(du16, hn::LoadU(du8, r.p + j));
    const auto h = hn::Or(hn::ShiftLeft<8>(hn::And(w, hn::Set(du16, 0x80))),
                          hn::ShiftLeft<7>(hn::And(w, hn::Set(du16, 0x7F))));
    return hn::PromoteTo(d, hn::BitCast(df16, h));  // E4M3 value / 2^8; RowScale restores it
  }
  static float Scalar(const Row& r, int32_t j, const CodecArgs&) {
    return E4m3ToF32(r.p[j]) * 0x1p-8f;  // exact
  }
  static float RowScale(const Row&, const CodecArgs& a) { return 256.0f * a.tensor_scale; }
};

const CodecKernels& Fp8E4m3KernelsHere() { return MakeKernels<Fp8E4m3Reader>(); }

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq {
HWY_EXPORT(Fp8E4m3KernelsHere);
const CodecKernels& Fp8E4m3Kernels() { return HWY_DYNAMIC_DISPATCH(Fp8E4m3KernelsHere)(); }
}  // namespace kvq
#endif
