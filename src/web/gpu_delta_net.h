// The step program's ops for the hybrid models' layers (qwen35, qwen35moe, qwen3next): a Gated
// DeltaNet token mixer in model/delta_net.h's order, and the gated attention output of their
// attention layers (DecoderModel::ForwardBatch's attn_output_gate branch). A DeltaNet layer's
// state lives in the program's states (on the GPU, from step to step), never in its buffers.
#pragma once

#include <cstdint>

#include "model/decoder_weights.h"
#include "web/gpu_program_builder.h"

namespace kvq_web {

/// The program's buffers and states for `c`'s recurrent layers and gated attention (none for a
/// model with neither).
void AddHybridBuffers(const kvq::DecoderConfig& c, GpuProgram* p);

/// Recurrent layer `layer` (its weights L): the normed rows "xb" through the Gated DeltaNet mixer,
/// its ssm_out projection into "xb2".
void AddDeltaNetOps(GpuProgramBuilder& b, const kvq::DecoderConfig& c, const kvq::LayerWeights& L, int32_t layer);

/// Gated attention: attn_q's per-head [q, gate] (written to "qg" by the q projection) split into
/// "q" and "attn_gate".
void AddAttentionGateSplit(GpuProgramBuilder& b, const kvq::DecoderConfig& c);
/// Gated attention: the attention output "xb" ⊙ σ("attn_gate"), before the output projection.
void AddAttentionGate(GpuProgramBuilder& b, const kvq::DecoderConfig& c);

}  // namespace kvq_web
