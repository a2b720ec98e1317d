// The Gated DeltaNet token mixer of hybrid models (qwen35, qwen35moe, qwen3next), one token of one
// sequence at a time in the normative recurrent form (docs/hybrid_models_spec.md §4.2): a causal
// depthwise conv over the raw q/k/v channels with a rolling window of the last K−1 inputs, SiLU,
// L2-normed q and k per key head, then per value head the decay-first delta rule on a dk × dv
// state read back with the updated state, and a gated RMSNorm. The projections before it and
// ssm_out after it are plain matrix products the forward pass runs over a whole block; a block
// is this scan token by token, so a block prefill gives the same bits as decoding it.
#pragma once

#include <cstdint>
#include <vector>

#include "base/thread_pool.h"
#include "model/llama_weights.h"

namespace kvq {

/// One token's inputs to a recurrent layer: the projections of its normed residual row.
struct DeltaNetInput {
  const float* qkv = nullptr;    // [C] raw q, k, v channels (attn_qkv · x), before the conv
  const float* z = nullptr;      // [Cv] output gate (attn_gate · x)
  const float* beta = nullptr;   // [Hv] b, before the sigmoid
  const float* alpha = nullptr;  // [Hv] a, before softplus(a + dt_bias)
};

/// Scratch DeltaNetToken reuses between calls (sized on first use; a decode step allocates
/// nothing).
struct DeltaNetScratch {
  std::vector<float> conv_out;  // [C] SiLU(conv) of every channel, then q and k L2-normed in place
  std::vector<float> head_out;  // [threads][2][dv] one value head's read-out and δ, per thread
};

/// Runs one token through the layer's recurrence: updates `state` (DeltaNetConfig::state_floats
/// floats: the conv window [C][K−1], then S [Hv][dk][dv]) in place and writes out [Cv], the
/// gated-normed value heads that ssm_out projects. `eps` is the model's RMS epsilon, used by the
/// L2 norm (llama.cpp's floor form x / max(‖x‖, eps)) and the gated RMSNorm. The value heads are
/// split across the pool's threads (each head's arithmetic is the same on any thread: the bits do
/// not depend on the thread count).
void DeltaNetToken(const DeltaNetConfig& c, const LayerWeights& L, float eps,
                   const DeltaNetInput& in, float* state, float* out, DeltaNetScratch* scratch,
                   ThreadPool& pool);

}  // namespace kvq
