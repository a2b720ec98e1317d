// The Llama forward pass (llama2.c run.c's transformer, top to bottom), with the KV path going
// through a kvq KvCache: each layer appends its K and V rows and attends over the cache's pages.
#pragma once

#include <cstdint>
#include <vector>

#include "kvq/kv_cache.h"
#include "kvq/status.h"
#include "model/weights.h"

namespace kvq {

class LlamaModel {
 public:
  LlamaModel(LlamaWeights weights, int32_t threads);
  const LlamaConfig& config() const { return w_.config; }
  const LlamaWeights& weights() const { return w_; }

  /// Runs `token` at position `pos` (= the cache's current length) through every layer, appending
  /// its K and V to `cache`, and writes the next-token logits [vocab_size].
  Status Forward(int32_t token, int64_t pos, KvCache& cache, float* logits);

  /// Attention options the model uses (scale 1/sqrt(head_dim), the SIMD kernel, its threads).
  AttentionOptions attention_options() const;

 private:
  LlamaWeights w_;
  int32_t threads_;
  // Activations for one token.
  std::vector<float> x_, xb_, xb2_, hb_, hb2_, q_, k_, v_;  // [dim] ×3, [hidden] ×2, [dim], [kv_dim] ×2
};

/// RMSNorm: out = weight · x / sqrt(mean(x²) + eps), as run.c computes it.
void RmsNorm(float* out, const float* x, const float* weight, int32_t n, float eps);

/// Rotary embedding in llama2.c's layout (pairs (2i, 2i+1) within each head), for `n` numbers
/// holding n / head_dim heads, at position `pos`.
void Rope(float* v, int32_t n, int32_t head_dim, int64_t pos, float theta);

}  // namespace kvq
