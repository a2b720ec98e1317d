// The hybrid architectures' part of the GGUF loader: qwen35 (dense), qwen35moe and qwen3next —
// Gated DeltaNet layers with gated full attention every few layers, and (the last two) a
// mixture-of-experts FFN. Metadata keys, tensor names and shapes follow llama.cpp
// (docs/hybrid_models_spec.md §2, §3); LoadGgufLlama calls these for those architectures.
#pragma once

#include <string>

#include "gguf/architectures.h"
#include "gguf/gguf_reader.h"
#include "kvq/status.h"
#include "model/decoder_weights.h"
#include "model/gguf_tensors.h"

namespace kvq {

/// Reads the hybrid keys under `pre` ("qwen35moe.") into `c`, whose common keys (dims, heads,
/// head size, rope base, epsilon) are read already; block_count is reduced by
/// nextn_predict_layers (the MTP layers kvq does not run). Sets the layer kinds, the Gated DeltaNet
/// and MoE sizes, partial RoPE, the output gate, qk norms and (MoE) hidden_dim = the shared
/// expert's width. Errors name the file and the key.
Status ReadHybridConfig(const GgufFile& file, const std::string& pre, const Architecture& arch,
                        DecoderConfig* c);

/// Layer `layer`'s tensors: the norms, its token mixer (Gated DeltaNet or gated attention) and
/// its FFN (dense or experts + shared expert).
Status LoadHybridLayer(GgufTensorReader& t, const DecoderConfig& c, const Architecture& arch,
                       int32_t layer, LayerWeights* L);

}  // namespace kvq
