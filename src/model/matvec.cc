// MatVec (see matvec.h): per-target row kernels (foreach_target) and the threaded driver.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/matvec.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "model/matvec.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Rows [r0, r1) of an f32 matrix: four rows at a time share each load of x.
void MatVecF32Rows(const float* w, const float* x, float* y, int64_t cols, int64_t r0, int64_t r1) {
  const hn::ScalableTag<float> d;
  const int64_t n = static_cast<int64_t>(hn::Lanes(d));
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    const float* a = w + r * cols;
    auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
    int64_t c = 0;
    for (; c + n <= cols; c += n) {
      const auto xv = hn::LoadU(d, x + c);
      s0 = hn::MulAdd(hn::LoadU(d, a + c), xv, s0);
      s1 = hn::MulAdd(hn::LoadU(d, a + cols + c), xv, s1);
      s2 = hn::MulAdd(hn::LoadU(d, a + 2 * cols + c), xv, s2);
      s3 = hn::MulAdd(hn::LoadU(d, a + 3 * cols + c), xv, s3);
    }
    float t[4] = {hn::GetLane(hn::SumOfLanes(d, s0)), hn::GetLane(hn::SumOfLanes(d, s1)),
                  hn::GetLane(hn::SumOfLanes(d, s2)), hn::GetLane(hn::SumOfLanes(d, s3))};
    for (; c < cols; ++c) {
      for (int k = 0; k < 4; ++k) t[k] += a[k * cols + c] * x[c];
    }
    for (int k = 0; k < 4; ++k) y[r + k] = t[k];
  }
  for (; r < r1; ++r) {
    const float* a = w + r * cols;
    auto s = hn::Zero(d);
    int64_t c = 0;
    for (; c + n <= cols; c += n) s = hn::MulAdd(hn::LoadU(d, a + c), hn::LoadU(d, x + c), s);
    float t = hn::GetLane(hn::SumOfLanes(d, s));
    for (; c < cols; ++c) t += a[c] * x[c];
    y[r] = t;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <fmt/format.h>

#include <cstdlib>

#include "base/thread_pool.h"

namespace kvq {

HWY_EXPORT(MatVecF32Rows);

const char* WeightTypeName(WeightType type) {
  switch (type) {
    case WeightType::kF32: return "F32";
    case WeightType::kF16: return "F16";
    case WeightType::kBf16: return "BF16";
    case WeightType::kQ8_0: return "Q8_0";
    case WeightType::kQ4_0: return "Q4_0";
  }
  return "?";
}

void MatVec(const Matrix& w, const float* x, float* y, int32_t threads) {
  if (w.type != WeightType::kF32) {
    fmt::print(stderr, "kvq: MatVec for {} weights is not implemented yet\n", WeightTypeName(w.type));
    std::abort();
  }
  const auto* a = reinterpret_cast<const float*>(w.data);
  auto* rows_fn = HWY_DYNAMIC_DISPATCH(MatVecF32Rows);
  // Blocks of 16 rows so small matrices stay on one thread and work splits evenly otherwise.
  const int64_t blocks = (w.rows + 15) / 16;
  const int32_t t = w.rows * w.cols >= (1 << 16) ? threads : 1;
  ThreadPool::Shared(t).Run(blocks, [&](int64_t b, int32_t) {
    rows_fn(a, x, y, w.cols, b * 16, std::min<int64_t>(w.rows, (b + 1) * 16));
  });
}

void MatVecReference(const Matrix& w, const float* x, float* y) {
  const auto* a = reinterpret_cast<const float*>(w.data);
  for (int64_t r = 0; r < w.rows; ++r) {
    float sum = 0.0f;
    for (int64_t c = 0; c < w.cols; ++c) sum += a[r * w.cols + c] * x[c];
    y[r] = sum;
  }
}

}  // namespace kvq
#endif
