// The gated delta rule of one value head for one token (docs/hybrid_models_spec.md §4.2 step 7),
// the inner loop of a Gated DeltaNet layer: a scalar f32 reference and a Highway kernel that gives
// the reference's bits on every SIMD target.
//
// Order of operations, the same in both (and so the same bits; no fused multiply-add anywhere):
//   for each column j < dv:
//     u = 0;  for i = 0, 1, …, dk−1:  S[i][j] = S[i][j] · γ;   u = u + S[i][j] · k[i]
//     δ = β · (v[j] − u)
//     o = 0;  for i = 0, 1, …, dk−1:  S[i][j] = S[i][j] + k[i] · δ;   o = o + S[i][j] · q[i]
//     o[j] = o · scale
// Every column is independent and each sum runs over i in index order from +0, so the kernel is
// lane-parallel over j (one lane per column, the i loop sequential in every lane) and rounds each
// product and sum exactly where the scalar loop does.
#pragma once

#include <cstdint>

namespace kvq {

/// One value head's inputs and state for one step.
struct DeltaRuleHead {
  int32_t dk = 0;            ///< key dim: rows of S
  int32_t dv = 0;            ///< value dim: columns of S
  const float* q = nullptr;  ///< [dk] L2-normed query of the head's key head
  const float* k = nullptr;  ///< [dk] L2-normed key
  const float* v = nullptr;  ///< [dv] value
  float beta = 0.0f;         ///< β = σ(b), the write strength
  float gamma = 0.0f;        ///< γ = exp(g) ∈ (0, 1], the decay applied first
  float scale = 0.0f;        ///< 1/√dk, applied to the read-out
  float* S = nullptr;        ///< [dk][dv] the head's state, S[i][j] at i·dv + j, updated in place
  float* o = nullptr;        ///< [dv] out: scale · Sᵀ q with the updated S
};

/// The scalar f32 reference: the loops above as written.
void DeltaRuleStepReference(const DeltaRuleHead& h);

/// The same step, vectorised over j; bit-identical to DeltaRuleStepReference on every target.
void DeltaRuleStep(const DeltaRuleHead& h);

/// Name of the SIMD target DeltaRuleStep dispatches to here ("AVX3", "AVX2", "SCALAR", ...).
const char* DeltaRuleTargetName();

}  // namespace kvq
