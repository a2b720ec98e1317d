// ApplyRope and Llama3RopeFreqFactors (see rope.h).
#include "kvq/rope.h"

#include <cmath>
#include <limits>
#include <numbers>

namespace kvq {

namespace {

// The scaled position is computed once; with no scaling it is the plain float position, as
// llama2.c's run.c has it (run.c's cosf/sinf are the C library's; CosSin's bits are kvq's own).
float ScaledPosition(int64_t pos, const RopeParams& params) {
  return params.position_scale == 1.0f ? static_cast<float>(pos)
                                       : static_cast<float>(pos) * params.position_scale;
}

// cos and sin of a float angle from IEEE double operations alone (no libm call but the exact
// std::nearbyint), so every platform gives the same bits: glibc's cosf/sinf (native) and musl's
// (the WebAssembly build) differ in the last bit for about 1 in 70 of a qwen3 head's angles,
// which moved the browser's greedy ids off native kvq run's. The angle is reduced by π/2 in
// double (k = nearest integer to a·2/π, r = a − k·π/2 with π/2 in three parts: the first two have
// 33 bits, so k·part is exact for |k| < 2^20, i.e. |a| below about 1.6e6 — positions beyond keep
// the same bits everywhere, with a larger error), then the Taylor series of sin and cos on
// |r| ≤ π/4 to the r^15 and r^16 terms (truncation below 2^-40 relative), rounded to float once:
// the correctly rounded float unless the exact value lies within about 2^-45 relative of a
// rounding boundary.
void CosSin(float angle, float* c, float* s) {
  constexpr double kTwoOverPi = 0.63661977236758134308;
  constexpr double kPio2Part1 = 1.57079632673412561417e+00;  // first 33 bits of π/2
  constexpr double kPio2Part2 = 6.07710050630396597660e-11;  // next 33 bits
  constexpr double kPio2Part3 = 2.02226624879595063154e-21;  // the rest
  const double a = angle;
  if (!std::isfinite(a)) {  // cos and sin of ±inf and NaN are NaN (C's cos/sin say so too)
    *c = *s = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  const double k = std::nearbyint(a * kTwoOverPi);
  double r = ((a - k * kPio2Part1) - k * kPio2Part2) - k * kPio2Part3;
  // a = k·π/2 + r: the quadrant k mod 4. fmod is exact, and keeps k's conversion in range.
  int quadrant = static_cast<int>(std::fmod(k, 4.0)) & 3;
  // Past about 1e15 the three parts no longer reduce a to |r| ≤ π/4 (no model's angle: a tiny
  // rope.freq_base, a fuzz finding, gave cos values of 1e21): reduced by the double nearest π/2
  // instead, with IEEE remainder (exact, so every C library gives the same r and quadrant).
  if (!(std::fabs(r) <= 0.7854)) {
    int q = 0;
    r = std::remquo(a, kPio2Part1 + kPio2Part2, &q);
    quadrant = q & 3;
  }
  const double r2 = r * r;
  // sin r = r·(1 − r²/3! + r⁴/5! − …), cos r = 1 − r²/2! + r⁴/4! − …, Horner in r².
  double sp = -1.0 / 1307674368000.0;  // −1/15!
  sp = sp * r2 + 1.0 / 6227020800.0;
  sp = sp * r2 - 1.0 / 39916800.0;
  sp = sp * r2 + 1.0 / 362880.0;
  sp = sp * r2 - 1.0 / 5040.0;
  sp = sp * r2 + 1.0 / 120.0;
  sp = sp * r2 - 1.0 / 6.0;
  const double sin_r = r + r * (r2 * sp);
  double cp = 1.0 / 20922789888000.0;  // 1/16!
  cp = cp * r2 - 1.0 / 87178291200.0;
  cp = cp * r2 + 1.0 / 479001600.0;
  cp = cp * r2 - 1.0 / 3628800.0;
  cp = cp * r2 + 1.0 / 40320.0;
  cp = cp * r2 - 1.0 / 720.0;
  cp = cp * r2 + 1.0 / 24.0;
  cp = cp * r2 - 0.5;
  const double cos_r = 1.0 + r2 * cp;
  switch (quadrant) {
    case 0: *c = static_cast<float>(cos_r), *s = static_cast<float>(sin_r); break;
    case 1: *c = static_cast<float>(-sin_r), *s = static_cast<float>(cos_r); break;
    case 2: *c = static_cast<float>(-cos_r), *s = static_cast<float>(-sin_r); break;
    default: *c = static_cast<float>(sin_r), *s = static_cast<float>(-cos_r); break;
  }
}

// The angle of pair i at scaled position p (frequencies spread over the rot rotated numbers).
float AngleOf(int32_t i, int32_t rot, float p, const RopeParams& params) {
  float freq = 1.0f / std::pow(params.theta, static_cast<float>(2 * i) / static_cast<float>(rot));
  if (params.freq_factors != nullptr) freq /= params.freq_factors[i];
  return p * freq;
}

}  // namespace

void RopeCosSin(int32_t head_dim, int64_t pos, const RopeParams& params, float* cos_sin) {
  const int32_t rot = params.rotary_dims > 0 ? params.rotary_dims : head_dim;
  const float p = ScaledPosition(pos, params);
  for (int32_t i = 0; i < rot / 2; ++i) {
    CosSin(AngleOf(i, rot, p, params), &cos_sin[2 * i], &cos_sin[2 * i + 1]);
  }
}

void RotateByCosSin(float* v, int32_t n, int32_t head_dim, const float* cos_sin, RopePairing pairing,
                    int32_t rotary_dims) {
  const int32_t half = (rotary_dims > 0 ? rotary_dims : head_dim) / 2;
  for (int32_t head = 0; head < n; head += head_dim) {
    float* h = v + head;
    for (int32_t i = 0; i < half; ++i) {
      const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
      float* a = pairing == RopePairing::kAdjacent ? h + 2 * i : h + i;
      float* b = pairing == RopePairing::kAdjacent ? h + 2 * i + 1 : h + i + half;
      const float x = *a, y = *b;
      *a = x * c - y * s;
      *b = x * s + y * c;
    }
  }
}

void ApplyRope(float* v, int32_t n, int32_t head_dim, int64_t pos, const RopeParams& params) {
  // The rotation of pair i depends on i alone, not on the head: cos and sin are computed once per
  // call for every pair and reused by every head — a prefill spent most of its non-matrix time in
  // these pow/cos/sin calls, once per head.
  const int32_t rot = params.rotary_dims > 0 ? params.rotary_dims : head_dim;
  constexpr int32_t kMaxRot = 1024;  // larger heads take a heap buffer
  float on_stack[kMaxRot];           // [rot / 2][cos, sin]
  std::vector<float> on_heap(rot > kMaxRot ? rot : 0);
  float* cos_sin = rot > kMaxRot ? on_heap.data() : on_stack;
  RopeCosSin(head_dim, pos, params, cos_sin);
  RotateByCosSin(v, n, head_dim, cos_sin, params.pairing, params.rotary_dims);
}

std::vector<float> Llama3RopeFreqFactors(int32_t head_dim, float theta, const Llama3RopeScaling& s) {
  const double low_wavelen = s.original_context / static_cast<double>(s.low_freq_factor);
  const double high_wavelen = s.original_context / static_cast<double>(s.high_freq_factor);
  std::vector<float> factors(head_dim / 2);
  for (int32_t i = 0; i < head_dim / 2; ++i) {
    const double freq = 1.0 / std::pow(static_cast<double>(theta), 2.0 * i / head_dim);
    const double wavelen = 2.0 * std::numbers::pi / freq;
    if (wavelen < high_wavelen) {
      factors[i] = 1.0f;
    } else if (wavelen > low_wavelen) {
      factors[i] = s.factor;
    } else {
      const double smooth = (s.original_context / wavelen - s.low_freq_factor) /
                            (s.high_freq_factor - s.low_freq_factor);
      // The new frequency is (1 − smooth) · freq / factor + smooth · freq; its divisor is:
      factors[i] = static_cast<float>(1.0 / ((1.0 - smooth) / s.factor + smooth));
    }
  }
  return factors;
}

}  // namespace kvq
