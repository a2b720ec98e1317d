// LoadLlama2c (see llama2c.h). The weight order is run.c's memory_map_weights: embedding,
// attention norms, wq, wk, wv, wo, FFN norms, w1, w2, w3, final norm, the (unused) RoPE tables
// freq_cis_real / freq_cis_imag, then the classifier when it is not shared.
#include "model/llama2c.h"

#include <fmt/format.h>

#include <cstring>
#include <limits>

#include "base/checksum.h"
#include "base/mapped_file.h"

namespace kvq {

Result<DecoderWeights> LoadLlama2c(const std::string& path) {
  Result<std::shared_ptr<MappedFile>> file = MapFile(path);
  if (!file.ok()) return file.status();
  const MappedFile& f = **file;
  constexpr int64_t kHeader = 7 * 4;
  if (f.size < kHeader) {
    return Status::Error(fmt::format("{} is too short for a llama2.c checkpoint ({} bytes, the header alone is 28)",
                                     path, f.size));
  }
  int32_t h[7];
  std::memcpy(h, f.data, sizeof(h));
  // A negative vocab_size means a separate classifier; INT32_MIN has no positive counterpart
  // (negating it is undefined: fuzz/regressions/llama2c/vocab-int32-min.bin) and reads as 0, refused below.
  const int32_t vocab = h[5] == std::numeric_limits<int32_t>::min() ? 0 : (h[5] < 0 ? -h[5] : h[5]);
  DecoderConfig c{.dim = h[0], .hidden_dim = h[1], .n_layers = h[2], .n_heads = h[3],
                .n_kv_heads = h[4], .vocab_size = vocab, .seq_len = h[6]};
  const bool shared = h[5] > 0;
  const auto bad = [&](const std::string& why) {
    return Status::Error(fmt::format("{} is not a valid llama2.c checkpoint: {} (header: dim {}, hidden_dim {}, "
                                     "layers {}, heads {}, kv heads {}, vocab {}, seq_len {})",
                                     path, why, h[0], h[1], h[2], h[3], h[4], h[5], h[6]));
  };
  if (c.dim <= 0 || c.hidden_dim <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 ||
      c.vocab_size <= 0 || c.seq_len <= 0) {
    return bad("every header field must be positive");
  }
  if (c.dim % c.n_heads != 0 || c.n_heads % c.n_kv_heads != 0) {
    return bad("dim must divide into heads and heads into KV heads");
  }
  if (c.dim > (1 << 16) || c.hidden_dim > (1 << 18) || c.n_layers > 1024 || c.vocab_size > (1 << 22) ||
      c.seq_len > (1 << 24)) {
    return bad("a dimension is implausibly large");
  }
  const int64_t d = c.dim, hd = c.hidden_dim, L = c.n_layers, kv = c.kv_dim(), hs = c.head_dim();
  const int64_t floats = c.vocab_size * d + L * d + L * d * d + 2 * L * d * kv + L * d * d + L * d +
                         3 * L * d * hd + d + c.seq_len * hs + (shared ? 0 : c.vocab_size * d);
  if (f.size != kHeader + floats * 4) {
    return bad(fmt::format("the file is {} bytes; this header needs {} (28 + {} floats)", f.size,
                           kHeader + floats * 4, floats));
  }
  DecoderWeights w;
  w.config = c;
  w.storage = *file;
  w.source = path;
  const float* p = reinterpret_cast<const float*>(f.data + kHeader);
  auto matrix = [](const float* at, int64_t rows, int64_t cols) {
    return Matrix{WeightType::kF32, reinterpret_cast<const uint8_t*>(at), rows, cols};
  };
  w.token_embedding = matrix(p, c.vocab_size, d);
  p += c.vocab_size * d;
  w.layers.resize(L);
  // Each weight is stored for all layers in a row: `rows` x `cols` floats per layer.
  auto per_layer_matrix = [&](Matrix LayerWeights::*field, int64_t rows, int64_t cols) {
    for (int64_t l = 0; l < L; ++l) w.layers[l].*field = matrix(p + l * rows * cols, rows, cols);
    p += L * rows * cols;
  };
  auto per_layer_norm = [&](const float* LayerWeights::*field) {
    for (int64_t l = 0; l < L; ++l) w.layers[l].*field = p + l * d;
    p += L * d;
  };
  per_layer_norm(&LayerWeights::attn_norm);
  per_layer_matrix(&LayerWeights::wq, d, d);
  per_layer_matrix(&LayerWeights::wk, kv, d);
  per_layer_matrix(&LayerWeights::wv, kv, d);
  per_layer_matrix(&LayerWeights::wo, d, d);
  per_layer_norm(&LayerWeights::ffn_norm);
  per_layer_matrix(&LayerWeights::w1, hd, d);
  per_layer_matrix(&LayerWeights::w2, d, hd);
  per_layer_matrix(&LayerWeights::w3, hd, d);
  w.final_norm = p;
  p += d;
  p += c.seq_len * hs;  // freq_cis_real and freq_cis_imag: kvq computes RoPE itself
  w.classifier = shared ? w.token_embedding : matrix(p, c.vocab_size, d);
  w.fingerprint_bytes.emplace_back(static_cast<const uint8_t*>(f.data), static_cast<size_t>(f.size));
  return w;
}

}  // namespace kvq
