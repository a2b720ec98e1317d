// llama2.c checkpoints (the legacy "version 0" layout of karpathy/llama2.c's run.c: a 7-int32
// header, then float32 weights) and llama2.c tokenizer files.
#pragma once

#include <string>

#include "kvq/status.h"
#include "model/decoder_weights.h"

namespace kvq {

/// Loads a checkpoint: header {dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size
/// (negative: a separate classifier follows), seq_len}, then the weights in run.c's order. The
/// file size must match the header exactly; errors name the file and what was expected.
Result<DecoderWeights> LoadLlama2c(const std::string& path);

}  // namespace kvq
