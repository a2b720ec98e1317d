// The mixture-of-experts feed-forward of qwen35moe and qwen3next (docs/hybrid_models_spec.md §4.5)
// over a block of rows: per row a softmax over every expert's router logit and the top k
// renormalised; then per expert the rows that chose it, gathered and run as one block through
// its SwiGLU — read from its slice of the 3-D expert tensors only (a block touches only the
// experts its tokens chose, each once; all experts' gate and up products go to the pool as one
// hand-off and all down products as another, MatMulRuns) — plus the always-on shared expert
// scaled by its sigmoid gate. Every row gets the bits it would get alone (MatMul is MatVec per row,
// SwiGLU elementwise, and each row adds its experts in rank order), so a block prefill equals
// decoding it.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "base/thread_pool.h"
#include "model/decoder_weights.h"
#include "weights/matvec.h"

namespace kvq {

/// Expert e's matrix in a stacked expert tensor [n_experts · rows][cols]: rows [e·rows,
/// (e+1)·rows), a view of the same bytes in the stack's layout. A repacked stack is one only where
/// rows is a multiple of 16 (RepackWeights), so the slice starts on a 16-row group and is that
/// expert's matrix repacked (a repacked matrix keeps each group at its rows' plain offset).
Matrix ExpertMatrix(const Matrix& stacked, int64_t expert, int64_t rows);

/// Scratch MoeRows reuses between calls (sized by the largest block seen).
struct MoeScratch {
  std::vector<float> probs;         // [n][n_experts] router softmax
  std::vector<int32_t> order;       // [n_experts] ranking scratch
  std::vector<int32_t> chosen;      // [n][k] experts, most probable first
  std::vector<float> weights;       // [n][k] renormalised probabilities
  std::vector<float> shared_logit;  // [n]
  std::vector<int64_t> first;       // [n_experts + 1] where each expert's slots start in `slots`
  std::vector<int64_t> slots;       // [n·k] row·k + rank, grouped by expert
  std::vector<int64_t> next;        // [n_experts] counting-sort cursor
  std::vector<float> x_rows;        // [n·k][dim] the rows in slot order (grouped by expert)
  std::vector<float> gate, up;      // [n·k][Fe]
  std::vector<float> y_rows;        // [n·k][dim] each slot's expert output, in slot order
  std::vector<int64_t> gathered_at;  // [n·k] row·k + rank -> its place in slot order
  struct Expert {                    // one chosen expert: its slices, its rows in slot order
    std::array<Matrix, 3> w;         // gate, up, down
    int64_t first = 0, n = 0;        // slots [first, first + n)
  };
  std::vector<Expert> experts;  // [chosen experts] in index order
  std::vector<MatMulRun> runs;  // [≤ 2 · chosen experts] one MatMulRuns call's products
};

/// For each of n rows: out = σ(shared_gate · x) · shared + Σ_{rank < k} w · down_e(silu(gate_e x) ⊙
/// up_e x), with x [n][dim] the normed rows and shared [n][dim] the shared expert's outputs; out
/// may alias shared. Ties in probability go to the lower expert index. Returns the bytes of routed
/// expert weights read: the chosen experts' gate, up and down slices, each expert once however
/// many rows chose it (kvq bench decode's per-step weight bytes).
int64_t MoeRows(const DecoderConfig& c, const LayerWeights& L, const float* x, int64_t n,
             const float* shared, float* out, MoeScratch* scratch, ThreadPool& pool);

}  // namespace kvq
