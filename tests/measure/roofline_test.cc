// MeasureComputeRoofline: every width the CPU runs is measured, the best is the largest, and no
// rate is physically impossible — a rate above (lanes · 4 ports · 6 GHz) per thread would mean the
// compiler dropped or hoisted the timed work, which is the way such a benchmark silently breaks.
#include "measure/roofline.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace kvq {
namespace {

void CheckGroup(const std::vector<PeakRate>& group, double best, const std::string& best_instruction,
                int32_t threads, int32_t elems_per_macs_lane) {
  double max = 0;
  std::string max_instruction;
  for (const PeakRate& p : group) {
    SCOPED_TRACE(p.instruction);
    EXPECT_GT(p.gmacs, 0.0);
    // Multiply-adds one instruction does: lanes (bits / 32) times elements per lane.
    const double per_instruction = p.vector_bits == 0 ? 1.0 : p.vector_bits / 32.0 * elems_per_macs_lane;
    EXPECT_LT(p.gmacs, per_instruction * 4 * 6.0 * threads);
    if (p.gmacs > max) max = p.gmacs, max_instruction = p.instruction;
  }
  EXPECT_EQ(best, max);
  EXPECT_EQ(best_instruction, max_instruction);
}

TEST(Roofline, EveryRateIsPlausibleAndTheBestIsTheLargest) {
  for (int32_t threads : {1, 2}) {
    const ComputeRoofline r = MeasureComputeRoofline(threads, 1);
    ASSERT_FALSE(r.f32.empty());
    CheckGroup(r.f32, r.best_f32_gmacs, r.best_f32_instruction, threads, 1);
    CheckGroup(r.int8, r.best_int8_gmacs, r.best_int8_instruction, threads, 4);
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) {
      EXPECT_FALSE(r.int8.empty());
    }
#endif
  }
}

}  // namespace
}  // namespace kvq
