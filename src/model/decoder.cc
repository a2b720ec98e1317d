// DecoderModel::ForwardBatch (see decoder.h): per layer RMSNorm, q/k/v projections (+ bias for qwen2,
// + a per-head RMSNorm of q and k for qwen3), RoPE, the cache (append, then attend), output
// projection, SwiGLU feed-forward; then the final norm and the classifier on the last token —
// run.c's order, for the rows of every segment at once, each segment attending over its own cache.
// ForwardBlock is the batch of one segment.
#include "model/decoder.h"

#include <fmt/format.h>

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

// Whether seg's logit_rows end with its last row, whose logits seg.logits also asks for: the
// classifier then runs over that row once (a verifier asking for every row of its pass).
bool LastRowAsked(const ForwardSegment& seg) {
  return seg.n_logit_rows > 0 && seg.logit_rows[seg.n_logit_rows - 1] == seg.n - 1;
}

// Whether `layer`'s key spec stores keys before RoPE (a "prerope" spec).
bool KeysBeforeRope(const KvCacheConfig& cc, int32_t layer) {
  const size_t spec = cc.layers.size() == 1 ? 0 : static_cast<size_t>(layer);
  return spec < cc.layers.size() && cc.layers[spec].key_transforms.pre_rope;
}

// What ForwardBatch refuses before it runs anything (decoder.h).
Status CheckSegments(const DecoderConfig& c, std::span<const ForwardSegment> segments) {
  if (segments.empty()) return Status::Error("ForwardBatch: no segments");
  for (size_t i = 0; i < segments.size(); ++i) {
    const ForwardSegment& seg = segments[i];
    if (seg.n <= 0 || seg.tokens == nullptr) {
      return Status::Error(
          fmt::format("ForwardBatch: segment {} has no tokens (a block needs at least one)", i));
    }
    for (int32_t t = 0; t < seg.n; ++t) {
      if (seg.tokens[t] < 0 || seg.tokens[t] >= c.vocab_size) {
        return Status::Error(
            fmt::format("ForwardBatch: segment {}: token {} at index {} is outside the vocabulary "
                        "[0, {})",
                        i, seg.tokens[t], t, c.vocab_size));
      }
    }
    const bool rows_missing = seg.logit_rows == nullptr || seg.row_logits == nullptr;
    if (seg.n_logit_rows < 0 || (seg.n_logit_rows > 0 && rows_missing)) {
      return Status::Error(fmt::format(
          "ForwardBatch: segment {}: n_logit_rows is {} but logit_rows or row_logits is null (or "
          "the count is negative)",
          i, seg.n_logit_rows));
    }
    for (int32_t j = 0; j < seg.n_logit_rows; ++j) {
      const int32_t row = seg.logit_rows[j];
      if (row < 0 || row >= seg.n || (j > 0 && row <= seg.logit_rows[j - 1])) {
        return Status::Error(fmt::format(
            "ForwardBatch: segment {}: logit_rows[{}] is {}; expected a row in [0, {}) after the "
            "previous one (increasing)",
            i, j, row, seg.n));
      }
    }
    for (size_t j = 0; j < i; ++j) {
      if (&segments[j].cache == &seg.cache) {
        return Status::Error(
            fmt::format("ForwardBatch: segments {} and {} share one KV cache", j, i));
      }
    }
    const KvCacheConfig& cc = seg.cache.config();
    if (cc.n_layers < c.n_attention_layers() || seg.cache.state_floats() != c.state_floats()) {
      return Status::Error(fmt::format(
          "ForwardBatch: segment {}: the KV cache has {} layers and {} floats of state; this "
          "model needs {} attention layers and {} floats of recurrent state",
          i, cc.n_layers, seg.cache.state_floats(), c.n_attention_layers(), c.state_floats()));
    }
    // The cache owns the position: a segment starting elsewhere would leave a gap or overwrite.
    if (cc.n_layers > 0 && seg.cache.positions(0) != seg.pos) {
      return Status::Error(fmt::format(
          "ForwardBatch: segment {} starts at position {} but its KV cache holds {} positions (a "
          "segment continues the cache: pos = positions)",
          i, seg.pos, seg.cache.positions(0)));
    }
    bool pre_rope = false;  // a "prerope" cache must rope keys as this model does
    for (int32_t l = 0; l < c.n_attention_layers(); ++l)
      pre_rope = pre_rope || KeysBeforeRope(cc, l);
    if (pre_rope && (!cc.key_rope || *cc.key_rope != ModelRopeConfig(c))) {
      return Status::Error(
          fmt::format("ForwardBatch: segment {}: the KV cache stores keys before RoPE (a prerope "
                      "spec) but was not given this model's RoPE parameters "
                      "(KvCacheConfig::key_rope = ModelRopeConfig)",
                      i));
    }
  }
  return Status::Ok();
}

}  // namespace

