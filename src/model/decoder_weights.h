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

/// What a layer's token mixer is in a hybrid model (qwen35, qwen35moe, qwen3next).
enum class LayerKind : uint8_t {
  kAttention,  ///< (gated) softmax attention through the KV cache
  kRecurrent,  ///< Gated DeltaNet linear attention: a fixed state per sequence, no KV rows
};

/// Which q/k head a Gated DeltaNet value head h reads (r = value heads per key head).
enum class VHeadMap : uint8_t {
  kModulo,  ///< h mod n_k_heads: qwen35/qwen35moe GGUFs (the converter tiles the V heads)
  kDivide,  ///< h div r: qwen3next GGUFs (V heads grouped by key head, as trained)
};

/// The Gated DeltaNet layers' sizes (GGUF ssm.*; docs/hybrid_models_spec.md §2).
struct DeltaNetConfig {
  int32_t conv_kernel = 0;  ///< K: taps of the causal depthwise conv (ssm.conv_kernel)
  int32_t key_dim = 0;      ///< dk: numbers per key head, = the state's rows (ssm.state_size)
  int32_t n_k_heads = 0;    ///< Hk: q/k heads (ssm.group_count)
  int32_t n_v_heads = 0;    ///< Hv: value heads, one state each (ssm.time_step_rank)
  int32_t value_dim = 0;    ///< dv: numbers per value head (ssm.inner_size / Hv)
  VHeadMap v_head_map = VHeadMap::kModulo;
  int64_t k_channels() const { return int64_t{n_k_heads} * key_dim; }        // Ck
  int64_t v_channels() const { return int64_t{n_v_heads} * value_dim; }      // Cv
  int64_t conv_channels() const { return 2 * k_channels() + v_channels(); }  // C = q, k, v
  /// The q/k head value head h reads.
  int32_t KeyHeadOf(int32_t h) const {
    return v_head_map == VHeadMap::kModulo ? h % n_k_heads : h / (n_v_heads / n_k_heads);
  }
  /// Floats of one layer's state: the conv window [C][K−1] (llama.cpp's layout: a channel's K−1
  /// raw inputs contiguous, oldest first) then the delta-rule states [Hv][dk][dv], S_h[i][j] at
  /// h·dk·dv + i·dv + j (llama.cpp keeps S transposed, j·dk + i; rows of j here let the update
  /// vectorise with each sum still in order of i).
  int64_t conv_state_floats() const { return conv_channels() * (conv_kernel - 1); }
  int64_t state_floats() const {
    return conv_state_floats() + int64_t{n_v_heads} * key_dim * value_dim;
  }
};

/// Mixture-of-experts feed-forward sizes (qwen35moe, qwen3next); n_experts 0: a dense FFN.
struct MoeConfig {
  int32_t n_experts = 0;          ///< NE (expert_count)
  int32_t n_experts_used = 0;     ///< k (expert_used_count): experts each token runs
  int32_t expert_hidden_dim = 0;  ///< Fe (expert_feed_forward_length)
  /// Fs (expert_shared_feed_forward_length): the shared expert's width, which is the model's
  /// hidden_dim in a MoE model (its gate/up/down are the layer's w1/w3/w2).
  int32_t shared_hidden_dim = 0;
};

struct DecoderConfig {
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

  // ---- hybrid models (qwen35, qwen35moe, qwen3next: docs/hybrid_models_spec.md) ----
  /// Numbers rotated per head (rope.dimension_count; Qwen3-Next: 64 of 256); 0: the whole head.
  int32_t rope_dims = 0;
  /// Gated attention: attn_q gives per head [q (head_dim), gate (head_dim)], and the attention
  /// output is multiplied by σ(gate) before attn_output.
  bool attn_output_gate = false;
  /// [n_layers] the kind of each layer; empty: every layer is attention (non-hybrid models).
  std::vector<LayerKind> layer_kinds;
  DeltaNetConfig delta_net;  ///< the recurrent layers' sizes (when any)
  MoeConfig moe;             ///< n_experts 0: dense FFN
  bool is_recurrent(int32_t layer) const {
    return !layer_kinds.empty() && layer_kinds[layer] == LayerKind::kRecurrent;
  }
  /// Layers that go through the KV cache (a hybrid's cache has only these).
  int32_t n_attention_layers() const;
  /// The cache layer of attention layer `layer` (its index among the attention layers), or the
  /// index among the recurrent layers for a recurrent one (its slot in the state).
  int32_t cache_layer(int32_t layer) const;
  /// Floats of fixed state per sequence: the recurrent layers' states back to back
  /// (KvCacheConfig::state_floats).
  int64_t state_floats() const;
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
  Matrix w1, w2, w3;  // [hidden][dim] (gate), [dim][hidden] (down), [hidden][dim] (up)
                      // (a MoE layer: its shared expert's, hidden = Fs)
  // Gated DeltaNet (recurrent layers of a hybrid; wq .. wo are then empty). C = 2·Ck + Cv.
  Matrix ssm_qkv;                   // [C][dim] q, k, v channels before the conv (attn_qkv)
  Matrix ssm_gate;                  // [Cv][dim] z, the output gate (attn_gate)
  Matrix ssm_beta, ssm_alpha;       // [Hv][dim] each (qwen35*), or empty
  Matrix ssm_ba;                    // [2·Hv][dim] qwen3next: per key head [b: r][a: r], or empty
  const float* ssm_conv = nullptr;  // [C][K] tap j of channel c at c·K + j (tap 0: oldest)
  const float* ssm_dt_bias = nullptr;  // [Hv]
  const float* ssm_a = nullptr;        // [Hv] −exp(A_log), as stored
  const float* ssm_norm = nullptr;     // [dv] shared by every value head
  Matrix ssm_out;                      // [dim][Cv]
  // Mixture of experts (n_experts > 0): expert e's rows are the slice [e·rows, (e+1)·rows).
  Matrix router;              // [n_experts][dim] F32 (ffn_gate_inp)
  Matrix gate_exps, up_exps;  // [n_experts·Fe][dim]
  Matrix down_exps;           // [n_experts·dim][Fe]
  Matrix shared_gate;         // [1][dim] the shared expert's scalar gate (ffn_gate_inp_shexp)
};

