// f32 SIMD kernels (score, accumulate) for every compiled target; see format/row_kernels-inl.h.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "formats/f32/f32_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "formats/f32/f32.h"
#include "formats/row_kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

struct F32Reader {
  struct Row {
    const float* x;
  };
  static Row At(const RowTile& t, int32_t i, int32_t kv_head, const CodecArgs& a) {
    return {reinterpret_cast<const float*>(TileRow(t, i)) + static_cast<int64_t>(kv_head) * a.shape.head_dim};
  }
  template <class D>
  static hn::Vec<D> Load(D d, const Row& r, int32_t j, const CodecArgs&) {
    return hn::LoadU(d, r.x + j);
  }
  static float Scalar(const Row& r, int32_t j, const CodecArgs&) { return r.x[j]; }
  static float RowScale(const Row&, const CodecArgs&) { return 1.0f; }
};

const CodecKernels& F32KernelsHere() { return MakeKernels<F32Reader>(); }

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq {
HWY_EXPORT(F32KernelsHere);
const CodecKernels& F32Kernels() { return HWY_DYNAMIC_DISPATCH(F32KernelsHere)(); }
}  // namespace kvq
#endif
