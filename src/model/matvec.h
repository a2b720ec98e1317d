// Weight matrix × activation vector, the bulk of a decode step's work: y = W x for W [rows][cols].
// A SIMD kernel per weight type (Highway dispatch, once per call) split across the thread pool by
// rows, and a plain scalar reference beside it for tests.
#pragma once

#include <cstdint>

#include "model/weights.h"

namespace kvq {

/// y[r] = Σ_c W[r][c] · x[c], rows split across `threads`.
void MatVec(const Matrix& w, const float* x, float* y, int32_t threads);

/// The same, one row at a time in plain C++ (sequential sums): the oracle for tests.
void MatVecReference(const Matrix& w, const float* x, float* y);

}  // namespace kvq
