// Llama-family models from GGUF files (llama.cpp's format): shape from the `<arch>.*` metadata,
// weights as views into the file's mapping, tensors of any type in the weight-type registry.
#pragma once

#include <memory>
#include <string>

#include "kvq/status.h"
#include "gguf/gguf_reader.h"
#include "model/decoder_weights.h"

namespace kvq {

/// Loads the model in an opened GGUF file. `general.architecture` must be "llama" (Llama 2 and 3,
/// TinyLlama, the bundled stories model), "mistral" or "qwen2"; any other is refused by name.
/// RoPE: linear scaling (rope.scaling.type "linear") and Llama 3.1 frequency factors (the
/// rope_freqs.weight tensor) are applied; other scalings are refused. qwen2: q/k/v biases and
/// half-split rotation. A sliding window (mistral) caps the usable context at the window. Every tensor's presence,
/// type and shape is checked against the metadata; errors name the file and the tensor.
Result<DecoderWeights> LoadGgufLlama(std::shared_ptr<GgufFile> file);

}  // namespace kvq
