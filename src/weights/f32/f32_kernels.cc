// F32 row kernels for every compiled target (see weights/plain_rows-inl.h). AVX3_DL is compiled
// as in every weight kernel file, so all types dispatch over the same target list; its code here
// is AVX3's (the same float instructions in the same order), so it gives AVX3's bits.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "weights/f32/f32_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstring>

#include "weights/f32/f32.h"
#include "weights/plain_rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

struct F32Elems {
  static constexpr int64_t kBytes = 4;
  template <class D>
  static HWY_INLINE hn::Vec<D> Load(D d, const uint8_t* row, int64_t c) {
    return hn::LoadU(d, reinterpret_cast<const float*>(row) + c);
  }
  static HWY_INLINE float Scalar(const uint8_t* row, int64_t c) {
    float v;
    std::memcpy(&v, row + 4 * c, 4);
    return v;
  }
};

const WeightKernels& F32WeightKernelsHere() { return MakePlainKernels<F32Elems>(); }

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::weights_f32 {
HWY_EXPORT(F32WeightKernelsHere);
const WeightKernels& Kernels() { return HWY_DYNAMIC_DISPATCH(F32WeightKernelsHere)(); }
}  // namespace kvq::weights_f32
#endif
