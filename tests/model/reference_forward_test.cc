// The fast f32 path (SIMD matvec, kvq cache, online-softmax attention) against a plain scalar
// forward written here, run.c style (sequential sums, a two-pass softmax over a plain K/V array),
// at every position of a 200-token sequence of the bundled model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "model/llama.h"
#include "model/llama2c.h"
#include "weights/matvec.h"

namespace kvq {
namespace {

// run.c's forward, with the model's own RmsNorm/Rope (they are scalar already).
class ReferenceForward {
 public:
  explicit ReferenceForward(const LlamaWeights& w) : w_(w), c_(w.config) {
    kcache_.resize(int64_t{c_.n_layers} * c_.seq_len * c_.kv_dim());
    vcache_.resize(kcache_.size());
  }
  std::vector<float> Forward(int32_t token, int32_t pos) {
    const int32_t dim = c_.dim, hs = c_.head_dim(), kv = c_.kv_dim(), group = c_.n_heads / c_.n_kv_heads;
    std::vector<float> x(reinterpret_cast<const float*>(w_.token_embedding.data) + int64_t{token} * dim,
                         reinterpret_cast<const float*>(w_.token_embedding.data) + int64_t{token + 1} * dim);
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
  const LlamaWeights& w_;
  LlamaConfig c_;
  std::vector<float> kcache_, vcache_;
};

TEST(ReferenceForward, FastPathLogitsMatchAtEveryPositionOf200Tokens) {
  const std::string dir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";
  Result<LlamaWeights> w = LoadLlama2c(dir + "stories260K.bin");
  ASSERT_TRUE(w.ok()) << w.status().message();
  ReferenceForward reference(*w);
  const LlamaConfig c = w->config;
  const FormatDesc* f32 = *FindFormat("f32");
  Result<std::unique_ptr<KvCache>> cache =
      KvCache::Create({.n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim(),
                       .layers = {{f32, f32}}, .max_positions = c.seq_len, .page_positions = 64});
  ASSERT_TRUE(cache.ok());
  LlamaModel model(*w, 2);
  std::vector<float> fast(c.vocab_size);
  int32_t token = 1;
  double worst = 0;
  for (int32_t pos = 0; pos < 200; ++pos) {
    ASSERT_TRUE(model.Forward(token, pos, **cache, fast.data()).ok());
    const std::vector<float> want = reference.Forward(token, pos);
    // Tolerance: both paths are f32 with different summation orders (SIMD matvec, online vs
    // two-pass softmax), so they differ by rounding that accumulates over 5 layers of 64- and
    // 172-wide sums; 1e-3 absolute on logits of magnitude up to ~20 is ~5e-5 relative. A real
    // bug (a wrong RoPE angle, a dropped position, a wrong head mapping) moves logits by O(0.1-1).
    for (int32_t i = 0; i < c.vocab_size; ++i) {
      ASSERT_NEAR(fast[i], want[i], 1e-3) << "position " << pos << " logit " << i;
      worst = std::max<double>(worst, std::fabs(fast[i] - want[i]));
    }
    // Feed a deterministic, varied sequence (the reference's own argmax, stories text).
    token = static_cast<int32_t>(std::max_element(want.begin(), want.end()) - want.begin());
  }
  EXPECT_GT(worst, 0.0) << "identical to the last bit: is the fast path really a different path?";
  std::printf("worst |fast - reference| logit difference over 200 positions: %g\n", worst);
}

}  // namespace
}  // namespace kvq
