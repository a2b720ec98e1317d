// One entry point for model files: a llama2.c checkpoint (+ tokenizer file) or a GGUF file (its
// own vocabulary unless a tokenizer file is given).
#pragma once

#include <memory>
#include <string>

#include "kvq/status.h"
#include "model/decoder_weights.h"
#include "text/tokenizer.h"

namespace kvq {

class GgufFile;  // gguf/gguf_reader.h

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

/// The weights of `model_path` (".gguf": GGUF; anything else: llama2.c) as its loader gives them:
/// views into the file, not repacked, no vocabulary read. `gguf_file` (may be null) receives the
/// opened GGUF file, left null for a llama2.c checkpoint. LoadModel and ModelFile::Read start here.
/// header_only_file_bytes > 0: `model_path` holds only the first bytes of a GGUF file of that many
/// bytes, at least its header (GgufFile::OpenHeader): every matrix and vector has null data.
Result<DecoderWeights> OpenModelWeights(const std::string& model_path, std::shared_ptr<GgufFile>* gguf_file,
                                        int64_t header_only_file_bytes = 0);

/// Loads `model_path` (".gguf": GGUF; anything else: llama2.c). `tokenizer_path` empty: the GGUF
/// file's vocabulary, or tok512.bin beside a llama2.c checkpoint. header_only_file_bytes > 0: a
/// GGUF file's header only (OpenModelWeights): the shape and vocabulary, no weight bytes, nothing
/// repacked (the page's GPU path reads the weights from the file; the CPU forward cannot run).
Result<LoadedModel> LoadModel(const std::string& model_path, const std::string& tokenizer_path,
                              int64_t header_only_file_bytes = 0);

}  // namespace kvq
