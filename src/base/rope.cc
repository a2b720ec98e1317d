// ApplyRope and Llama3RopeFreqFactors (see rope.h).
#include "kvq/rope.h"

#include <cmath>
#include <numbers>

namespace kvq {

namespace {

// The scaled position is computed once; with no scaling it is the plain float position, so an
// unscaled model rotates exactly as llama2.c's run.c does.
float ScaledPosition(int64_t pos, const RopeParams& params) {
  return params.position_scale == 1.0f ? static_cast<float>(pos)
                                       : static_cast<float>(pos) * params.position_scale;
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
    const float angle = AngleOf(i, rot, p, params);
    cos_sin[2 * i] = std::cos(angle);
    cos_sin[2 * i + 1] = std::sin(angle);
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
