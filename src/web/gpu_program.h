// The WebGPU step program: one decode step of a loaded model as an ordered list of ops over named
// activation buffers and a tensor table (each weight's type, layout and bytes in this module's
// memory), built once from DecoderConfig / DecoderWeights in DecoderModel::ForwardBatch's order, so
// the page's WGSL kernels (web/gpu/step_program.js) run the forward pass this module defines
// rather than a copy of it. Attention stays with the module's KvCache (a KvDevice streams its
// pages into GPU slots); the page hands each layer's new K and V rows to it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "kvq/status.h"
#include "model/decoder_weights.h"

namespace kvq_web {

/// One weight of the program: a matrix (rows × cols of `type` in `layout`) or a vector of f32
/// (a norm's weights, a bias: rows 1).
struct GpuTensor {
  std::string name;     ///< "blk.3.wq", "token_embd", ... (for messages)
  std::string type;     ///< the weight registry's name: "f32", "q4_0", "q1_0", ...
  std::string layout;   ///< "rows" (the file's) or "interleaved16" (weights/repack.h)
  uintptr_t address;    ///< where its bytes start in this module's memory (0: in the file only)
  /// Where its bytes start in the model file (the weights of a header-only load: the page reads
  /// them from the file, never through this module's memory); -1 when they are at `address`.
  int64_t file_offset = -1;
  int64_t bytes = 0;
  int64_t rows = 0, cols = 0;
};

/// One op. Kinds and fields (buffers by name, tensors by index into the table):
///   embed        w, y            y = row `token` of w, decoded
///   rmsnorm      w, x, y, n      y = x / sqrt(mean(x²) + eps) · w           (RmsNorm)
///   matvec       w, x, y         y = W x                                     (MatVec)
///   bias         w, y, n         y += w                                      (AddBias)
///   head_rmsnorm w, y, heads     each head of y RMS-normed in place by w [head_dim]
///   copy         x, y, n         y = x (the keys before RoPE, for a "prerope" cache)
///   rope         y, n            y's heads rotated at the step's position (RopeCosSin)
///   attention    layer, q, k, k_pre, v, y   the cache layer appends k (k_pre for a prerope
///                                key spec) and v, then y = attention of q over its positions
///   add          x, y, n         y += x
///   swiglu       x, y, n         y = silu(y) · x                             (SwiGlu)
///   argmax       x, n            the step's token: the first index of the largest x
/// A matvec with y_offset writes y[y_offset ..]. The hybrid layers' kinds (gpu_delta_net.h; the
/// sizes C, Ck, Cv, Hk, Hv, dk, dv, K are the config's delta_net):
///   head_slice   x, y, heads, n  y's head h = x's head h from number n on (x's heads 2·head_dim wide)
///   sigmoid_mul  x, y, n         y ⊙= σ(x)                                   (gated attention output)
///   ba_order     x, y            y = [b of every value head][a of every value head] from a fused
///                                ssm_ba's per key head [b of its heads][a of them]
///   dn_gate_bias w, y            y[h] = σ(y[h]) (β), y[Hv + h] = softplus(y[Hv + h] + w[h])
///   dn_gate_decay w, y           y[Hv + h] = exp(w[h] · y[Hv + h]) (γ; w is −exp(A_log))
///   conv_silu    w, x, y, state  y = SiLU(causal conv of x with the window in state), per channel
///   l2norm       y, heads, n     each head of n numbers in place: x / max(‖x‖₂, eps)
///   delta_rule   x, gates, state, y   per value head the decay-first delta rule (delta_rule.h)
///                                on state S [Hv][dk][dv] with q, k, v from x [C] and β, γ from
///                                gates [2][Hv]; y [Cv] = the read-out
///   gated_rmsnorm w, x, y, heads, n  each head of y RMS-normed by w [n], then ⊙ SiLU(x)
/// The mixture-of-experts feed-forward (gpu_moe.h; kvq's MoeRows, its RouteRow):
///   moe_route    x, sel, n, top_k   x [n] router logits, left holding their softmax; sel gets
///                                   [top_k] expert ids (u32 bits), then [top_k] weights
///   expert_matvec w, x, y, sel, n, top_k, x_stride   y [top_k][n] = expert sel[i]'s n rows of the
///                                   stacked w times x + i·x_stride (x_stride 0: one x for all)
///   moe_combine  x, y, sel, gate, n, top_k   y = σ(gate[0]) · y + Σ_i weight_i · x [i][n], in
///                                   rank order
struct GpuOp {
  std::string kind;
  int32_t w = -1;
  std::string x, y, k, k_pre, v;
  std::string state;  ///< a recurrent layer's state buffer (GpuProgram::states), kept across steps
  std::string gates;  ///< delta_rule: the [2][Hv] β and γ
  std::string sel, gate;  ///< the experts chosen and their weights; the shared expert's gate logit
  int64_t n = 0;
  int64_t y_offset = 0;  ///< matvec: where in y its rows start
  int64_t x_stride = 0;  ///< f32 elements between the ranks' inputs (expert_matvec)
  int32_t heads = 0;
  int32_t top_k = 0;   ///< experts each token runs (the MoE ops)
  int32_t layer = -1;  ///< the cache layer (attention)
};

struct GpuProgram {
  kvq::DecoderConfig config;
  std::vector<GpuTensor> tensors;
  std::vector<std::pair<std::string, int64_t>> buffers;  ///< name, f32 elements
  /// The recurrent layers' states (name, f32 elements): unlike buffers, one per program whatever
  /// the tokens in flight, kept from step to step, zeroed by a new sequence.
  std::vector<std::pair<std::string, int64_t>> states;
  std::vector<GpuOp> ops;
};

/// The program of one decode step of `w` (every layer kind the loaders build: attention, Gated
/// DeltaNet, dense and mixture-of-experts feed-forward), or the error of a tensor `header` lacks.
/// `header`: the GGUF header `w` was loaded from alone (GgufFile::OpenHeader; its weights have no
/// bytes here): each tensor is then given by its file_offset, found by its GGUF name.
kvq::Result<GpuProgram> BuildGpuProgram(const kvq::DecoderWeights& w, const kvq::GgufFile* header = nullptr);

/// The program as JSON: {config, tensors, buffers, states, ops} (the page's web/gpu/step_program.js).
std::string GpuProgramJson(const GpuProgram& p);

}  // namespace kvq_web
