// RmsNorm, AddBias, Rope (see ops.h); SwiGlu is vectorised in swiglu.cc.
#include "weights/ops.h"

#include <cmath>

namespace kvq {

void RmsNorm(float* out, const float* x, const float* weight, int32_t n, float eps) {
  float ss = 0.0f;
  for (int32_t i = 0; i < n; ++i) ss += x[i] * x[i];
  ss = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int32_t i = 0; i < n; ++i) out[i] = weight[i] * (ss * x[i]);
}

void AddBias(float* v, const float* bias, int64_t n) {
  if (bias == nullptr) return;
  for (int64_t i = 0; i < n; ++i) v[i] += bias[i];
}

void Rope(float* v, int32_t n, int32_t head_dim, int64_t pos, float theta) {
  ApplyRope(v, n, head_dim, pos, {.theta = theta});
}

}  // namespace kvq