RopeParams ModelRopeParams(const DecoderConfig& c) {
  return {.theta = c.rope_theta,
          .pairing = c.rope_pairing,
          .position_scale = c.rope_position_scale,
          .freq_factors = c.rope_freq_factors.empty() ? nullptr : c.rope_freq_factors.data(),
          .rotary_dims = c.rope_dims};
}

RopeConfig ModelRopeConfig(const DecoderConfig& c) {
  return {.theta = c.rope_theta,
          .pairing = c.rope_pairing,
          .position_scale = c.rope_position_scale,
          .freq_factors = c.rope_freq_factors,
          .rotary_dims = c.rope_dims};
}

DecoderModel::DecoderModel(DecoderWeights weights, int32_t threads) : w_(std::move(weights)), threads_(threads) {
  Reserve(1, 1, 1);
}

void DecoderModel::Reserve(int64_t n_rows, size_t n_segments, int64_t n_classified) {
  const DecoderConfig& c = w_.config;
  if (n_rows > row_capacity_) {
    const int64_t q_dim = c.q_dim();
    x_.resize(n_rows * int64_t{c.dim});
    // xb holds the normed input [n][dim] and the attention output [n][q_dim]: q_dim may exceed dim.
    xb_.resize(n_rows * std::max<int64_t>(c.dim, q_dim));
    xb2_.resize(n_rows * int64_t{c.dim});
    q_.resize(n_rows * q_dim);
    k_.resize(n_rows * int64_t{c.kv_dim()});
    v_.resize(n_rows * int64_t{c.kv_dim()});
    k_pre_rope_.resize(n_rows * int64_t{c.kv_dim()});
    hb_.resize(n_rows * int64_t{c.hidden_dim});
    hb2_.resize(n_rows * int64_t{c.hidden_dim});
    if (c.attn_output_gate) {
      qg_.resize(n_rows * 2 * q_dim);
      gate_.resize(n_rows * q_dim);
    }
    if (c.n_attention_layers() < c.n_layers) {
      const DeltaNetConfig& d = c.delta_net;
      ssm_qkv_.resize(n_rows * d.conv_channels());
      ssm_z_.resize(n_rows * d.v_channels());
      ssm_ba_.resize(n_rows * 2 * d.n_v_heads);
      ssm_beta_.resize(n_rows * d.n_v_heads);
      ssm_alpha_.resize(n_rows * d.n_v_heads);
      ssm_out_.resize(n_rows * d.v_channels());
    }
    row_capacity_ = n_rows;
  }
  const int64_t m = n_classified;
  if (m * c.dim > static_cast<int64_t>(last_.size())) last_.resize(m * c.dim);
  if (m * c.vocab_size > static_cast<int64_t>(logits_.size())) logits_.resize(m * c.vocab_size);
  if (n_segments > states_of_.size()) states_of_.resize(n_segments);
}

