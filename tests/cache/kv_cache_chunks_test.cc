// KvCache::Attend over contexts of several position chunks (AttentionOptions::position_chunk): the
// pages of one call are shared by threads chunk by chunk, so a resident or a streamed cache gives
// the bits of one thread for 2, 3 and 8 threads — every format in the registry, plain and with
// sinks and a residual (whose prefill blocks read the layer through several views: separate calls
// that start inside a chunk), 1 and 2 KV heads, decode and a prefill block, a context that is not
// a multiple of the chunk.
#include <gtest/gtest.h>

#include <memory>

#include "kvq/kv_cache.h"
#include "test_util/random_rows.h"

namespace kvq {
namespace {

using kvq_test::Random;

constexpr int32_t kPage = 64;
constexpr int64_t kChunk = 256;  // four pages
constexpr int64_t kPositions = 1100;  // 4.3 chunks

std::unique_ptr<KvCache> MakeCache(const LayerFormats& f, RowShape row, KvBudgets budgets) {
  Result<std::unique_ptr<KvCache>> c =
      KvCache::Create({.n_layers = 1, .n_kv_heads = row.n_kv_heads, .head_dim = row.head_dim, .layers = {f},
                       .max_positions = kPositions, .page_positions = kPage, .budgets = budgets});
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? std::move(c).value() : nullptr;
}

// The cache's output for the last `tokens` positions as queries (appended last, as a model's block).
std::vector<float> Attend(KvCache& cache, const std::vector<float>& q, int32_t tokens, AttentionShape shape,
                          int32_t threads) {
  AttentionState state(shape, tokens);
  const AttentionOptions o{.scale = 0.25f, .kernel = AttentionKernel::kSimd, .threads = threads,
                           .position_chunk = kChunk};
  const Status s = cache.Attend(0, o, q.data(), kPositions - tokens, state);
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_NE(state.merged_m[0], -INFINITY);  // chunks were merged
  std::vector<float> out(q.size());
  cache.FinishAttention(0, state, out.data());
  return out;
}

TEST(KvCacheChunks, EveryTierAndThreadCountGivesOneThreadsBits) {
  for (const FormatDesc* f : Formats()) {
    for (int32_t kv_heads : {1, 2}) {
      const RowShape row{.n_kv_heads = kv_heads, .head_dim = 32};
      const AttentionShape shape{.n_heads = 4 * kv_heads, .n_kv_heads = kv_heads, .head_dim = 32};
      for (const KvTransforms& t : {KvTransforms{}, KvTransforms{.sinks = 4, .residual = 40}}) {
        const KvSpec spec{f, t};
        if (!CheckKvSpec(spec, row).ok()) continue;
        const LayerFormats formats = LayerFormats::Both(spec);
        const std::vector<float> k = Random(kPositions * row.elems(), 1), v = Random(kPositions * row.elems(), 2);
        for (int32_t tokens : {1, 5}) {
          auto resident = MakeCache(formats, row, {});
          auto streamed = MakeCache(formats, row, {.device_bytes = 2 * resident->plan().slot_bytes});
          const int64_t before = kPositions - tokens;
          for (KvCache* c : {resident.get(), streamed.get()}) {
            ASSERT_TRUE(c->Append(0, k.data(), v.data(), before).ok());
            ASSERT_TRUE(c->Append(0, k.data() + before * row.elems(), v.data() + before * row.elems(), tokens).ok());
          }
          const std::vector<float> q = Random(int64_t{tokens} * shape.n_heads * shape.head_dim, 3);
          const std::vector<float> want = Attend(*resident, q, tokens, shape, 1);
          for (int32_t threads : {1, 2, 3, 8}) {
            int tier = 0;
            for (KvCache* c : {resident.get(), streamed.get()}) {
              ASSERT_EQ(Attend(*c, q, tokens, shape, threads), want)
                  << KvSpecName(spec) << " kv heads " << kv_heads << " tokens " << tokens << " threads " << threads
                  << (tier++ == 0 ? " resident" : " streamed");
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvq
