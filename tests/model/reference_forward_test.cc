// The fast f32 path (SIMD matvec, kvq cache, online-softmax attention) against a plain scalar
// forward, run.c style (test_util/reference_forward.h: sequential sums, a two-pass softmax over a
// plain K/V array), at every position of a 200-token sequence of the bundled model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "model/decoder.h"
#include "model/llama2c.h"
#include "weights/matvec.h"
#include "test_util/reference_forward.h"

namespace kvq {
namespace {

using test::ReferenceForward;

TEST(ReferenceForward, FastPathLogitsMatchAtEveryPositionOf200Tokens) {
  const std::string dir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";
  Result<DecoderWeights> w = LoadLlama2c(dir + "stories260K.bin");
  ASSERT_TRUE(w.ok()) << w.status().message();
  ReferenceForward reference(*w);
  const DecoderConfig c = w->config;
  const FormatDesc* f32 = *FindFormat("f32");
  Result<std::unique_ptr<KvCache>> cache =
      KvCache::Create({.n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim(),
                       .layers = {{f32, f32}}, .max_positions = c.seq_len, .page_positions = 64});
  ASSERT_TRUE(cache.ok());
  DecoderModel model(*w, 2);
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