/// Owns the mapping the views point into.
struct DecoderWeights {
  DecoderConfig config;
  Matrix token_embedding;            // [vocab][dim]
  std::vector<LayerWeights> layers;
  const float* final_norm = nullptr; // [dim]
  Matrix classifier;                 // [vocab][dim]
  std::shared_ptr<void> storage;     // the mapped file
  /// The Q4_0 / Q8_0 / Q2_K / Q3_K / Q4_K / Q5_K / Q6_K matrices repacked by RepackWeights (weights/repack.h), back to
  /// back; the matrices' views point here instead of into `storage`. Null until repacked.
  std::shared_ptr<uint8_t[]> repacked;
  std::string source;                // path, for messages
  /// What the snapshot fingerprint hashes, in order (the weight tensors, or the whole checkpoint
  /// file): views into `storage`. Hashed by Fingerprint only when a snapshot is saved or loaded,
  /// so a load does not read every weight byte for a fingerprint nobody asked for.
  std::vector<std::span<const uint8_t>> fingerprint_bytes;
  uint64_t fingerprint_seed = 0;
};

/// Repacks every projection and the classifier that CanRepack takes (Q4_0, Q8_0, Q1_0 and Q2_0 where
/// their RepackPays say so, the K-quants where KQuantRepackPays: in the WebAssembly module none) into
/// MatrixLayout::kInterleaved16 for the interleaved kernels (one allocation, `repacked`), once at
/// load, and the routed experts' stacked tensors where each expert's rows are a multiple of 16
/// (then each expert's slice is its own matrix repacked: ExpertMatrix); the file is unchanged and the fingerprint still hashes its bytes. The token embedding stays row-major (it is read by
/// rows), as does every K-quant matrix, the classifier included, where KQuantRepackPays says the
/// row kernels are faster (kquant_repack.h); a tied classifier repacked gets its own copy. With release_mapped_pages (only for
/// matrices viewing a read-only file mapping, as LoadModel's do: on writable memory MADV_DONTNEED
/// would zero them), the pages of each repacked matrix are released (madvise MADV_DONTNEED: clean
/// file pages, re-read from the page cache if anything — the fingerprint, a tied embedding's rows
/// — reads them again), so the repacked copy replaces the mapped one in resident memory rather
/// than doubling it. Returns the bytes repacked.
/// `parts` picks what is repacked: the dense matrices (projections, classifier) and/or the routed
/// experts (LoadModel leaves the experts in the file's layout when their copy would not fit in
/// memory: model/load_model.h, RepackPolicy).
struct RepackParts {
  bool dense = true;
  bool experts = true;
};
int64_t RepackWeights(DecoderWeights* weights, bool release_mapped_pages, RepackParts parts = {});
/// The bytes RepackWeights allocates for `parts` of `weights` (each matrix rounded up to a cache
/// line), without repacking anything: what RepackPolicy::kAuto weighs against available memory.
int64_t RepackedBytes(const DecoderWeights& weights, RepackParts parts);
/// RepackWeights for a WebAssembly build, whose heap cannot release memory: each matrix is
/// repacked over its own bytes (the mapping is heap memory that the loader owns) a slice of rows
/// at a time through a small scratch, so the file is held once; a tied Q4_0 / Q8_0 classifier is
/// repacked over the embedding's bytes too, and the embedding then views them interleaved (its
/// rows decode to the same numbers: PlainBlock). The classifier's and projections' layout, and so
/// every bit of the logits, is RepackWeights'. The snapshot fingerprint then hashes the repacked
/// bytes (deterministic, but not native's). Returns the bytes repacked.
int64_t RepackWeightsInPlace(DecoderWeights* weights);

/// The snapshot fingerprint of `weights`: its attention shape and Checksum64 chained over
/// fingerprint_bytes from fingerprint_seed. Reads every byte it covers.
ModelFingerprint Fingerprint(const DecoderWeights& weights);

}  // namespace kvq
