// Per-target bodies of the dispatched kernels in dispatch.h; foreach_target re-includes this file
// once per SIMD target, and HWY_EXPORT builds the table HWY_DYNAMIC_DISPATCH picks from.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/dispatch.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd/dispatch.h"

HWY_BEFORE_NAMESPACE();
namespace kvq::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

const char* TargetNameHere() { return hwy::TargetName(HWY_TARGET); }

float DotF32Here(const float* a, const float* b, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  auto sum0 = hn::Zero(d);
  auto sum1 = hn::Zero(d);
  size_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    sum0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), sum0);
    sum1 = hn::MulAdd(hn::LoadU(d, a + i + lanes), hn::LoadU(d, b + i + lanes), sum1);
  }
  for (; i + lanes <= n; i += lanes) {
    sum0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), sum0);
  }
  float sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(sum0, sum1)));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Eight independent accumulators, so the adds' latency (4 cycles, 2 per cycle) never limits the
// loads in flight: the loop is bound by how fast the memory system delivers lines.
float SumF32Here(const float* a, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  auto s4 = hn::Zero(d), s5 = hn::Zero(d), s6 = hn::Zero(d), s7 = hn::Zero(d);
  size_t i = 0;
  for (; i + 8 * lanes <= n; i += 8 * lanes) {
    s0 = hn::Add(s0, hn::LoadU(d, a + i));
    s1 = hn::Add(s1, hn::LoadU(d, a + i + lanes));
    s2 = hn::Add(s2, hn::LoadU(d, a + i + 2 * lanes));
    s3 = hn::Add(s3, hn::LoadU(d, a + i + 3 * lanes));
    s4 = hn::Add(s4, hn::LoadU(d, a + i + 4 * lanes));
    s5 = hn::Add(s5, hn::LoadU(d, a + i + 5 * lanes));
    s6 = hn::Add(s6, hn::LoadU(d, a + i + 6 * lanes));
    s7 = hn::Add(s7, hn::LoadU(d, a + i + 7 * lanes));
  }
  for (; i + lanes <= n; i += lanes) s0 = hn::Add(s0, hn::LoadU(d, a + i));
  const auto s = hn::Add(hn::Add(hn::Add(s0, s1), hn::Add(s2, s3)), hn::Add(hn::Add(s4, s5), hn::Add(s6, s7)));
  float sum = hn::GetLane(hn::SumOfLanes(d, s));
  for (; i < n; ++i) sum += a[i];
  return sum;
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::simd {

HWY_EXPORT(TargetNameHere);
HWY_EXPORT(DotF32Here);
HWY_EXPORT(SumF32Here);

const char* DispatchedTargetName() { return HWY_DYNAMIC_DISPATCH(TargetNameHere)(); }
float DotF32(const float* a, const float* b, size_t n) {
  return HWY_DYNAMIC_DISPATCH(DotF32Here)(a, b, n);
}

float SumF32(const float* a, size_t n) { return HWY_DYNAMIC_DISPATCH(SumF32Here)(a, n); }

}  // namespace kvq::simd
#endif  // HWY_ONCE
