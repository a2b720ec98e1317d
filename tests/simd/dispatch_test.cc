// The dispatched f32 dot product, run on every SIMD target compiled in, against a double sum.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/dispatch_test.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/tests/hwy_gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "simd/dispatch.h"

HWY_BEFORE_NAMESPACE();
namespace kvq::simd {
namespace HWY_NAMESPACE {

// Runs the public (dispatched) entry point with Highway's test mock restricting the CPU's
// supported targets to the one under test, so each compiled target's body is exercised.
void TestDotF32AgreesWithDouble() {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (size_t n : {0, 1, 3, 7, 8, 15, 16, 17, 31, 33, 100, 1000}) {
    std::vector<float> a(n), b(n);
    double exact = 0.0, magnitude = 0.0;
    for (size_t i = 0; i < n; ++i) {
      a[i] = dist(rng);
      b[i] = dist(rng);
      exact += static_cast<double>(a[i]) * b[i];
      magnitude += std::fabs(static_cast<double>(a[i]) * b[i]);
    }
    // Any summation order of n f32 products errs by at most about n·eps·Σ|a·b| (eps = 2^-24);
    // 2n bounds products and adds.
    const double bound = 2.0 * (n + 1) * std::ldexp(1.0, -24) * magnitude;
    EXPECT_NEAR(DotF32(a.data(), b.data(), n), exact, bound) << "n=" << n;
  }
  EXPECT_STRNE(DispatchedTargetName(), "");
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::simd {
HWY_BEFORE_TEST(DispatchTest);
HWY_EXPORT_AND_TEST_P(DispatchTest, TestDotF32AgreesWithDouble);
}  // namespace kvq::simd
#endif
