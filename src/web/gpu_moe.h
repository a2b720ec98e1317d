// The step program's mixture-of-experts feed-forward (qwen35moe, qwen3next): the ops that give
// DecoderModel's MoE FFN for one token (the shared expert's SwiGLU, then MoeRows: the router's
// softmax and top k, the chosen experts' SwiGLUs read from their slices of the stacked expert
// tensors by ids the GPU chose, the weighted sum after the gated shared expert).
#pragma once

#include <string>

#include "model/decoder_weights.h"
#include "web/gpu_program_builder.h"

namespace kvq_web {

/// The activation buffers the MoE ops of `c` use ([f32 elements] each), added to `p`.
void AddMoeBuffers(const kvq::DecoderConfig& c, GpuProgram* p);

/// Layer L's feed-forward after its ffn_norm (the normed input in "xb"; its output added to "x"),
/// `blk` the layer's GGUF prefix ("blk.3.").
void AddMoeFfnOps(const kvq::DecoderConfig& c, const kvq::LayerWeights& L, const std::string& blk,
                  GpuProgramBuilder* b);

/// A program of layer `layer`'s MoE feed-forward alone (buffers x, xb, xb2, hb, hb2 and the MoE
/// ones; the ops AddMoeFfnOps adds), for the page's tests of these ops against MoeRows; an error
/// when the model has no MoE layers or `layer` is out of range.
kvq::Result<GpuProgram> BuildMoeFfnProgram(const kvq::DecoderWeights& w, int32_t layer);

}  // namespace kvq_web
