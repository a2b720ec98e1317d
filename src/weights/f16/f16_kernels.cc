// F16 row kernels for every compiled target (see weights/plain_rows-inl.h; AVX3_DL as in
// weights/f32/f32_kernels.cc).
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "weights/f16/f16_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstring>

#include "base/float_codes.h"
#include "weights/f16/f16.h"
#include "weights/plain_rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

struct F16Elems {
  static constexpr int64_t kBytes = 2;
  template <class D>
  static HWY_INLINE hn::Vec<D> Load(D d, const uint8_t* row, int64_t c) {
    const hn::Rebind<hwy::float16_t, D> df16;
    return hn::PromoteTo(d, hn::LoadU(df16, reinterpret_cast<const hwy::float16_t*>(row) + c));
  }
  static HWY_INLINE float Scalar(const uint8_t* row, int64_t c) {
    uint16_t v;
    std::memcpy(&v, row + 2 * c, 2);  // little-endian host
    return F16ToF32(v);
  }
};

const WeightKernels& F16WeightKernelsHere() { return MakePlainKernels<F16Elems>(); }

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::weights_f16 {
HWY_EXPORT(F16WeightKernelsHere);
const WeightKernels& Kernels() { return HWY_DYNAMIC_DISPATCH(F16WeightKernelsHere)(); }
}  // namespace kvq::weights_f16
#endif
