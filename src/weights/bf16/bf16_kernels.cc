// BF16 row kernels for every compiled target (see weights/plain_rows-inl.h; AVX3_DL as in
// weights/f32/f32_kernels.cc).
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "weights/bf16/bf16_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstring>

#include "base/float_codes.h"
#include "weights/bf16/bf16.h"
#include "weights/plain_rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

struct Bf16Elems {
  static constexpr int64_t kBytes = 2;
  template <class D>
  static HWY_INLINE hn::Vec<D> Load(D d, const uint8_t* row, int64_t c) {
    const hn::Rebind<uint16_t, D> du16;
    const hn::Rebind<uint32_t, D> du32;
    const auto bits = hn::PromoteTo(du32, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(row) + c));
    return hn::BitCast(d, hn::ShiftLeft<16>(bits));  // a bf16 is the top half of an f32
  }
  static HWY_INLINE float Scalar(const uint8_t* row, int64_t c) {
    uint16_t v;
    std::memcpy(&v, row + 2 * c, 2);  // little-endian host
    return Bf16ToF32(v);
  }
};

const WeightKernels& Bf16WeightKernelsHere() { return MakePlainKernels<Bf16Elems>(); }

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::weights_bf16 {
HWY_EXPORT(Bf16WeightKernelsHere);
const WeightKernels& Kernels() { return HWY_DYNAMIC_DISPATCH(Bf16WeightKernelsHere)(); }
}  // namespace kvq::weights_bf16
#endif
