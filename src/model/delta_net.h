// The Gated DeltaNet token mixer of hybrid models (qwen35, qwen35moe, qwen3next) over a block of
// one sequence's tokens, in the normative recurrent form (docs/hybrid_models_spec.md §4.2): a
// causal depthwise conv over the raw q/k/v channels with a rolling window of the last K−1
// inputs, SiLU, L2-normed q and k per key head, then per value head the decay-first delta rule
// (model/delta_rule.h) on a dk × dv state read back with the updated state, and a gated RMSNorm.
// The projections before it and ssm_out after it are plain matrix products the forward pass runs
// over a whole block. Each value head scans the block's tokens left to right with exactly the
// operations of one decode step, so a block prefill gives the bits of decoding it token by token.
#pragma once

#include <cstdint>
#include <vector>

#include "base/thread_pool.h"
#include "model/decoder_weights.h"

namespace kvq {

/// A block's inputs to a recurrent layer: the projections of its normed residual rows, row t of
/// each at t times its width.
struct DeltaNetInput {
  const float* qkv = nullptr;    // [n][C] raw q, k, v channels (attn_qkv · x), before the conv
  const float* z = nullptr;      // [n][Cv] output gate (attn_gate · x)
  const float* beta = nullptr;   // [n][Hv] b, before the sigmoid
  const float* alpha = nullptr;  // [n][Hv] a, before softplus(a + dt_bias)
};

/// Scratch DeltaNetBlock reuses between calls (sized by the largest block seen; a decode step
/// allocates nothing).
struct DeltaNetScratch {
  std::vector<float> conv_out;  // [n][C] SiLU(conv) of every channel, then q and k L2-normed
  std::vector<float> head_out;  // [threads][dv] one value head's read-out, per thread
};

/// Runs n tokens of one sequence through the layer's recurrence: updates `state`
/// (DeltaNetConfig::state_floats floats: the conv window [C][K−1], then S [Hv][dk][dv]) in place
/// and writes out [n][Cv], the gated-normed value heads that ssm_out projects. `eps` is the
/// model's RMS epsilon, used by the L2 norm (llama.cpp's floor form x / max(‖x‖, eps)) and the
/// gated RMSNorm. Channels, then value heads, are split across the pool's threads; each channel's
/// and each head's arithmetic is the same on any thread, so the bits do not depend on the thread count.
void DeltaNetBlock(const DeltaNetConfig& c, const LayerWeights& L, float eps,
                   const DeltaNetInput& in, int64_t n, float* state, float* out,
                   DeltaNetScratch* scratch, ThreadPool& pool);

}  // namespace kvq
