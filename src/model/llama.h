// The Llama forward pass (llama2.c run.c's transformer, top to bottom), with the KV path going
// through a kvq KvCache: each layer appends its K and V rows and attends over the cache's pages.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kvq/kv_cache.h"
#include "kvq/status.h"
#include "model/llama_weights.h"

namespace kvq {

/// Observation points for measurements (kvq eval). Forward (one token) calls them; ForwardBlock
/// does not. Either may be empty.
struct ForwardHooks {
  /// After RoPE, before the cache: q [n_heads·head_dim], k and v [kv_dim] of the token at `pos`.
  std::function<void(int32_t layer, int64_t pos, const float* q, const float* k, const float* v)> on_qkv;
  /// After attention, before the output projection: out [n_heads·head_dim], which the hook may
  /// overwrite (to see what replacing one layer's attention does to the logits).
  std::function<void(int32_t layer, int64_t pos, float* attention_out)> on_attention_out;
};

class LlamaModel {
 public:
  LlamaModel(LlamaWeights weights, int32_t threads);
  const LlamaConfig& config() const { return w_.config; }
  const LlamaWeights& weights() const { return w_; }

  /// Runs `token` at position `pos` (= the cache's current length) through every layer, appending
  /// its K and V to `cache`, and writes the next-token logits [vocab_size].
  Status Forward(int32_t token, int64_t pos, KvCache& cache, float* logits);

  /// Prefill: runs `n` tokens at positions pos .. pos + n − 1 as one block (weights read once per
  /// block, K and V appended as a block, causal attention for the whole block), writing the logits
  /// after the last token. For formats without groups or calibration the bits equal n Forward
  /// calls; a KIVI group completed inside the block, or an fp8 scale calibrated on it, is seen
  /// quantised by the block's earlier tokens (as a prefill writes it).
  Status ForwardBlock(const int32_t* tokens, int32_t n, int64_t pos, KvCache& cache, float* logits);

  /// Hooks Forward calls from now on (nullptr: none). Not owned; must outlive their use.
  void set_hooks(const ForwardHooks* hooks) { hooks_ = hooks; }

  /// Attention options the model uses (scale 1/sqrt(head_dim), the SIMD kernel, its threads).
  AttentionOptions attention_options() const;

 private:
  LlamaWeights w_;
  int32_t threads_;
  const ForwardHooks* hooks_ = nullptr;
  // Activations for one token.
  std::vector<float> x_, xb_, xb2_, hb_, hb2_, q_, k_, v_;  // [dim] ×3, [hidden] ×2, [dim], [kv_dim] ×2
};

/// RMSNorm: out = weight · x / sqrt(mean(x²) + eps), as run.c computes it.
void RmsNorm(float* out, const float* x, const float* weight, int32_t n, float eps);

/// Rotary embedding in llama2.c's layout (pairs (2i, 2i+1) within each head), for `n` numbers
/// holding n / head_dim heads, at position `pos`, unscaled (model/rope.h has the general form).
void Rope(float* v, int32_t n, int32_t head_dim, int64_t pos, float theta);

/// The model's rotary parameters (pairing, scaling; `config` must outlive them: they point at
/// its frequency factors).
RopeParams ModelRopeParams(const LlamaConfig& config);

}  // namespace kvq
