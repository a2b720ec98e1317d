// The mixture-of-experts feed-forward of qwen35moe and qwen3next (notes/qwen3next_spec.md §4.5),
// one token at a time: a softmax over every expert's router logit, the top k renormalised, each
// chosen expert's SwiGLU read from its slice of the 3-D expert tensors only (a token touches k of
// n_experts experts' bytes), plus the always-on shared expert scaled by its sigmoid gate.
#pragma once

#include <cstdint>
#include <vector>

#include "model/llama_weights.h"

namespace kvq {

/// Expert e's matrix in a stacked expert tensor [n_experts · rows][cols]: rows [e·rows, (e+1)·rows),
/// a view of the same bytes (the tensor must be row-major).
Matrix ExpertMatrix(const Matrix& stacked, int64_t expert, int64_t rows);

/// Scratch MoeToken reuses between calls.
struct MoeScratch {
  std::vector<float> probs;        // [n_experts] router softmax
  std::vector<int32_t> chosen;     // [k] experts, most probable first
  std::vector<float> gate, up;     // [Fe]
  std::vector<float> expert_out;   // [dim]
};

/// out [dim] = Σ_{e ∈ top k} w_e · down_e(silu(gate_e x) ⊙ up_e x) + σ(shared_gate · x) · shared,
/// with x [dim] the normed row and shared [dim] the shared expert's output for it. The experts'
/// products are MatVec over `threads`; the routing, the weighting and the sums are scalar f32.
/// Ties in probability go to the lower expert index.
void MoeToken(const LlamaConfig& c, const LayerWeights& L, const float* x, const float* shared,
              float* out, MoeScratch* scratch, int32_t threads);

}  // namespace kvq
