// A scope that routes Highway's dynamic dispatch to one SIMD target, so a test can run a kernel
// on every target the build compiled and the CPU supports (hwy::SupportedAndGeneratedTargets).
#pragma once

#include <hwy/targets.h>

#include <cstdint>

namespace kvq::test {

/// Routes dynamic dispatch to target `t` for the scope's lifetime.
struct TargetScope {
  explicit TargetScope(int64_t t) { hwy::SetSupportedTargetsForTest(t); }
  ~TargetScope() { hwy::SetSupportedTargetsForTest(0); }
  TargetScope(const TargetScope&) = delete;
  TargetScope& operator=(const TargetScope&) = delete;
};

}  // namespace kvq::test
