// The MatVec error bounds of src/weights/matvec.h as the weight tests compute them. Derivations: tests/weights/matvec_test.cc
// (plain types) and tests/weights/matvec_quant_test.cc (quantised activation).
#pragma once

#include <cstdint>

#include "test_util/target_scope.h"  // TargetScope, which the weight tests use beside the bounds

namespace kvq::test {

inline constexpr double kU = 0x1p-24;   // unit roundoff of f32
inline constexpr double kUd = 0x1p-53;  // unit roundoff of double

/// γ_n = n·u / (1 − n·u).
inline double Gamma(int64_t n, double u = kU) { return n * u / (1.0 - n * u); }

/// Plain types: |simd − MatVecReference| ≤ (γ_cols + γ_{cols+2})·Σ_c |w_c·x_c|.
inline double PlainTolerance(int64_t cols, double abs_sum) { return (Gamma(cols) + Gamma(cols + 2)) * abs_sum; }

/// Quantised activation: |simd − QuantizedProductReference::y| ≤ (γ_{n_blocks+r} + γ'_{cols+n_blocks})·abs_sum
/// (the kernel's f32 rounding, r = the type's matvec_roundings beyond one per activation block — 4
/// for Q8_0/Q4_0 —, plus the double reference's own).
inline double QuantTolerance(int64_t cols, double abs_sum, int64_t roundings = 4) {
  const int64_t n_blocks = cols / 32;
  return (Gamma(n_blocks + roundings) + Gamma(cols + n_blocks, kUd)) * abs_sum;
}

}  // namespace kvq::test
