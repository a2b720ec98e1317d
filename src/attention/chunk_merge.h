// Merging the online-softmax states of consecutive position chunks (see kvq/attention.h): one
// query head's (m, l, acc) of the chunks so far and of the next chunk become one state. The same
// function serves every path (a thread folding its own chunks as it crosses into the next one,
// the merge of chunk states after a dispatch, FinishAttention), so the bits never depend on which.
#pragma once

#include <cstdint>

namespace kvq::attention_internal {

/// Merges (m2, l2, acc2) into (m1, l1, acc1), the earlier positions' state; acc: [head_dim].
///   m* = max(m₁, m₂); c₁ = exp(m₁ − m*), c₂ = exp(m₂ − m*); l* = l₁c₁ + l₂c₂; acc* = acc₁c₁ + acc₂c₂
/// An empty second state (m₂ = −inf) leaves the first as it is and an empty first state takes the
/// second's numbers unchanged, so merging into nothing is exact.
void MergeState(float& m1, float& l1, float* acc1, float m2, float l2, const float* acc2, int32_t head_dim);

/// Crossing into a new chunk: (m, l, acc), the open chunk's state, is merged into the merged
/// state (MergeState) and emptied (m = −inf, l = 0, acc = 0). Per query head: n_heads heads at
/// m[h], l[h], acc + h·head_dim and likewise merged_*.
void FoldOpenChunk(float* merged_m, float* merged_l, float* merged_acc, float* m, float* l, float* acc,
                   int32_t n_heads, int32_t head_dim);

}  // namespace kvq::attention_internal
