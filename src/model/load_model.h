// One entry point for model files: a llama2.c checkpoint (+ tokenizer file) or a GGUF file (its
// own vocabulary unless a tokenizer file is given).
#pragma once

#include <string>

#include "kvq/status.h"
#include "model/decoder_weights.h"
#include "text/tokenizer.h"

namespace kvq {

struct LoadedModel {
  DecoderWeights weights;
  Tokenizer tokenizer;
  std::string chat_template;  ///< the GGUF's tokenizer.chat_template, or ""
  /// Numbers in the weight matrices, as the file stores them (a tied classifier counted once;
  /// norm weights and biases aside).
  int64_t parameters = 0;
  /// The matrices' types by their share of those numbers, largest first: "q4_0 96%, q6_k 4%".
  std::string weight_types;
};

/// Loads `model_path` (".gguf": GGUF; anything else: llama2.c). `tokenizer_path` empty: the GGUF
/// file's vocabulary, or tok512.bin beside a llama2.c checkpoint.
Result<LoadedModel> LoadModel(const std::string& model_path, const std::string& tokenizer_path);

}  // namespace kvq
