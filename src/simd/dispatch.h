// Runtime SIMD dispatch, kvq's one policy: Highway compiles each kernel for the targets named in
// cmake/hwy_targets.cmake and picks the best one the CPU supports, once per call of an exported
// entry point. This header exposes what was chosen and a first dispatched kernel.
#pragma once

#include <cstddef>

namespace kvq::simd {

/// Name of the SIMD target that dispatched kernels run on here ("AVX3", "AVX2", "SCALAR", ...).
const char* DispatchedTargetName();

/// Sum of a[i] * b[i] over n floats, vectorised (lane-parallel partial sums, so the result may
/// differ from a sequential sum by rounding: callers compare within a tolerance).
float DotF32(const float* a, const float* b, size_t n);

/// Sum of n floats (lane-parallel partial sums). Used to measure streaming read bandwidth.
float SumF32(const float* a, size_t n);

}  // namespace kvq::simd
