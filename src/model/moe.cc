// MoeRows and ExpertMatrix (see moe.h), RouteRow (moe_route.h).
#include "model/moe.h"
#include "model/moe_route.h"

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

void RouteRow(float* p, int64_t n_experts, int64_t k, int32_t* order, int32_t* chosen, float* weights) {
  // A softmax over all experts first, then the top k renormalised.
  float top = -INFINITY;
  for (int64_t e = 0; e < n_experts; ++e) top = std::max(top, p[e]);
  float sum = 0.0f;
  for (int64_t e = 0; e < n_experts; ++e) sum += p[e] = std::exp(p[e] - top);
  for (int64_t e = 0; e < n_experts; ++e) p[e] /= sum;
  for (int32_t e = 0; e < n_experts; ++e) order[e] = e;
  std::partial_sort(order, order + k, order + n_experts,
                    [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  float chosen_sum = 0.0f;
  for (int64_t i = 0; i < k; ++i) chosen_sum += p[order[i]];
  for (int64_t i = 0; i < k; ++i) {
    chosen[i] = order[i];
    weights[i] = p[order[i]] / chosen_sum;
  }
}

int64_t MoeRows(const DecoderConfig& c, const LayerWeights& L, const float* x, int64_t n,
                const float* shared, float* out, MoeScratch* s, ThreadPool& pool) {
  const int64_t n_experts = c.moe.n_experts, k = c.moe.n_experts_used, fe = c.moe.expert_hidden_dim;
  const int64_t dim = c.dim;
  s->probs.resize(n * n_experts);
  s->order.resize(n_experts);
  s->chosen.resize(n * k);
  s->weights.resize(n * k);
  s->shared_logit.resize(n);
  s->first.assign(n_experts + 1, 0);
  s->slots.resize(n * k);
  // The router and the shared expert's gate read the same rows: one hand-off for both.
  const MatMulOutput router_and_gate[] = {{&L.router, s->probs.data()}, {&L.shared_gate, s->shared_logit.data()}};
  MatMulGroup(router_and_gate, x, n, pool);
  for (int64_t r = 0; r < n; ++r) {
    RouteRow(s->probs.data() + r * n_experts, n_experts, k, s->order.data(), s->chosen.data() + r * k,
             s->weights.data() + r * k);
    for (int64_t i = 0; i < k; ++i) ++s->first[s->chosen[r * k + i] + 1];
  }
  // Slots grouped by expert (a counting sort, rows in order within an expert).
  for (int64_t e = 0; e < n_experts; ++e) s->first[e + 1] += s->first[e];
  s->next.assign(s->first.begin(), s->first.end() - 1);  // the next free slot per expert
  for (int64_t slot = 0; slot < n * k; ++slot) s->slots[s->next[s->chosen[slot]]++] = slot;
  // Each chosen expert once, over the rows that chose it: the rows gathered by expert, then every
  // expert's gate and up in one hand-off to the pool and every down in another (MatMulRuns), not
  // two per expert — a block of 64 tokens routes about 2 rows to each of ~220 of 256 experts.
  const int64_t m_all = n * k;  // gathered rows: one per slot
  s->x_rows.resize(m_all * dim);
  s->gate.resize(m_all * fe);
  s->up.resize(m_all * fe);
  s->y_rows.resize(m_all * dim);
  s->gathered_at.resize(m_all);
  for (int64_t i = 0; i < m_all; ++i) {
    std::copy_n(x + s->slots[i] / k * dim, dim, s->x_rows.data() + i * dim);
    s->gathered_at[s->slots[i]] = i;
  }
  s->experts.clear();
  int64_t bytes_read = 0;
  for (int64_t e = 0; e < n_experts; ++e) {
    if (s->first[e + 1] == s->first[e]) continue;
    s->experts.push_back({.w = {ExpertMatrix(L.gate_exps, e, fe), ExpertMatrix(L.up_exps, e, fe),
                                ExpertMatrix(L.down_exps, e, dim)},
                          .first = s->first[e],
                          .n = s->first[e + 1] - s->first[e]});
    for (const Matrix& w : s->experts.back().w)
      bytes_read += w.rows * MatrixRowBytes(w.type, w.cols);
  }
  s->runs.clear();  // gate and up of every chosen expert
  for (const MoeScratch::Expert& ex : s->experts) {
    s->runs.push_back({.w = &ex.w[0],
                       .first_token = ex.first,
                       .n_tokens = ex.n,
                       .y = s->gate.data() + ex.first * fe});
    s->runs.push_back({.w = &ex.w[1],
                       .first_token = ex.first,
                       .n_tokens = ex.n,
                       .y = s->up.data() + ex.first * fe});
  }
  MatMulRuns(s->runs, s->x_rows.data(), m_all, pool);
  SwiGlu(s->gate.data(), s->up.data(), m_all * fe);
  s->runs.clear();  // down of every chosen expert
  for (const MoeScratch::Expert& ex : s->experts) {
    s->runs.push_back({.w = &ex.w[2],
                       .first_token = ex.first,
                       .n_tokens = ex.n,
                       .y = s->y_rows.data() + ex.first * dim});
  }
  MatMulRuns(s->runs, s->gate.data(), m_all, pool);
  // The shared expert scaled by its gate, then the routed experts added in rank order.
  for (int64_t r = 0; r < n; ++r) {
    const float shared_weight = 1.0f / (1.0f + std::exp(-s->shared_logit[r]));
    float* o = out + r * dim;
    for (int64_t j = 0; j < dim; ++j) o[j] = shared_weight * shared[r * dim + j];
    for (int64_t i = 0; i < k; ++i) {
      const float w = s->weights[r * k + i];
      const float* y = s->y_rows.data() + s->gathered_at[r * k + i] * dim;
      for (int64_t j = 0; j < dim; ++j) o[j] += w * y[j];
    }
  }
  return bytes_read;
}

}  // namespace kvq
