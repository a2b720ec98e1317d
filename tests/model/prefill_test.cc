// Prefill in blocks: MatMul equals MatVec per token bit for bit, and a block forward leaves the
// same logits and the same cache as token-by-token forwards for every format (prompt_cut_test
// adds every transform, more cuts and the cache's bytes).
#include <gtest/gtest.h>

#include <random>

#include "model/decoder.h"
#include "model/llama2c.h"
#include "weights/matvec.h"

namespace kvq {
namespace {

const std::string kDir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";

TEST(Prefill, MatMulEqualsMatVecPerToken) {
  Result<DecoderWeights> w = LoadLlama2c(kDir + "stories260K.bin");
  ASSERT_TRUE(w.ok());
  const Matrix& m = w->layers[0].w1;  // [172][64]
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t n = 9;
  std::vector<float> x(n * m.cols), y(n * m.rows), one(m.rows);
  for (float& v : x) v = dist(rng);
  MatMul(m, x.data(), n, y.data(), ThreadPool::Shared(2));
  for (int64_t t = 0; t < n; ++t) {
    MatVec(m, x.data() + t * m.cols, one.data(), ThreadPool::Shared(2));
    for (int64_t r = 0; r < m.rows; ++r) ASSERT_EQ(y[t * m.rows + r], one[r]) << t << " " << r;
  }
}

TEST(Prefill, BlockForwardEqualsTokenByToken) {
  Result<DecoderWeights> w = LoadLlama2c(kDir + "stories260K.bin");
  ASSERT_TRUE(w.ok());
  const DecoderConfig c = w->config;
  std::vector<int32_t> tokens(150);
  std::mt19937 rng(2);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % c.vocab_size);
  int32_t checked = 0;
  for (const FormatDesc* f : Formats()) {
    ++checked;
    const std::string name = f->name;
    auto make = [&]() -> std::unique_ptr<KvCache> {
      Result<std::unique_ptr<KvCache>> r =
          KvCache::Create({.n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim(),
                           .layers = {{f, f}}, .max_positions = 256, .page_positions = 64});
      EXPECT_TRUE(r.ok()) << name << ": " << r.status().message();
      return r.ok() ? std::move(r).value() : nullptr;
    };
    auto block_cache = make(), token_cache = make();
    ASSERT_NE(block_cache, nullptr);
    ASSERT_NE(token_cache, nullptr);
    DecoderModel model(*w, 2);
    std::vector<float> block_logits(c.vocab_size), token_logits(c.vocab_size);
    // Two blocks (64 + 86 positions) against 150 single-token forwards.
    ASSERT_TRUE(model.ForwardBlock(tokens.data(), 64, 0, *block_cache, block_logits.data()).ok());
    ASSERT_TRUE(model.ForwardBlock(tokens.data() + 64, 86, 64, *block_cache, block_logits.data()).ok());
    for (int32_t p = 0; p < 150; ++p) ASSERT_TRUE(model.Forward(tokens[p], p, *token_cache, token_logits.data()).ok());
    EXPECT_EQ(block_logits, token_logits) << name;
    // The next decode step sees identical caches.
    ASSERT_TRUE(model.Forward(7, 150, *block_cache, block_logits.data()).ok());
    ASSERT_TRUE(model.Forward(7, 150, *token_cache, token_logits.data()).ok());
    EXPECT_EQ(block_logits, token_logits) << name;
  }
  EXPECT_EQ(checked, static_cast<int32_t>(Formats().size()));
}

}  // namespace
}  // namespace kvq
