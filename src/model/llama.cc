// LlamaModel::Forward (see llama.h): RMSNorm, q/k/v projections (+ bias for qwen2), RoPE, the cache (append, then
// attend), output projection, SwiGLU feed-forward, final norm, classifier — run.c's order.
#include "model/llama.h"

#include <cmath>
#include <cstring>

#include "weights/matvec.h"

namespace kvq {

void RmsNorm(float* out, const float* x, const float* weight, int32_t n, float eps) {
  float ss = 0.0f;
  for (int32_t i = 0; i < n; ++i) ss += x[i] * x[i];
  ss = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int32_t i = 0; i < n; ++i) out[i] = weight[i] * (ss * x[i]);
}

void Rope(float* v, int32_t n, int32_t head_dim, int64_t pos, float theta) {
  ApplyRope(v, n, head_dim, pos, {.theta = theta});
}

RopeParams ModelRopeParams(const LlamaConfig& c) {
  return {.theta = c.rope_theta, .pairing = c.rope_pairing, .position_scale = c.rope_position_scale,
          .freq_factors = c.rope_freq_factors.empty() ? nullptr : c.rope_freq_factors.data()};
}

namespace {
void AddBias(float* v, const float* bias, int64_t n) {
  if (bias == nullptr) return;
  for (int64_t i = 0; i < n; ++i) v[i] += bias[i];
}
}  // namespace

LlamaModel::LlamaModel(LlamaWeights weights, int32_t threads) : w_(std::move(weights)), threads_(threads) {
  const LlamaConfig& c = w_.config;
  x_.resize(c.dim);
  xb_.resize(c.dim);
  xb2_.resize(c.dim);
  hb_.resize(c.hidden_dim);
  hb2_.resize(c.hidden_dim);
  q_.resize(c.dim);
  k_.resize(c.kv_dim());
  v_.resize(c.kv_dim());
}

AttentionOptions LlamaModel::attention_options() const {
  return {.scale = 1.0f / std::sqrt(static_cast<float>(w_.config.head_dim())),
          .kernel = AttentionKernel::kSimd, .threads = threads_};
}

Status LlamaModel::Forward(int32_t token, int64_t pos, KvCache& cache, float* logits) {
  const LlamaConfig& c = w_.config;
  const int32_t dim = c.dim;
  DecodeWeightRow(w_.token_embedding, token, x_.data());
  const RopeParams rope = ModelRopeParams(c);
  const AttentionShape shape{.n_heads = c.n_heads, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim()};
  AttentionState state(shape, 1);
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w_.layers[l];
    RmsNorm(xb_.data(), x_.data(), L.attn_norm, dim, c.norm_eps);
    MatVec(L.wq, xb_.data(), q_.data(), threads_);
    MatVec(L.wk, xb_.data(), k_.data(), threads_);
    MatVec(L.wv, xb_.data(), v_.data(), threads_);
    AddBias(q_.data(), L.bq, dim);
    AddBias(k_.data(), L.bk, c.kv_dim());
    AddBias(v_.data(), L.bv, c.kv_dim());
    ApplyRope(q_.data(), dim, c.head_dim(), pos, rope);
    ApplyRope(k_.data(), c.kv_dim(), c.head_dim(), pos, rope);
    if (hooks_ && hooks_->on_qkv) hooks_->on_qkv(l, pos, q_.data(), k_.data(), v_.data());
    if (Status s = cache.Append(l, k_.data(), v_.data(), 1); !s.ok()) return s;
    state.Reset();
    if (Status s = cache.Attend(l, attention_options(), q_.data(), pos, state); !s.ok()) return s;
    FinishAttention(state, xb_.data());
    if (hooks_ && hooks_->on_attention_out) hooks_->on_attention_out(l, pos, xb_.data());
    MatVec(L.wo, xb_.data(), xb2_.data(), threads_);
    for (int32_t i = 0; i < dim; ++i) x_[i] += xb2_[i];

    RmsNorm(xb_.data(), x_.data(), L.ffn_norm, dim, c.norm_eps);
    MatVec(L.w1, xb_.data(), hb_.data(), threads_);
    MatVec(L.w3, xb_.data(), hb2_.data(), threads_);
    for (int32_t i = 0; i < c.hidden_dim; ++i) {
      const float g = hb_[i];
      hb_[i] = g * (1.0f / (1.0f + std::exp(-g))) * hb2_[i];  // SwiGLU: silu(w1 x) · (w3 x)
    }
    MatVec(L.w2, hb_.data(), xb_.data(), threads_);
    for (int32_t i = 0; i < dim; ++i) x_[i] += xb_[i];
  }
  RmsNorm(x_.data(), x_.data(), w_.final_norm, dim, c.norm_eps);
  MatVec(w_.classifier, x_.data(), logits, threads_);
  return Status::Ok();
}

