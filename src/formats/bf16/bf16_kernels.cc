// bf16 SIMD kernels (score, accumulate) for every compiled target; see format/row_kernels-inl.h.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "formats/bf16/bf16_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "base/float_codes.h"
#include "formats/codec_helpers.h"
#include "formats/bf16/bf16.h"
#include "formats/row_kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

struct Bf16Reader {
  struct Row {
    const uint8_t* p;  // the head's first element
  };
  static Row At(const RowTile& t, int32_t i, int32_t kv_head, const CodecArgs& a) {
    return {TileRow(t, i) + static_cast<int64_t>(kv_head) * a.shape.head_dim * 2};
  }
  template <class D>
  static hn::Vec<D> Load(D d, const Row& r, int32_t j, const CodecArgs&) {
    const hn::Rebind<uint16_t, D> du16;
    const hn::Rebind<uint32_t, D> du32;
    const auto bits = hn::PromoteTo(du32, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(r.p) + j));
    return hn::BitCast(d, hn::ShiftLeft<16>(bits));  // a bf16 is the top half of an f32
  }
  static float Scalar(const Row& r, int32_t j, const CodecArgs&) {
    return Bf16ToF32(format_internal::LoadU16(r.p + 2 * j));
  }
  static float RowScale(const Row&, const CodecArgs&) { return 1.0f; }
};

const CodecKernels& Bf16KernelsHere() { return MakeKernels<Bf16Reader>(); }

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq {
HWY_EXPORT(Bf16KernelsHere);
const CodecKernels& Bf16Kernels() { return HWY_DYNAMIC_DISPATCH(Bf16KernelsHere)(); }
}  // namespace kvq
#endif
