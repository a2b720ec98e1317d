// A model's weights as views into a mapped file, plus its shape: what the forward pass reads.
// Names follow llama2.c (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvq/kv_cache.h"
#include "weights/matrix.h"
#include "kvq/rope.h"

namespace kvq {

struct LlamaConfig {
  int32_t dim = 0;         ///< residual stream width
  int32_t hidden_dim = 0;  ///< FFN width
  int32_t n_layers = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t vocab_size = 0;
  int32_t seq_len = 0;     ///< context the model was trained for
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  std::string arch = "llama";   ///< llama, mistral, qwen2 or qwen3 (GGUF general.architecture)
  RopePairing rope_pairing = RopePairing::kAdjacent;
  float rope_position_scale = 1.0f;      ///< linear RoPE scaling: 1 / rope.scaling.factor
  std::vector<float> rope_freq_factors;  ///< [head_dim / 2] Llama 3.1 scaling, or empty
  /// Whether the q, k, v projections add a bias (qwen2).
  bool qkv_bias = false;
  /// Whether each q and k head is RMS-normed (own weights [head_dim]) before RoPE (qwen3).
  bool qk_norm = false;
  /// Numbers per attention head when the file says (GGUF attention.key_length); 0: dim / n_heads.
  /// With it n_heads · head_dim may differ from dim (Qwen3: 16 · 128 = 2048 for dim 1024).
  int32_t head_dim_override = 0;
  int32_t head_dim() const { return head_dim_override > 0 ? head_dim_override : dim / n_heads; }
  int32_t q_dim() const { return n_heads * head_dim(); }
  int32_t kv_dim() const { return head_dim() * n_kv_heads; }
};

struct LayerWeights {
  const float* attn_norm = nullptr;  // [dim]
  Matrix wq, wk, wv;                 // [n_heads·head_dim][dim], [kv_dim][dim], [kv_dim][dim]
  const float* bq = nullptr;         // [n_heads·head_dim] biases (qwen2), else null
  const float* bk = nullptr;         // [kv_dim]
  const float* bv = nullptr;         // [kv_dim]
  const float* q_norm = nullptr;     // [head_dim] per-head RMSNorm weights of q (qwen3), else null
  const float* k_norm = nullptr;     // [head_dim] of k
  Matrix wo;                         // [dim][n_heads·head_dim]
  const float* ffn_norm = nullptr;   // [dim]
  Matrix w1, w2, w3;                 // [hidden][dim] (gate), [dim][hidden] (down), [hidden][dim] (up)
};

/// Owns the mapping the views point into.
struct LlamaWeights {
  LlamaConfig config;
  Matrix token_embedding;            // [vocab][dim]
  std::vector<LayerWeights> layers;
  const float* final_norm = nullptr; // [dim]
  Matrix classifier;                 // [vocab][dim]
  std::shared_ptr<void> storage;     // the mapped file
  /// The Q4_0 / Q8_0 matrices repacked by RepackWeights (weights/repack.h), back to back; the
  /// matrices' views point here instead of into `storage`. Null until repacked.
  std::shared_ptr<uint8_t[]> repacked;
  std::string source;                // path, for messages
  /// What the snapshot fingerprint hashes, in order (the weight tensors, or the whole checkpoint
  /// file): views into `storage`. Hashed by Fingerprint only when a snapshot is saved or loaded,
  /// so a load does not read every weight byte for a fingerprint nobody asked for.
  std::vector<std::span<const uint8_t>> fingerprint_bytes;
  uint64_t fingerprint_seed = 0;
};

/// Repacks every Q4_0 / Q8_0 projection and the classifier into MatrixLayout::kInterleaved16 for
/// the interleaved kernels (one allocation, `repacked`), once at load; the file is unchanged and
/// the fingerprint still hashes its bytes. The token embedding stays row-major (it is read by
/// rows); a tied classifier gets its own repacked copy. With release_mapped_pages (only for
/// matrices viewing a read-only file mapping, as LoadModel's do: on writable memory MADV_DONTNEED
/// would zero them), the pages of each repacked matrix are released (madvise MADV_DONTNEED: clean
/// file pages, re-read from the page cache if anything — the fingerprint, a tied embedding's rows
/// — reads them again), so the repacked copy replaces the mapped one in resident memory rather
/// than doubling it. Returns the bytes repacked.
int64_t RepackWeights(LlamaWeights* weights, bool release_mapped_pages);

/// The snapshot fingerprint of `weights`: its attention shape and Checksum64 chained over
/// fingerprint_bytes from fingerprint_seed. Reads every byte it covers.
ModelFingerprint Fingerprint(const LlamaWeights& weights);

}  // namespace kvq
