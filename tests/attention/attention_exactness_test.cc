// The exactness contract of docs/design.md §3 / seed 000 ("measurement two"): attention over any
// sequence of windows equals attention over one window, bit for bit — every window size 1..96,
// 23 window sizes at 4,096 positions, four GQA shapes, every format, scalar and SIMD kernels,
// decode and prefill. The three bugs seed 000 names are injected and must be detected, and a
// query at position p attends to exactly p + 1 positions.
#include <gtest/gtest.h>

#include <string>

#include <hwy/targets.h>

#include "attention_fixture.h"

namespace kvq::testing_attention {
namespace {

struct Config {
  const FormatDesc* format;
  int32_t group;  // query heads per KV head
  AttentionKernel kernel;
  int32_t n_tokens;  // 1: decode; > 1: prefill block
};

std::string Name(const ::testing::TestParamInfo<Config>& info) {
  std::string n = std::string(info.param.format->name) + "_g" + std::to_string(info.param.group) +
                  (info.param.kernel == AttentionKernel::kSimd ? "_simd" : "_scalar") +
                  (info.param.n_tokens == 1 ? "_decode" : "_prefill");
  for (char& ch : n) {
    if (ch == '-') ch = '_';
  }
  return n;
}

std::vector<Config> AllConfigs() {
  std::vector<Config> out;
  for (const FormatDesc* f : Formats()) {
    for (int32_t group : {1, 2, 4, 8}) {
      for (AttentionKernel k : {AttentionKernel::kScalar, AttentionKernel::kSimd}) {
        for (int32_t tokens : {1, 4}) out.push_back({f, group, k, tokens});
      }
    }
  }
  return out;
}

class Exactness : public ::testing::TestWithParam<Config> {
 protected:
  // 2 KV heads × head_dim 16 (every format can store it; SIMD uses 16-lane chunks).
  AttentionShape Shape() const { return {.n_heads = 2 * GetParam().group, .n_kv_heads = 2, .head_dim = 16}; }
};

// The SIMD kernel runs on every SIMD target compiled in (AVX-512, AVX2, portable), each
// compared with itself: exactness holds per target.
TEST_P(Exactness, EveryWindowSizeFrom1To96) {
  const Config& c = GetParam();
  const int64_t n = 96;
  // Prefill here is a block of 12 query tokens at positions 84..95, each causal, so windows
  // end inside the block as well as before it.
  const int32_t tokens = c.n_tokens == 1 ? 1 : 12;
  const Cache cache(*c.format, Shape(), n, tokens, 1);
  const AttentionOptions o = Options(Shape(), c.kernel);
  const std::vector<int64_t> targets = c.kernel == AttentionKernel::kSimd
                                           ? hwy::SupportedAndGeneratedTargets()
                                           : std::vector<int64_t>{0};
  for (int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);  // 0: the normal choice
    const Result whole = cache.Run(o, {{0, n}});
    for (int64_t size = 1; size <= n; ++size) {
      ASSERT_TRUE(BitIdentical(cache.Run(o, Even(n, size)), whole))
          << "window size " << size << " target " << hwy::TargetName(target);
    }
    // Uneven windows too: a run of sizes that never lines up with KIVI groups or tiles.
    Windows uneven;
    for (int64_t b = 0, s = 1; b < n; b += s, s = s % 7 + 3) uneven.emplace_back(b, std::min(n, b + s));
    EXPECT_TRUE(BitIdentical(cache.Run(o, uneven), whole));
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST_P(Exactness, LongContextManyWindowSizes) {
  const Config& c = GetParam();
  const int64_t n = 4096;
  const Cache cache(*c.format, Shape(), n, std::min(c.n_tokens, 2), 2);
  const AttentionOptions o = Options(Shape(), c.kernel);
  const Result whole = cache.Run(o, {{0, n}});
  const int64_t sizes[] = {1,   2,   3,   5,   7,    13,   31,   32,   33,   64,   97,  127,
                           128, 255, 256, 500, 1000, 1023, 1024, 2048, 3000, 4095, 4096};
  for (int64_t size : sizes) {
    ASSERT_TRUE(BitIdentical(cache.Run(o, Even(n, size)), whole)) << "window size " << size;
  }
}

// Soft-capped scores keep the contract (the cap is applied per position, before the max).
TEST_P(Exactness, WithSoftcap) {
  const Config& c = GetParam();
  const int64_t n = 200;
  const Cache cache(*c.format, Shape(), n, c.n_tokens, 3);
  const AttentionOptions o = Options(Shape(), c.kernel, /*softcap=*/1.5f);
  const Result whole = cache.Run(o, {{0, n}});
  for (int64_t size : {1, 7, 32, 33, 100, 199}) {
    ASSERT_TRUE(BitIdentical(cache.Run(o, Even(n, size)), whole)) << "window size " << size;
  }
}

// Seed 000's three bugs, each injected by the caller that streams windows; each must make the
// strict comparison fail, including with exactly two windows (where normalising early is first
// visible). Windows of size 1 after the first boundary keep every variant meaningful.
TEST_P(Exactness, InjectedBugsAreDetected) {
  const Config& c = GetParam();
  const int64_t n = 160;
  const Cache cache(*c.format, Shape(), n, c.n_tokens, 4);
  const AttentionOptions o = Options(Shape(), c.kernel);
  const Result whole = cache.Run(o, {{0, n}});
  for (int64_t split : {int64_t{n / 2}, int64_t{33}, int64_t{100}}) {
    const Windows two = {{0, split}, {split, n}};
    ASSERT_TRUE(BitIdentical(cache.Run(o, two), whole));
    // 1. A dropped position at the boundary.
    EXPECT_FALSE(BitIdentical(cache.Run(o, {{0, split}, {split + 1, n}}), whole)) << "drop @" << split;
    // 2. A double-counted position where windows overlap.
    EXPECT_FALSE(BitIdentical(cache.Run(o, {{0, split + 1}, {split, n}}), whole)) << "overlap @" << split;
    // 3. Normalising at the boundary (acc /= l, l = 1) and continuing: the first window's
    //    result is right, so only a test with two or more windows can see it.
    const Result normalised = cache.Run(o, two, [](AttentionState& s) {
      const int32_t d = s.shape().head_dim;
      for (size_t h = 0; h < s.l.size(); ++h) {
        if (s.l[h] == 0.0f) continue;
        for (int32_t i = 0; i < d; ++i) s.acc[h * d + i] /= s.l[h];
        s.l[h] = 1.0f;
      }
    });
    EXPECT_FALSE(BitIdentical(normalised, whole)) << "normalise @" << split;
  }
}

TEST_P(Exactness, QueryAtPositionPAttendsToPPlusOnePositions) {
  const Config& c = GetParam();
  for (int64_t n : {1, 2, 16, 97}) {
    const int32_t tokens = c.n_tokens == 1 ? 1 : static_cast<int32_t>(std::min<int64_t>(n, 5));
    const Cache cache(*c.format, Shape(), n, tokens, 5);
    const AttentionOptions o = Options(Shape(), c.kernel);
    for (const Windows& w : {Windows{{0, n}}, Even(n, 3)}) {
      const Result r = cache.Run(o, w);
      for (int32_t t = 0; t < tokens; ++t) {
        EXPECT_EQ(r.attended[t], cache.first_query_position() + t + 1) << "n " << n << " token " << t;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllFormats, Exactness, ::testing::ValuesIn(AllConfigs()), Name);

// head_dim 8 (the bundled model's) takes the 8-lane path; head_dim 12 the 1-lane path.
TEST(ExactnessShapes, OtherHeadDims) {
  for (int32_t hd : {8, 12, 128}) {
    for (const FormatDesc* f : Formats()) {
      const AttentionShape shape{.n_heads = 8, .n_kv_heads = 4, .head_dim = hd};
      if (!CheckShape(*f, {.n_kv_heads = 4, .head_dim = hd}).ok()) continue;
      for (AttentionKernel k : {AttentionKernel::kScalar, AttentionKernel::kSimd}) {
        const Cache cache(*f, shape, 70, 3, 6);
        const AttentionOptions o = Options(shape, k);
        const Result whole = cache.Run(o, {{0, 70}});
        for (int64_t size : {1, 2, 5, 32, 69}) {
          ASSERT_TRUE(BitIdentical(cache.Run(o, Even(70, size)), whole))
              << f->name << " hd " << hd << " size " << size;
        }
      }
    }
  }
}

// Threads split (query block, KV heads) pairs, and position chunks when those are fewer than the
// threads (tests/attention/position_chunk_test.cc): any thread count, same bits.
TEST(ExactnessThreads, ThreadCountDoesNotChangeBits) {
  const AttentionShape shape{.n_heads = 16, .n_kv_heads = 4, .head_dim = 16};
  for (const FormatDesc* f : Formats()) {
    const Cache cache(*f, shape, 300, 6, 7);
    AttentionOptions o = Options(shape, AttentionKernel::kSimd);
    const Result one = cache.Run(o, Even(300, 64));
    for (int32_t threads : {2, 3, 8}) {
      o.threads = threads;
      EXPECT_TRUE(BitIdentical(cache.Run(o, Even(300, 64)), one)) << f->name << " " << threads;
    }
  }
}

}  // namespace
}  // namespace kvq::testing_attention
