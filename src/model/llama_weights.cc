// Fingerprint (see llama_weights.h).
#include "model/llama_weights.h"

#include "base/checksum.h"

namespace kvq {

ModelFingerprint Fingerprint(const LlamaWeights& w) {
  uint64_t hash = w.fingerprint_seed;
  for (const std::span<const uint8_t> bytes : w.fingerprint_bytes) {
    hash = Checksum64(bytes.data(), bytes.size(), hash);
  }
  return {.n_layers = w.config.n_layers, .n_kv_heads = w.config.n_kv_heads,
          .head_dim = w.config.head_dim(), .weights_hash = hash};
}

}  // namespace kvq
