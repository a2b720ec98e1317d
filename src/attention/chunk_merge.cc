// Chunk merges (see chunk_merge.h), the state's reset and FinishAttention.
#include "attention/chunk_merge.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kvq/attention.h"

namespace kvq {
namespace attention_internal {

void MergeState(float& m1, float& l1, float* acc1, float m2, float l2, const float* acc2, int32_t head_dim) {
  if (m2 == -INFINITY) return;  // nothing attended (or only −inf scores): adds nothing
  if (m1 == -INFINITY) {
    m1 = m2;
    l1 = l2;
    std::copy_n(acc2, head_dim, acc1);
    return;
  }
  const float m = m1 > m2 ? m1 : m2;  // not std::fmax: a libm call
  // A state whose max is the new max keeps its scale exactly (as the recurrence's c = 1).
  const float c1 = m1 == m ? 1.0f : std::exp(m1 - m);
  const float c2 = m2 == m ? 1.0f : std::exp(m2 - m);
  l1 = l1 * c1 + l2 * c2;  // no contraction to fma (-ffp-contract=off): the same bits everywhere
  for (int32_t i = 0; i < head_dim; ++i) acc1[i] = acc1[i] * c1 + acc2[i] * c2;
  m1 = m;
}

void FoldOpenChunk(float* merged_m, float* merged_l, float* merged_acc, float* m, float* l, float* acc,
                   int32_t n_heads, int32_t head_dim) {
  for (int32_t h = 0; h < n_heads; ++h) {
    float* a = acc + int64_t{h} * head_dim;
    MergeState(merged_m[h], merged_l[h], merged_acc + int64_t{h} * head_dim, m[h], l[h], a, head_dim);
    m[h] = -INFINITY;
    l[h] = 0.0f;
    std::fill_n(a, head_dim, 0.0f);
  }
}

}  // namespace attention_internal

AttentionState::AttentionState(AttentionShape shape, int32_t n_tokens)
    : shape_(shape), n_tokens_(n_tokens) {
  Reset();
}

void AttentionState::Reset() {
  const int64_t heads = int64_t{n_tokens_} * shape_.n_heads;
  for (std::vector<float>* x : {&m, &merged_m}) x->assign(heads, -std::numeric_limits<float>::infinity());
  for (std::vector<float>* x : {&l, &merged_l}) x->assign(heads, 0.0f);
  for (std::vector<float>* x : {&acc, &merged_acc}) x->assign(heads * shape_.head_dim, 0.0f);
  attended.assign(n_tokens_, 0);
}

void FinishAttention(const AttentionState& state, float* out) {
  const int64_t heads = int64_t{state.n_tokens()} * state.shape().n_heads;
  const int32_t d = state.shape().head_dim;
  for (int64_t h = 0; h < heads; ++h) {
    float l = state.l[h];
    const float* acc = state.acc.data() + h * d;
    if (state.merged_m[h] != -INFINITY) {  // earlier chunks: merge the open one into a copy of them
      float m = state.merged_m[h];
      l = state.merged_l[h];
      float* merged = out + h * d;  // [head_dim]: the merged accumulator, normalised in place below
      std::copy_n(state.merged_acc.data() + h * d, d, merged);
      attention_internal::MergeState(m, l, merged, state.m[h], state.l[h], acc, d);
      acc = merged;
    }
    for (int32_t i = 0; i < d; ++i) out[h * d + i] = l > 0.0f ? acc[i] / l : 0.0f;
  }
}

}  // namespace kvq
