// The tensor list a synth file is made of (internal to src/synth): synth.cc walks it to validate,
// plan and write, and synth_hybrid.cc adds the hybrid architectures' layers and keys to it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gguf/gguf_writer.h"
#include "kvq/status.h"
#include "synth/synth.h"

namespace kvq {

/// One tensor of the file, in llama.cpp's converter order (rope_freqs, token_embd, each block,
/// output_norm, output).
struct SynthTensorEntry {
  enum Kind {
    kMatrix,     // random, in --type
    kOnes,       // F32 1.0 (norms)
    kBias,       // F32 small random (biases, ssm_dt.bias)
    kRopeFreqs,  // F32 Llama3RopeFreqFactors
    kF32Matrix,  // random like a matrix, always F32 (ssm_conv1d, ffn_gate_inp, ffn_gate_inp_shexp)
    kSsmA,       // F32 −exp(u), u uniform on (−1, 1)
  } kind;
  std::string name;
  int64_t cols = 0, rows = 0;                          // rows 0: a vector of cols numbers
  SynthTensorRole role = SynthTensorRole::kTokenEmbd;  // matrices
  int64_t layer = -1;                                  // the block, or −1
  int64_t experts = 0;  // > 0: a 3-D tensor [cols, rows, experts] (experts stacked)
  /// An output projection (attn_output, ffn_down, ssm_out, the experts' down projections): its
  /// product is what the layer adds to the residual stream, so --layer-output-scale scales it.
  bool adds_to_residual = false;
  /// GGUF dims: [cols], [cols, rows] or [cols, rows, experts].
  std::vector<int64_t> dims() const {
    if (rows == 0) return {cols};
    if (experts > 0) return {cols, rows, experts};
    return {cols, rows};
  }
  /// Rows of the matrix it is drawn and encoded as (1 for a vector).
  int64_t total_rows() const { return (rows == 0 ? 1 : rows) * (experts > 0 ? experts : 1); }
};

/// Appends layer `layer` of a hybrid spec (spec.is_hybrid()): its norms, its token mixer (Gated
/// DeltaNet or gated attention) and its FFN (dense or experts + shared expert), the layer's last
/// tensor a kFfnDown matrix.
void AppendHybridLayer(const SynthSpec& spec, int64_t layer, std::vector<SynthTensorEntry>* out);

/// The hybrid metadata keys (full_attention_interval, ssm.*, expert_*, the partial RoPE width).
std::vector<Status> WriteHybridKeys(const SynthSpec& spec, GgufWriter* w);

/// --layer-output-scale's checks (layer_output_scale.cc): FROM a layer of the spec, SCALE finite and
/// >= 0. Errors name the flag.
Status ValidateLayerOutputScale(const SynthSpec& spec);

/// What matrix `e` is multiplied by before it is encoded: --layer-output-scale's SCALE for an output
/// projection (adds_to_residual) of a layer at or after FROM, else 1.
float SynthOutputScale(const SynthSpec& spec, const SynthTensorEntry& e);

/// The hybrid-only checks: sizes in range, heads dividing, no type mix. Errors name the field.
Status ValidateHybridSpec(const SynthSpec& spec);

}  // namespace kvq
