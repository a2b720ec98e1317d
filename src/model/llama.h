// The Llama forward pass (llama2.c run.c's transformer, top to bottom), with the KV path going
// through a kvq KvCache: each layer appends its K and V rows and attends over the cache's pages.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "kvq/kv_cache.h"
#include "kvq/status.h"
#include "model/llama_weights.h"
#include "weights/ops.h"

namespace kvq {

/// Observation points for measurements (kvq eval), called for every token of every forward
/// block (a decode step is a block of one). Either may be empty.
struct ForwardHooks {
  /// After RoPE, before the cache: q [n_heads·head_dim], k and v [kv_dim] of the token at `pos`.
  std::function<void(int32_t layer, int64_t pos, const float* q, const float* k, const float* v)> on_qkv;
  /// After attention, before the output projection: out [n_heads·head_dim], which the hook may
  /// overwrite (to see what replacing one layer's attention does to the logits).
  std::function<void(int32_t layer, int64_t pos, float* attention_out)> on_attention_out;
};

/// Seconds the forward pass spends in each phase, added to by every call while set (kvq bench
/// prefill). The phases tile the call: each clock read ends one phase and starts the next, so the
/// three sum to the call's time less a few clock reads.
struct ForwardProfile {
  double weights_s = 0;    ///< MatMul and MatVec: the layer matrices and the classifier
  double attention_s = 0;  ///< cache.Append, cache.Attend and FinishAttention
  double rest_s = 0;       ///< the embedding, norms, biases, RoPE, SwiGLU, residual adds, hooks
};

/// The forward pass: one body, ForwardBlock; a decode step is a block of one token.
class LlamaModel {
 public:
  LlamaModel(LlamaWeights weights, int32_t threads);
  const LlamaConfig& config() const { return w_.config; }
  const LlamaWeights& weights() const { return w_; }

  /// Runs `n` tokens at positions pos .. pos + n − 1 (pos = the cache's current length) as one
  /// block through every layer — weights read once per block, K and V appended as a block, causal
  /// attention for the whole block — and writes the logits [vocab_size] after the last token.
  /// For formats without groups or calibration the bits do not depend on how a sequence is cut
  /// into blocks; a KIVI group completed inside a block, or an fp8 scale calibrated on it, is
  /// seen quantised by the block's earlier tokens (as a prefill writes it).
  Status ForwardBlock(const int32_t* tokens, int32_t n, int64_t pos, KvCache& cache, float* logits);

  /// One decode step: ForwardBlock of the single token `token` at `pos`.
  Status Forward(int32_t token, int64_t pos, KvCache& cache, float* logits) {
    return ForwardBlock(&token, 1, pos, cache, logits);
  }

  /// Hooks the forward pass calls from now on (nullptr: none). Not owned; must outlive their use.
  void set_hooks(const ForwardHooks* hooks) { hooks_ = hooks; }
  /// The profile the forward pass adds its phase times to from now on (nullptr: none, and no clock
  /// is read). Not owned.
  void set_profile(ForwardProfile* profile) { profile_ = profile; }

  /// Attention options the model uses (scale 1/sqrt(head_dim), the SIMD kernel, its threads).
  AttentionOptions attention_options() const;

 private:
  // Grows the block activations to hold n tokens (kept between calls: a decode step allocates nothing).
  void ReserveBlock(int32_t n);

  LlamaWeights w_;
  int32_t threads_;
  const ForwardHooks* hooks_ = nullptr;
  ForwardProfile* profile_ = nullptr;
  int32_t block_capacity_ = 0;
  // Activations of a block of tokens, token-major.
  std::vector<float> x_, xb_, xb2_;  // [n][dim] residual stream, normed input, projection output
  std::vector<float> q_;             // [n][n_heads·head_dim]
  std::vector<float> k_, v_;         // [n][kv_dim]
  std::vector<float> k_pre_rope_;    // [n][kv_dim]: k before RoPE, for "prerope" key specs
  std::vector<float> hb_, hb2_;      // [n][hidden_dim] gate and up projections
  // The attention state (m, l, acc and its scratch) of the last block size, kept so a decode step
  // reuses it rather than building one per token.
  std::optional<AttentionState> state_;
};

/// The model's rotary parameters (pairing, scaling; `config` must outlive them: they point at
/// its frequency factors).
RopeParams ModelRopeParams(const LlamaConfig& config);
/// The same parameters, owned: what KvCacheConfig::key_rope needs for "prerope" key specs.
RopeConfig ModelRopeConfig(const LlamaConfig& config);

}  // namespace kvq
