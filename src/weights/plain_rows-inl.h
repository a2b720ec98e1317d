// Per-target row kernels of the plain weight types (one element per block: F32, F16, BF16), for a
// type's <name>_kernels.cc (include after foreach_target.h; this file opens its own namespaces).
// A type supplies an element reader E:
//   static constexpr int64_t kBytes;                  bytes per element
//   template <class D> Vec<D> Load(D, row, c)          elements c .. c+Lanes(D)−1 as f32
//   static float Scalar(row, c)                        element c as f32 (the tail)
// and gets MakePlainKernels<E>(). Numerics (matvec.h, "Numerics, F32/F16/BF16"): per row, lane-
// parallel FMA partial sums over full vectors, one SumOfLanes, then the scalar tail in order.
#if defined(KVQ_WEIGHTS_PLAIN_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVQ_WEIGHTS_PLAIN_ROWS_INL_H_
#undef KVQ_WEIGHTS_PLAIN_ROWS_INL_H_
#else
#define KVQ_WEIGHTS_PLAIN_ROWS_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

#include "weights/weight_type.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// R consecutive rows from r, sharing each load of x.
template <class E, int R>
HWY_INLINE void PlainRowGroup(const uint8_t* w, const float* x, float* y, int64_t cols, int64_t r) {
  const hn::ScalableTag<float> d;
  const int64_t n = static_cast<int64_t>(hn::Lanes(d));
  const int64_t row_bytes = cols * E::kBytes;
  const uint8_t* a[R];
  hn::Vec<decltype(d)> s[R];
  for (int i = 0; i < R; ++i) {
    a[i] = w + (r + i) * row_bytes;
    s[i] = hn::Zero(d);
  }
  int64_t c = 0;
  for (; c + n <= cols; c += n) {
    const auto xv = hn::LoadU(d, x + c);
    for (int i = 0; i < R; ++i) s[i] = hn::MulAdd(E::Load(d, a[i], c), xv, s[i]);
  }
  float t[R];
  for (int i = 0; i < R; ++i) t[i] = hn::GetLane(hn::SumOfLanes(d, s[i]));
  for (; c < cols; ++c) {
    for (int i = 0; i < R; ++i) t[i] += E::Scalar(a[i], c) * x[c];
  }
  for (int i = 0; i < R; ++i) y[r + i] = t[i];
}

// Rows [r0, r1) of y = W x: groups of 4 rows, then single rows.
template <class E>
void PlainRows(const uint8_t* w, const float* x, float* y, int64_t cols, int64_t r0, int64_t r1) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) PlainRowGroup<E, 4>(w, x, y, cols, r);
  for (; r < r1; ++r) PlainRowGroup<E, 1>(w, x, y, cols, r);
}

template <class E>
const WeightKernels& MakePlainKernels() {
  static const WeightKernels kKernels = {
      .target = hwy::TargetName(HWY_TARGET),
      .rows = &PlainRows<E>,
      .activation_offsets = nullptr,
      .quant_rows = nullptr,
  };
  return kKernels;
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