void DecoderModel::AssignStates(std::span<const ForwardSegment> segments) {
  const DecoderConfig& c = w_.config;
  const AttentionShape shape{
      .n_heads = c.n_heads, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim()};
  state_taken_.assign(states_.size(), 0);
  bool all_found = true;
  for (size_t i = 0; i < segments.size(); ++i) {  // first the states that fit as they are
    states_of_[i] = nullptr;
    for (size_t j = 0; j < states_.size() && states_of_[i] == nullptr; ++j) {
      if (!state_taken_[j] && states_[j]->n_tokens() == segments[i].n) {
        state_taken_[j] = 1;
        states_of_[i] = states_[j].get();
      }
    }
    all_found = all_found && states_of_[i] != nullptr;
  }
  if (all_found) return;
  for (size_t i = 0; i < segments.size(); ++i) {  // then a free state rebuilt, or a new one
    if (states_of_[i] != nullptr) continue;
    size_t j = 0;
    while (j < states_.size() && state_taken_[j]) ++j;
    if (j == states_.size()) {
      states_.push_back(nullptr);
      state_taken_.push_back(0);
    }
    states_[j] = std::make_unique<AttentionState>(shape, segments[i].n);
    state_taken_[j] = 1;
    states_of_[i] = states_[j].get();
  }
}

ThreadPool& DecoderModel::pool() const {
  if (pool_ == nullptr || pool_->threads() != threads_) pool_ = std::make_unique<ThreadPool>(threads_);
  return *pool_;
}

AttentionOptions DecoderModel::attention_options() const {
  return {.scale = 1.0f / std::sqrt(static_cast<float>(w_.config.head_dim())),
          .kernel = AttentionKernel::kSimd, .threads = threads_, .pool = &pool()};
}

Status DecoderModel::ForwardBlock(const int32_t* tokens, int32_t n, int64_t pos, KvCache& cache,
                                float* logits) {
  const ForwardSegment one{.tokens = tokens, .n = n, .pos = pos, .cache = cache, .logits = logits};
  return ForwardBatch(std::span<const ForwardSegment>(&one, 1));
}

void DecoderModel::RecurrentMixer(const LayerWeights& L, int32_t slot,
                                std::span<const ForwardSegment> segments, int64_t n) {
  const DecoderConfig& c = w_.config;
  const DeltaNetConfig& d = c.delta_net;
  const int64_t C = d.conv_channels(), Cv = d.v_channels(), Hv = d.n_v_heads;
  const float* xb = xb_.data();  // [n][dim] the normed rows
  ThreadPool& pool = this->pool();
  // Every input projection of the layer reads the same normed rows: one hand-off for them all.
  const bool fused_ba = L.ssm_ba.data != nullptr;  // qwen3next: per key head g, [b of its r heads][a of them]
  const MatMulOutput fused[] = {{&L.ssm_qkv, ssm_qkv_.data()}, {&L.ssm_gate, ssm_z_.data()}, {&L.ssm_ba, ssm_ba_.data()}};
  const MatMulOutput apart[] = {{&L.ssm_qkv, ssm_qkv_.data()}, {&L.ssm_gate, ssm_z_.data()},
                                {&L.ssm_beta, ssm_beta_.data()}, {&L.ssm_alpha, ssm_alpha_.data()}};
  MatMulGroup(fused_ba ? std::span<const MatMulOutput>(fused) : std::span<const MatMulOutput>(apart), xb, n, pool);
  if (fused_ba) {
    const int64_t r_per_k = Hv / d.n_k_heads;
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t h = 0; h < Hv; ++h) {
        const int64_t g = h / r_per_k, j = h % r_per_k;
        ssm_beta_[r * Hv + h] = ssm_ba_[r * 2 * Hv + g * 2 * r_per_k + j];
        ssm_alpha_[r * Hv + h] = ssm_ba_[r * 2 * Hv + g * 2 * r_per_k + r_per_k + j];
      }
    }
  }
  // Each segment's tokens through its own state (the scan inside is strictly left to right).
  for (int64_t r = 0; const ForwardSegment& seg : segments) {
    float* state = seg.cache.state() + int64_t{slot} * d.state_floats();
    const DeltaNetInput in{.qkv = ssm_qkv_.data() + r * C,
                           .z = ssm_z_.data() + r * Cv,
                           .beta = ssm_beta_.data() + r * Hv,
                           .alpha = ssm_alpha_.data() + r * Hv};
    DeltaNetBlock(d, L, c.norm_eps, in, seg.n, state, ssm_out_.data() + r * Cv, &delta_scratch_, pool);
    r += seg.n;
  }
  MatMul(L.ssm_out, ssm_out_.data(), n, xb2_.data(), pool);
}

