// The model architectures kvq runs, by id (ModelInfo::architecture names them: "llama", "qwen2",
// ...). The table of what kvq does with each is the GGUF layer's (src/gguf/architectures.h); this
// enum is public so that a tool over the public headers (kvq synth's SynthSpec) can name one.
#pragma once

#include <cstdint>

namespace kvq {

/// One per architecture, in the architecture table's order.
enum class ArchId : uint8_t { kLlama, kQwen2, kMistral, kQwen3, kQwen35, kQwen35Moe, kQwen3Next };

}  // namespace kvq
