// The randomized Hadamard rotation of the "rot" transform (kvq/kv_spec.h): per head,
// y = H · diag(s) · x / √d with H the d×d Sylvester-Hadamard matrix (entries ±1, H·Hᵀ = d·I) and
// s a fixed pattern of ±1 drawn from a seed — an orthonormal map, so q·k = (Rq)·(Rk) and an
// outlier channel is spread over all d channels before a format quantises them (QuaRot).
// Computed by the fast Walsh-Hadamard transform: d·log2(d) additions and one scaling per head.
#pragma once

#include <cstdint>
#include <vector>

namespace kvq {

/// The sign pattern s for head_dim d (a power of two): s[i] ∈ {+1, −1}, a function of (seed, d).
std::vector<float> RotationSigns(uint64_t seed, int32_t d);

/// x: [n_heads][d], each head replaced by R x = H · diag(signs) · x / √d.
void RotateHeads(const float* signs, int32_t d, int64_t n_heads, float* x);
/// The inverse: x: [n_heads][d], each head replaced by Rᵀ y = diag(signs) · H · y / √d.
void UnrotateHeads(const float* signs, int32_t d, int64_t n_heads, float* x);

/// A bound on ‖Rᵀ(R x) − x‖₂ / ‖x‖₂ in f32 arithmetic, to first order in u = 2⁻²⁴: each of the
/// log2(d) butterfly stages and the final scaling round once per element, in each direction.
double RotationRoundTripBound(int32_t d);

}  // namespace kvq