Status DecoderModel::ForwardBatch(std::span<const ForwardSegment> segments) {
  PhaseClock clock(profile_);
  const DecoderConfig& c = w_.config;
  if (Status s = CheckSegments(c, segments); !s.ok()) return s;
  int64_t n = 0;  // rows: every segment's tokens
  int64_t n_logits = 0;  // rows the classifier runs on
  for (const ForwardSegment& seg : segments) {
    n += seg.n;
    n_logits += seg.n_logit_rows + (seg.logits != nullptr && !LastRowAsked(seg) ? 1 : 0);
  }
  Reserve(n, segments.size(), n_logits);
  AssignStates(segments);
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
  for (int64_t r = 0; const ForwardSegment& seg : segments) {
    for (int32_t t = 0; t < seg.n; ++t, ++r)
      DecodeWeightRow(w_.token_embedding, seg.tokens[t], x + r * dim);
  }
  const RopeParams rope = ModelRopeParams(c);
  ThreadPool& pool = this->pool();
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w_.layers[l];
    const int32_t cl = c.cache_layer(l);  // its layer in the cache, or its slot in the state
    for (int64_t r = 0; r < n; ++r)
      RmsNorm(xb + r * dim, x + r * dim, L.attn_norm, c.dim, c.norm_eps);
    clock.Charge(kRest);
    if (c.is_recurrent(l)) {
      RecurrentMixer(L, cl, segments, n);  // xb2 = its output, ssm_out included
      clock.Charge(kAttention);
    } else {
      // q, k and v read the same normed rows: one hand-off for the three (attn_q gives per head
      // [q, gate] on a gated model: split below).
      const MatMulOutput qkv[] = {{&L.wq, c.attn_output_gate ? qg_.data() : q}, {&L.wk, k}, {&L.wv, v}};
      MatMulGroup(qkv, xb, n, pool);
      if (c.attn_output_gate) {
        for (int64_t r = 0; r < n; ++r) {
          for (int64_t h = 0; h < c.n_heads; ++h) {
            const float* from = qg_.data() + (r * c.n_heads + h) * 2 * hd;
            std::copy_n(from, hd, q + r * q_dim + h * hd);
            std::copy_n(from + hd, hd, gate_.data() + r * q_dim + h * hd);
          }
        }
      }
      clock.Charge(kWeights);
      for (int64_t r = 0; const ForwardSegment& seg : segments) {
        const bool pre_rope = KeysBeforeRope(seg.cache.config(), cl);
        for (int32_t t = 0; t < seg.n; ++t, ++r) {
          const int64_t pos = seg.pos + t;
          AddBias(q + r * q_dim, L.bq, q_dim);
          AddBias(k + r * kv, L.bk, kv);
          AddBias(v + r * kv, L.bv, kv);
          if (c.qk_norm) {  // qwen3: each head normed on its own, in place, before the rotation
            for (int64_t h = r * q_dim; h < (r + 1) * q_dim; h += hd)
              RmsNorm(q + h, q + h, L.q_norm, c.head_dim(), c.norm_eps);
            for (int64_t h = r * kv; h < (r + 1) * kv; h += hd)
              RmsNorm(k + h, k + h, L.k_norm, c.head_dim(), c.norm_eps);
          }
          ApplyRope(q + r * q_dim, static_cast<int32_t>(q_dim), c.head_dim(), pos, rope);
          if (pre_rope)
            std::copy_n(k + r * kv, kv, k_pre_rope_.data() + r * kv);  // the cache's rows
          ApplyRope(k + r * kv, c.kv_dim(), c.head_dim(), pos, rope);  // hooks see roped keys
          if (hooks_ && hooks_->on_qkv)
            hooks_->on_qkv(l, pos, q + r * q_dim, k + r * kv, v + r * kv);
        }
      }
      clock.Charge(kRest);
      // Each segment attends over its own cache only: its rows are a block of one sequence.
      for (int64_t i = 0, r0 = 0; i < static_cast<int64_t>(segments.size());
           r0 += segments[i].n, ++i) {
        const ForwardSegment& seg = segments[i];
        const float* k_rows = KeysBeforeRope(seg.cache.config(), cl) ? k_pre_rope_.data() : k;
        if (Status s = seg.cache.Append(cl, k_rows + r0 * kv, v + r0 * kv, seg.n); !s.ok())
          return s;
        AttentionState& state = *states_of_[i];
        state.Reset();
        const Status s = seg.cache.Attend(cl, attention_options(), q + r0 * q_dim, seg.pos, state);
        if (!s.ok()) return s;
        seg.cache.FinishAttention(cl, state, xb + r0 * q_dim);  // [seg.n][n_heads·head_dim]
      }
      clock.Charge(kAttention);
      // The hook sees (and may replace) what the cache gave, before the gate: a measurement
      // compares it with attention computed over other caches, which have no gate.
      if (hooks_ && hooks_->on_attention_out) {
        for (int64_t r = 0; const ForwardSegment& seg : segments) {
          for (int32_t t = 0; t < seg.n; ++t, ++r)
            hooks_->on_attention_out(l, seg.pos + t, xb + r * q_dim);
        }
      }
      if (c.attn_output_gate) {  // gated attention: out ⊙ σ(gate), before the output projection
        for (int64_t i = 0; i < n * q_dim; ++i) xb[i] *= 1.0f / (1.0f + std::exp(-gate_[i]));
      }
      clock.Charge(kRest);
      MatMul(L.wo, xb, n, xb2, pool);
      clock.Charge(kWeights);
    }
    for (int64_t i = 0; i < n * dim; ++i) x[i] += xb2[i];

    for (int64_t r = 0; r < n; ++r)
      RmsNorm(xb + r * dim, x + r * dim, L.ffn_norm, c.dim, c.norm_eps);
    clock.Charge(kRest);
    const MatMulOutput gate_up[] = {{&L.w1, hb}, {&L.w3, hb2}};  // one hand-off for both
    MatMulGroup(gate_up, xb, n, pool);
    clock.Charge(kWeights);
    SwiGlu(hb, hb2, n * hidden);  // silu(w1 x) · (w3 x)
    clock.Charge(kRest);
    if (c.moe.n_experts > 0) {  // hb: the shared expert's; then per row the routed experts
      MatMul(L.w2, hb, n, xb2, pool);
      expert_bytes_read_ += MoeRows(c, L, xb, n, xb2, xb2, &moe_scratch_, pool);  // in place: σ(gate)·shared + routed
      clock.Charge(kWeights);
      for (int64_t i = 0; i < n * dim; ++i) x[i] += xb2[i];
    } else {
      MatMul(L.w2, hb, n, xb, pool);
      clock.Charge(kWeights);
      for (int64_t i = 0; i < n * dim; ++i) x[i] += xb[i];
    }
  }
  // The classifier once over every row asked for: each segment's logit_rows, then its last row
  // unless logit_rows ends with it (MatMul: the same bits as MatVec per row, so a row's logits do
  // not depend on the others, and the last row's are those of its logit_rows entry).
  float* last = last_.data();
  for (int64_t r0 = 0, j = 0; const ForwardSegment& seg : segments) {
    for (int32_t i = 0; i < seg.n_logit_rows; ++i)
      RmsNorm(last + j++ * dim, x + (r0 + seg.logit_rows[i]) * dim, w_.final_norm, c.dim,
              c.norm_eps);
    r0 += seg.n;
    if (seg.logits != nullptr && !LastRowAsked(seg))
      RmsNorm(last + j++ * dim, x + (r0 - 1) * dim, w_.final_norm, c.dim, c.norm_eps);
  }
  clock.Charge(kRest);
  MatMul(w_.classifier, last, n_logits, logits_.data(), pool);
  clock.Charge(kWeights);
  const int64_t vocab = c.vocab_size;
  for (int64_t j = 0; const ForwardSegment& seg : segments) {
    std::copy_n(logits_.data() + j * vocab, seg.n_logit_rows * vocab, seg.row_logits);
    j += seg.n_logit_rows;
    if (seg.logits != nullptr) {
      const int64_t row = LastRowAsked(seg) ? j - 1 : j++;
      std::copy_n(logits_.data() + row * vocab, vocab, seg.logits);
    }
  }
  clock.Charge(kRest);
  return Status::Ok();
}

}  // namespace kvq
