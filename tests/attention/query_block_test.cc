// Query blocks (AttentionOptions::query_block): the SIMD kernel scoring each K/V tile once for a
// block of query tokens gives exactly the bits of the per-token path (query_block = 1) — memcmp
// of m, l, acc and the output — for every registered format, GQA groups 1..8, blocks that do not
// divide the query count, queries starting at 0, in the middle of the cache and at its end,
// windows of several sizes (so windows end inside a block: the diagonal), and 1 and 2 threads.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "attention_fixture.h"

namespace kvq::testing_attention {
namespace {

// The cache's query tokens placed at positions first_query.., attending the windows in order.
Result RunAt(const Cache& cache, const AttentionOptions& o, int64_t first_query, const Windows& windows) {
  const AttentionShape s = cache.shape();
  const int32_t n_tokens = static_cast<int32_t>(cache.q().size() / (int64_t{s.n_heads} * s.head_dim));
  AttentionState state(s, n_tokens);
  for (const auto& [begin, end] : windows) {
    AttendWindow(o, cache.q().data(), first_query, cache.Window(begin, end), state);
  }
  return ResultOf(state);
}

struct Case {
  int64_t first_query;
  Windows windows;
  std::string name;
};

// 37 query tokens over a cache of 150 positions (KIVI's last group incomplete: residual rows).
std::vector<Case> Cases(int64_t n_positions, int32_t n_tokens) {
  const int64_t end = n_positions - n_tokens, mid = 45;
  return {
      {end, {{0, n_positions}}, "at the end, one window"},
      {end, Even(n_positions, 7), "at the end, windows of 7"},
      {end, Even(n_positions, 32), "at the end, windows of 32"},
      {end, {{0, 1}, {1, 120}, {120, 133}, {133, n_positions}}, "at the end, uneven windows"},
      {mid, Even(n_positions, 50), "in the middle (later positions unseen), windows of 50"},
      {0, Even(n_positions, 16), "from position 0 (a prompt's prefill), windows of 16"},
      {0, Even(n_positions, 1), "from position 0, windows of 1"},
  };
}

TEST(QueryBlock, EveryBlockSizeGivesThePerTokenBits) {
  constexpr int64_t kPositions = 150;
  constexpr int32_t kTokens = 37;
  for (const FormatDesc* f : Formats()) {
    for (int32_t group : {1, 2, 4, 6, 8}) {
      const AttentionShape shape{.n_heads = 2 * group, .n_kv_heads = 2, .head_dim = 16};
      const Cache cache(*f, shape, kPositions, kTokens, 5 + group);
      for (const Case& c : Cases(kPositions, kTokens)) {
        for (float softcap : {0.0f, 30.0f}) {
          AttentionOptions o = Options(shape, AttentionKernel::kSimd, softcap);
          o.query_block = 1;
          const Result per_token = RunAt(cache, o, c.first_query, c.windows);
          for (int32_t block : {0, 2, 5, 8, 16, 64}) {
            for (int32_t threads : {1, 2}) {
              o.query_block = block;
              o.threads = threads;
              ASSERT_TRUE(SameBytes(RunAt(cache, o, c.first_query, c.windows), per_token))
                  << f->name << " group " << group << " " << c.name << " softcap " << softcap
                  << " block " << block << " threads " << threads;
            }
          }
        }
      }
    }
  }
}

// The 8-lane (head_dim 8), 1-lane (12) and 16-lane multi-chunk (128) kernel paths, and a
// larger GQA group.
TEST(QueryBlock, OtherHeadDimsAndGroups) {
  for (int32_t hd : {8, 12, 128}) {
    for (int32_t group : {4, 16}) {
      for (const FormatDesc* f : Formats()) {
        if (!CheckShape(*f, {.n_kv_heads = 2, .head_dim = hd}).ok()) continue;
        const AttentionShape shape{.n_heads = 2 * group, .n_kv_heads = 2, .head_dim = hd};
        const Cache cache(*f, shape, 90, 19, 3);
        AttentionOptions o = Options(shape, AttentionKernel::kSimd);
        o.query_block = 1;
        const Result per_token = RunAt(cache, o, 90 - 19, Even(90, 20));
        for (int32_t block : {0, 4, 16}) {
          o.query_block = block;
          for (int32_t threads : {1, 2}) {
            o.threads = threads;
            ASSERT_TRUE(SameBytes(RunAt(cache, o, 90 - 19, Even(90, 20)), per_token))
                << f->name << " hd " << hd << " group " << group << " block " << block << " threads " << threads;
          }
        }
      }
    }
  }
}

// The block path is the default for more than one query token and changes the state (the test
// above compares something): a block's result differs from that of other queries' positions.
TEST(QueryBlock, ComparisonCanFail) {
  const AttentionShape shape{.n_heads = 8, .n_kv_heads = 2, .head_dim = 16};
  const Cache cache(**FindFormat("int4"), shape, 100, 20, 9);
  const AttentionOptions o = Options(shape, AttentionKernel::kSimd);
  EXPECT_FALSE(SameBytes(RunAt(cache, o, 80, {{0, 100}}), RunAt(cache, o, 79, {{0, 100}})));
}

}  // namespace
}  // namespace kvq::testing_attention
