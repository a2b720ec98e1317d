// MoeToken and ExpertMatrix (see moe.h).
#include "model/moe.h"

#include <algorithm>
#include <cmath>

#include "weights/matvec.h"
#include "weights/ops.h"

namespace kvq {

Matrix ExpertMatrix(const Matrix& stacked, int64_t expert, int64_t rows) {
  Matrix m = stacked;
  m.data = stacked.data + expert * rows * MatrixRowBytes(stacked.type, stacked.cols);
  m.rows = rows;
  return m;
}

void MoeToken(const LlamaConfig& c, const LayerWeights& L, const float* x, const float* shared,
              float* out, MoeScratch* s, int32_t threads) {
  const int32_t n_experts = c.moe.n_experts, k = c.moe.n_experts_used, fe = c.moe.expert_hidden_dim;
  s->probs.resize(n_experts);
  s->gate.resize(fe);
  s->up.resize(fe);
  s->expert_out.resize(c.dim);
  // Softmax over all experts first, then the top k renormalised (not a softmax of the top k).
  float* p = s->probs.data();
  MatVec(L.router, x, p, threads);
  float top = -INFINITY;
  for (int32_t e = 0; e < n_experts; ++e) top = std::max(top, p[e]);
  float sum = 0.0f;
  for (int32_t e = 0; e < n_experts; ++e) sum += p[e] = std::exp(p[e] - top);
  for (int32_t e = 0; e < n_experts; ++e) p[e] /= sum;
  s->chosen.resize(n_experts);
  for (int32_t e = 0; e < n_experts; ++e) s->chosen[e] = e;
  std::partial_sort(s->chosen.begin(), s->chosen.begin() + k, s->chosen.end(),
                    [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  float chosen_sum = 0.0f;
  for (int32_t i = 0; i < k; ++i) chosen_sum += p[s->chosen[i]];
  // The shared expert first, scaled by its gate; the routed experts are added in rank order.
  float shared_logit = 0.0f;
  MatVec(L.shared_gate, x, &shared_logit, threads);
  const float shared_weight = 1.0f / (1.0f + std::exp(-shared_logit));
  for (int32_t i = 0; i < c.dim; ++i) out[i] = shared_weight * shared[i];
  for (int32_t i = 0; i < k; ++i) {
    const int32_t e = s->chosen[i];
    const float weight = p[e] / chosen_sum;
    MatVec(ExpertMatrix(L.gate_exps, e, fe), x, s->gate.data(), threads);
    MatVec(ExpertMatrix(L.up_exps, e, fe), x, s->up.data(), threads);
    SwiGlu(s->gate.data(), s->up.data(), fe);
    MatVec(ExpertMatrix(L.down_exps, e, c.dim), s->gate.data(), s->expert_out.data(), threads);
    for (int32_t j = 0; j < c.dim; ++j) out[j] += weight * s->expert_out[j];
  }
}

}  // namespace kvq
