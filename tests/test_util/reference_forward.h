// A plain scalar forward pass written run.c style (sequential sums, a two-pass softmax over a
// plain K/V array, the model's own scalar RmsNorm/Rope): the reference kvq's fast path is checked
// against (reference_forward_test.cc, char_vocab_test.cc).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "model/decoder.h"
#include "weights/matvec.h"

namespace kvq::test {

// run.c's forward, with the model's own RmsNorm/Rope (they are scalar already). Keeps its own
// K/V arrays: [n_layers][seq_len][kv_dim] each.
class ReferenceForward {
 public:
  explicit ReferenceForward(const DecoderWeights& w) : w_(w), c_(w.config) {
    kcache_.resize(int64_t{c_.n_layers} * c_.seq_len * c_.kv_dim());
    vcache_.resize(kcache_.size());
  }
  std::vector<float> Forward(int32_t token, int32_t pos) {
    const int32_t dim = c_.dim, hs = c_.head_dim(), kv = c_.kv_dim(), group = c_.n_heads / c_.n_kv_heads;
    std::vector<float> x(dim);
    DecodeWeightRow(w_.token_embedding, token, x.data());  // the embedding row, whatever its type
    std::vector<float> xb(dim), xb2(dim), q(dim), hb(c_.hidden_dim), hb2(c_.hidden_dim), att(pos + 1);
    for (int32_t l = 0; l < c_.n_layers; ++l) {
      const LayerWeights& L = w_.layers[l];
      float* k = kcache_.data() + (int64_t{l} * c_.seq_len + pos) * kv;
      float* v = vcache_.data() + (int64_t{l} * c_.seq_len + pos) * kv;
      RmsNorm(xb.data(), x.data(), L.attn_norm, dim, c_.norm_eps);
      MatVecReference(L.wq, xb.data(), q.data());
      MatVecReference(L.wk, xb.data(), k);
      MatVecReference(L.wv, xb.data(), v);
      Rope(q.data(), dim, hs, pos, c_.rope_theta);
      Rope(k, kv, hs, pos, c_.rope_theta);
      for (int32_t h = 0; h < c_.n_heads; ++h) {
        const float* qh = q.data() + h * hs;
        float top = -INFINITY;
        for (int32_t t = 0; t <= pos; ++t) {
          const float* kt = kcache_.data() + (int64_t{l} * c_.seq_len + t) * kv + (h / group) * hs;
          float s = 0;
          for (int32_t i = 0; i < hs; ++i) s += qh[i] * kt[i];
          att[t] = s / std::sqrt(static_cast<float>(hs));
          top = std::max(top, att[t]);
        }
        float sum = 0;
        for (int32_t t = 0; t <= pos; ++t) sum += att[t] = std::exp(att[t] - top);
        float* out = xb.data() + h * hs;
        std::fill(out, out + hs, 0.0f);
        for (int32_t t = 0; t <= pos; ++t) {
          const float* vt = vcache_.data() + (int64_t{l} * c_.seq_len + t) * kv + (h / group) * hs;
          for (int32_t i = 0; i < hs; ++i) out[i] += att[t] / sum * vt[i];
        }
      }
      MatVecReference(L.wo, xb.data(), xb2.data());
      for (int32_t i = 0; i < dim; ++i) x[i] += xb2[i];
      RmsNorm(xb.data(), x.data(), L.ffn_norm, dim, c_.norm_eps);
      MatVecReference(L.w1, xb.data(), hb.data());
      MatVecReference(L.w3, xb.data(), hb2.data());
      for (int32_t i = 0; i < c_.hidden_dim; ++i) hb[i] = hb[i] / (1.0f + std::exp(-hb[i])) * hb2[i];
      MatVecReference(L.w2, hb.data(), xb.data());
      for (int32_t i = 0; i < dim; ++i) x[i] += xb[i];
    }
    RmsNorm(x.data(), x.data(), w_.final_norm, dim, c_.norm_eps);
    std::vector<float> logits(c_.vocab_size);
    MatVecReference(w_.classifier, x.data(), logits.data());
    return logits;
  }

 private:
  const DecoderWeights& w_;
  DecoderConfig c_;
  std::vector<float> kcache_, vcache_;
};

}  // namespace kvq::test
