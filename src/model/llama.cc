// LlamaModel::ForwardBlock (see llama.h): per layer RMSNorm, q/k/v projections (+ bias for qwen2,
// + a per-head RMSNorm of q and k for qwen3), RoPE, the cache (append, then attend), output projection, SwiGLU feed-forward; then the final
// norm and the classifier on the last token — run.c's order, for a block of tokens at once.
#include "model/llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "weights/matvec.h"

namespace kvq {
namespace {

// Charges the time since the previous charge (or since construction) to one phase of a
// ForwardProfile; without a profile it reads no clock, so an unprofiled pass pays one branch.
class PhaseClock {
 public:
  explicit PhaseClock(ForwardProfile* profile) : profile_(profile) {
    if (profile_ != nullptr) last_ = std::chrono::steady_clock::now();
  }
  void Charge(double ForwardProfile::*phase) {
    if (profile_ == nullptr) return;
    const auto now = std::chrono::steady_clock::now();
    profile_->*phase += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }

 private:
  ForwardProfile* profile_;
  std::chrono::steady_clock::time_point last_;
};

constexpr auto kWeights = &ForwardProfile::weights_s;
constexpr auto kAttention = &ForwardProfile::attention_s;
constexpr auto kRest = &ForwardProfile::rest_s;

}  // namespace

RopeParams ModelRopeParams(const LlamaConfig& c) {
  return {.theta = c.rope_theta, .pairing = c.rope_pairing, .position_scale = c.rope_position_scale,
          .freq_factors = c.rope_freq_factors.empty() ? nullptr : c.rope_freq_factors.data()};
}

RopeConfig ModelRopeConfig(const LlamaConfig& c) {
  return {.theta = c.rope_theta, .pairing = c.rope_pairing, .position_scale = c.rope_position_scale,
          .freq_factors = c.rope_freq_factors};
}

LlamaModel::LlamaModel(LlamaWeights weights, int32_t threads) : w_(std::move(weights)), threads_(threads) {
  ReserveBlock(1);
}

void LlamaModel::ReserveBlock(int32_t n) {
  if (n <= block_capacity_) return;
  const LlamaConfig& c = w_.config;
  const int64_t q_dim = int64_t{c.n_heads} * c.head_dim();
  x_.resize(n * int64_t{c.dim});
  // xb holds the normed input [n][dim] and the attention output [n][q_dim]: q_dim may exceed dim.
  xb_.resize(n * std::max<int64_t>(c.dim, q_dim));
  xb2_.resize(n * int64_t{c.dim});
  q_.resize(n * q_dim);
  k_.resize(n * int64_t{c.kv_dim()});
  v_.resize(n * int64_t{c.kv_dim()});
  k_pre_rope_.resize(n * int64_t{c.kv_dim()});
  hb_.resize(n * int64_t{c.hidden_dim});
  hb2_.resize(n * int64_t{c.hidden_dim});
  block_capacity_ = n;
}

AttentionOptions LlamaModel::attention_options() const {
  return {.scale = 1.0f / std::sqrt(static_cast<float>(w_.config.head_dim())),
          .kernel = AttentionKernel::kSimd, .threads = threads_};
}

Status LlamaModel::ForwardBlock(const int32_t* tokens, int32_t n, int64_t pos, KvCache& cache,
                                float* logits) {
  if (n <= 0) return Status::Error("ForwardBlock: a block needs at least one token");
  PhaseClock clock(profile_);
  ReserveBlock(n);
  const LlamaConfig& c = w_.config;
  const int64_t dim = c.dim, kv = c.kv_dim(), hidden = c.hidden_dim;
  const int64_t q_dim = c.q_dim(), hd = c.head_dim();
  float* x = x_.data();
  float* xb = xb_.data();
  float* xb2 = xb2_.data();
  float* q = q_.data();
  float* k = k_.data();
  float* v = v_.data();
  float* hb = hb_.data();
  float* hb2 = hb2_.data();
  for (int32_t t = 0; t < n; ++t) DecodeWeightRow(w_.token_embedding, tokens[t], x + t * dim);
  const RopeParams rope = ModelRopeParams(c);
  const AttentionShape shape{.n_heads = c.n_heads, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim()};
  if (!state_ || state_->n_tokens() != n) state_.emplace(shape, n);
  AttentionState& state = *state_;
  const KvCacheConfig& cc = cache.config();
  bool rope_checked = false;  // a "prerope" cache must rope keys as this model does
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w_.layers[l];
    const size_t spec = cc.layers.size() == 1 ? 0 : static_cast<size_t>(l);
    const bool pre_rope = spec < cc.layers.size() && cc.layers[spec].key_transforms.pre_rope;
    if (pre_rope && !rope_checked) {
      if (!cc.key_rope || *cc.key_rope != ModelRopeConfig(c)) {
        return Status::Error("ForwardBlock: the KV cache stores keys before RoPE (a prerope spec) "
                             "but was not given this model's RoPE parameters (KvCacheConfig::key_rope "
                             "= ModelRopeConfig)");
      }
      rope_checked = true;
    }
    for (int32_t t = 0; t < n; ++t) RmsNorm(xb + t * dim, x + t * dim, L.attn_norm, c.dim, c.norm_eps);
    clock.Charge(kRest);
    MatMul(L.wq, xb, n, q, threads_);
    MatMul(L.wk, xb, n, k, threads_);
    MatMul(L.wv, xb, n, v, threads_);
    clock.Charge(kWeights);
    for (int32_t t = 0; t < n; ++t) {
      AddBias(q + t * q_dim, L.bq, q_dim);
      AddBias(k + t * kv, L.bk, kv);
      AddBias(v + t * kv, L.bv, kv);
      if (c.qk_norm) {  // qwen3: each head normed on its own, in place, before the rotation
        for (int64_t h = t * q_dim; h < (t + 1) * q_dim; h += hd) RmsNorm(q + h, q + h, L.q_norm, c.head_dim(), c.norm_eps);
        for (int64_t h = t * kv; h < (t + 1) * kv; h += hd) RmsNorm(k + h, k + h, L.k_norm, c.head_dim(), c.norm_eps);
      }
      ApplyRope(q + t * q_dim, static_cast<int32_t>(q_dim), c.head_dim(), pos + t, rope);
      if (pre_rope) std::copy_n(k + t * kv, kv, k_pre_rope_.data() + t * kv);  // the cache's rows
      ApplyRope(k + t * kv, c.kv_dim(), c.head_dim(), pos + t, rope);  // hooks see roped keys
      if (hooks_ && hooks_->on_qkv) hooks_->on_qkv(l, pos + t, q + t * q_dim, k + t * kv, v + t * kv);
    }
    clock.Charge(kRest);
    if (Status s = cache.Append(l, pre_rope ? k_pre_rope_.data() : k, v, n); !s.ok()) return s;
    state.Reset();
    if (Status s = cache.Attend(l, attention_options(), q, pos, state); !s.ok()) return s;
    cache.FinishAttention(l, state, xb);  // [n][n_heads·head_dim]
    clock.Charge(kAttention);
    if (hooks_ && hooks_->on_attention_out) {
      for (int32_t t = 0; t < n; ++t) hooks_->on_attention_out(l, pos + t, xb + t * q_dim);
    }
    clock.Charge(kRest);
    MatMul(L.wo, xb, n, xb2, threads_);
    clock.Charge(kWeights);
    for (int64_t i = 0; i < n * dim; ++i) x[i] += xb2[i];

    for (int32_t t = 0; t < n; ++t) RmsNorm(xb + t * dim, x + t * dim, L.ffn_norm, c.dim, c.norm_eps);
    clock.Charge(kRest);
    MatMul(L.w1, xb, n, hb, threads_);
    MatMul(L.w3, xb, n, hb2, threads_);
    clock.Charge(kWeights);
    SwiGlu(hb, hb2, n * hidden);  // silu(w1 x) · (w3 x)
    clock.Charge(kRest);
    MatMul(L.w2, hb, n, xb, threads_);
    clock.Charge(kWeights);
    for (int64_t i = 0; i < n * dim; ++i) x[i] += xb[i];
  }
  float* last = x + (n - 1) * dim;
  RmsNorm(last, last, w_.final_norm, c.dim, c.norm_eps);
  clock.Charge(kRest);
  MatVec(w_.classifier, last, logits, threads_);
  clock.Charge(kWeights);
  return Status::Ok();
}

}  // namespace kvq