Status LlamaModel::ForwardBlock(const int32_t* tokens, int32_t n, int64_t pos, KvCache& cache,
                                float* logits) {
  if (n == 1) return Forward(tokens[0], pos, cache, logits);
  const LlamaConfig& c = w_.config;
  const int64_t dim = c.dim, kv = c.kv_dim(), hidden = c.hidden_dim;
  // Activations for the block: [n][dim] etc.
  std::vector<float> x(n * dim), xb(n * dim), xb2(n * dim), q(n * dim), k(n * kv), v(n * kv);
  std::vector<float> hb(n * hidden), hb2(n * hidden);
  for (int32_t t = 0; t < n; ++t) DecodeWeightRow(w_.token_embedding, tokens[t], x.data() + t * dim);
  const RopeParams rope = ModelRopeParams(c);
  const AttentionShape shape{.n_heads = c.n_heads, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim()};
  AttentionState state(shape, n);
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w_.layers[l];
    for (int32_t t = 0; t < n; ++t) RmsNorm(xb.data() + t * dim, x.data() + t * dim, L.attn_norm, c.dim, c.norm_eps);
    MatMul(L.wq, xb.data(), n, q.data(), threads_);
    MatMul(L.wk, xb.data(), n, k.data(), threads_);
    MatMul(L.wv, xb.data(), n, v.data(), threads_);
    for (int32_t t = 0; t < n; ++t) {
      AddBias(q.data() + t * dim, L.bq, dim);
      AddBias(k.data() + t * kv, L.bk, kv);
      AddBias(v.data() + t * kv, L.bv, kv);
      ApplyRope(q.data() + t * dim, c.dim, c.head_dim(), pos + t, rope);
      ApplyRope(k.data() + t * kv, c.kv_dim(), c.head_dim(), pos + t, rope);
    }
    if (Status s = cache.Append(l, k.data(), v.data(), n); !s.ok()) return s;
    state.Reset();
    if (Status s = cache.Attend(l, attention_options(), q.data(), pos, state); !s.ok()) return s;
    FinishAttention(state, xb.data());
    MatMul(L.wo, xb.data(), n, xb2.data(), threads_);
    for (int64_t i = 0; i < n * dim; ++i) x[i] += xb2[i];
    for (int32_t t = 0; t < n; ++t) RmsNorm(xb.data() + t * dim, x.data() + t * dim, L.ffn_norm, c.dim, c.norm_eps);
    MatMul(L.w1, xb.data(), n, hb.data(), threads_);
    MatMul(L.w3, xb.data(), n, hb2.data(), threads_);
    for (int64_t i = 0; i < n * hidden; ++i) {
      const float g = hb[i];
      hb[i] = g * (1.0f / (1.0f + std::exp(-g))) * hb2[i];
    }
    MatMul(L.w2, hb.data(), n, xb.data(), threads_);
    for (int64_t i = 0; i < n * dim; ++i) x[i] += xb[i];
  }
  float* last = x.data() + (n - 1) * dim;
  RmsNorm(last, last, w_.final_norm, c.dim, c.norm_eps);
  MatVec(w_.classifier, last, logits, threads_);
  return Status::Ok();
}

}  // namespace kvq
