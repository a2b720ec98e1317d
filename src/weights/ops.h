// The element-wise and per-row operations of a transformer block besides the matrix products:
// RMSNorm, the SwiGLU gate, bias addition and llama2.c's plain RoPE. Plain scalar code in run.c's
// order of operations: the forward pass and the tests' reference forwards share these bodies, so a
// reference differs from the fast path only where the fast path really differs (matvec, attention).
#pragma once

#include <cstdint>

#include "kvq/rope.h"

namespace kvq {

/// RMSNorm: out = weight · x / sqrt(mean(x²) + eps), as run.c computes it. out may alias x.
void RmsNorm(float* out, const float* x, const float* weight, int32_t n, float eps);

/// SwiGLU in place: gate[i] = silu(gate[i]) · up[i] for i in [0, n).
void SwiGlu(float* gate, const float* up, int64_t n);

/// v[i] += bias[i] for i in [0, n); nothing when bias is null (models without biases).
void AddBias(float* v, const float* bias, int64_t n);

/// Rotary embedding in llama2.c's layout (pairs (2i, 2i+1) within each head), for `n` numbers
/// holding n / head_dim heads, at position `pos`, unscaled (kvq/rope.h has the general form).
void Rope(float* v, int32_t n, int32_t head_dim, int64_t pos, float theta);

}  // namespace kvq
