// DeltaRuleStep and its reference (see delta_rule.h). foreach_target re-includes this file once
// per SIMD target; HWY_EXPORT builds the table HWY_DYNAMIC_DISPATCH picks from.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/delta_rule.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "model/delta_rule.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Columns [j, j + kVectors·lanes) of the step, each column's sums in registers (one lane per
// column): the strip of S (dk rows of kVectors vectors) is read twice while it sits in L1.
template <int kVectors, class D>
HWY_INLINE void StepStrip(D d, const DeltaRuleHead& h, int32_t j) {
  using V = hn::Vec<D>;
  const size_t lanes = hn::Lanes(d);
  const V gamma = hn::Set(d, h.gamma), beta = hn::Set(d, h.beta), scale = hn::Set(d, h.scale);
  V acc[kVectors];  // u, then δ, per vector of columns
  for (int v = 0; v < kVectors; ++v) acc[v] = hn::Zero(d);
  for (int32_t i = 0; i < h.dk; ++i) {
    float* row = h.S + int64_t{i} * h.dv + j;
    const V ki = hn::Set(d, h.k[i]);
    for (int v = 0; v < kVectors; ++v) {
      const V s = hn::Mul(hn::LoadU(d, row + v * lanes), gamma);  // decay first
      hn::StoreU(s, d, row + v * lanes);
      acc[v] = hn::Add(acc[v], hn::Mul(s, ki));
    }
  }
  for (int v = 0; v < kVectors; ++v) {
    acc[v] = hn::Mul(beta, hn::Sub(hn::LoadU(d, h.v + j + v * lanes), acc[v]));  // δ
  }
  V out[kVectors];
  for (int v = 0; v < kVectors; ++v) out[v] = hn::Zero(d);
  for (int32_t i = 0; i < h.dk; ++i) {
    float* row = h.S + int64_t{i} * h.dv + j;
    const V ki = hn::Set(d, h.k[i]), qi = hn::Set(d, h.q[i]);
    for (int v = 0; v < kVectors; ++v) {
      const V s = hn::Add(hn::LoadU(d, row + v * lanes), hn::Mul(ki, acc[v]));  // rank-1 update
      hn::StoreU(s, d, row + v * lanes);
      out[v] = hn::Add(out[v], hn::Mul(s, qi));  // read with the updated state
    }
  }
  for (int v = 0; v < kVectors; ++v) hn::StoreU(hn::Mul(out[v], scale), d, h.o + j + v * lanes);
}

// One column in scalar code, for the columns past the last whole vector (the same operations).
HWY_INLINE void StepColumn(const DeltaRuleHead& h, int32_t j) {
  float u = 0.0f;
  for (int32_t i = 0; i < h.dk; ++i) {
    float& s = h.S[int64_t{i} * h.dv + j];
    s = s * h.gamma;
    u = u + s * h.k[i];
  }
  const float delta = h.beta * (h.v[j] - u);
  float o = 0.0f;
  for (int32_t i = 0; i < h.dk; ++i) {
    float& s = h.S[int64_t{i} * h.dv + j];
    s = s + h.k[i] * delta;
    o = o + s * h.q[i];
  }
  h.o[j] = o * h.scale;
}

void DeltaRuleStepHere(const DeltaRuleHead& h) {
  const hn::ScalableTag<float> d;
  const auto lanes = static_cast<int32_t>(hn::Lanes(d));
  int32_t j = 0;
  for (; j + 4 * lanes <= h.dv; j += 4 * lanes) StepStrip<4>(d, h, j);
  for (; j + lanes <= h.dv; j += lanes) StepStrip<1>(d, h, j);
  for (; j < h.dv; ++j) StepColumn(h, j);
}

const char* DeltaRuleTargetNameHere() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq {

HWY_EXPORT(DeltaRuleStepHere);
HWY_EXPORT(DeltaRuleTargetNameHere);

void DeltaRuleStep(const DeltaRuleHead& h) { HWY_DYNAMIC_DISPATCH(DeltaRuleStepHere)(h); }
const char* DeltaRuleTargetName() { return HWY_DYNAMIC_DISPATCH(DeltaRuleTargetNameHere)(); }

void DeltaRuleStepReference(const DeltaRuleHead& h) {
  for (int32_t j = 0; j < h.dv; ++j) {
    float u = 0.0f;
    for (int32_t i = 0; i < h.dk; ++i) {
      float& s = h.S[int64_t{i} * h.dv + j];
      s = s * h.gamma;  // decay first
      u = u + s * h.k[i];
    }
    const float delta = h.beta * (h.v[j] - u);  // move towards v by β
    float o = 0.0f;
    for (int32_t i = 0; i < h.dk; ++i) {
      float& s = h.S[int64_t{i} * h.dv + j];
      s = s + h.k[i] * delta;  // rank-1 update
      o = o + s * h.q[i];      // read with the updated state
    }
    h.o[j] = o * h.scale;
  }
}

}  // namespace kvq
#endif  // HWY_ONCE
