// KvCache::Attend with several threads: one dispatch per call walks every page, so resident,
// host-streamed and disk-streamed tiers give the bits of one single-threaded window for every
// thread count (docs/design.md §3, §4); a warm call allocates nothing on a resident cache, and a
// streamed call's allocations do not grow with the number of pages.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "test_util/random_rows.h"
#include "formats/row_sequence.h"
#include "kvq/kv_cache.h"
#include "test_util/largest_allocation.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

constexpr AttentionShape kShape{.n_heads = 8, .n_kv_heads = 4, .head_dim = 32};
constexpr RowShape kRow{.n_kv_heads = 4, .head_dim = 32};
constexpr int32_t kPage = 64;

using kvq_test::Random;

AttentionOptions Options(AttentionKernel kernel, int32_t threads) {
  return {.scale = 0.25f, .kernel = kernel, .threads = threads};
}

std::unique_ptr<KvCache> MakeCache(LayerFormats f, int64_t max_positions, KvBudgets budgets) {
  Result<std::unique_ptr<KvCache>> c = KvCache::Create({.n_layers = 1, .n_kv_heads = kRow.n_kv_heads,
                                                        .head_dim = kRow.head_dim, .layers = {f},
                                                        .max_positions = max_positions,
                                                        .page_positions = kPage, .budgets = budgets});
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? std::move(c).value() : nullptr;
}

std::vector<float> Attend(KvCache& cache, const std::vector<float>& q, int32_t n_tokens,
                          const AttentionOptions& o, AttentionState& state) {
  state.Reset();
  const Status s = cache.Attend(0, o, q.data(), cache.positions(0) - n_tokens, state);
  EXPECT_TRUE(s.ok()) << s.message();
  std::vector<float> out(q.size());
  FinishAttention(state, out.data());
  return out;
}

TEST(KvCacheThreads, EveryTierAndThreadCountIsBitIdenticalToOneSingleThreadedWindow) {
  const int64_t n = 300;  // 4.7 pages; 300 % 32 = 12: KIVI's last key group is incomplete
  const std::vector<float> k = Random(n * kRow.elems(), 1), v = Random(n * kRow.elems(), 2);
  const LayerFormats pairs[] = {{*FindFormat("f16"), *FindFormat("f16")},
                                {*FindFormat("int4"), *FindFormat("int4")},
                                {*FindFormat("int4-kivi"), *FindFormat("int8")}};
  for (LayerFormats f : pairs) {
    RowSequence ks(f.key->key, kRow), vs(f.value->value, kRow);
    ks.Append(k.data(), n);
    vs.Append(v.data(), n);
    const fs::path dir = fs::path(::testing::TempDir()) / ("kvq_threads_" + std::to_string(getpid()));
    fs::create_directories(dir);
    auto resident = MakeCache(f, 1000, {});
    const int64_t two_pages = 2 * resident->plan().slot_bytes;
    auto host_streamed = MakeCache(f, 1000, {.device_bytes = two_pages});
    auto disk_streamed = MakeCache(f, 1000, {.device_bytes = two_pages, .disk_dir = dir.string()});
    for (KvCache* c : {resident.get(), host_streamed.get(), disk_streamed.get()}) {
      ASSERT_TRUE(c->Append(0, k.data(), v.data(), 200).ok());
      ASSERT_TRUE(c->Append(0, k.data() + 200 * kRow.elems(), v.data() + 200 * kRow.elems(), n - 200).ok());
    }
    for (int32_t tokens : {1, 3}) {
      const std::vector<float> q = Random(int64_t{tokens} * kShape.n_heads * kShape.head_dim, 3);
      for (AttentionKernel kernel : {AttentionKernel::kScalar, AttentionKernel::kSimd}) {
        AttentionState want_state(kShape, tokens);
        AttendWindow(Options(kernel, 1), q.data(), n - tokens,
                     {.first_position = 0, .k = ks.View(0, n), .v = vs.View(0, n)}, want_state);
        std::vector<float> want(q.size());
        FinishAttention(want_state, want.data());
        AttentionState state(kShape, tokens);  // reused across tiers and thread counts
        for (int32_t threads : {1, 2, 3, 4}) {
          int tier = 0;
          for (KvCache* c : {resident.get(), host_streamed.get(), disk_streamed.get()}) {
            SCOPED_TRACE(::testing::Message() << f.key->name << "/" << f.value->name << " tokens " << tokens
                                              << " threads " << threads << " tier " << tier++
                                              << (kernel == AttentionKernel::kSimd ? " simd" : " scalar"));
            ASSERT_EQ(Attend(*c, q, tokens, Options(kernel, threads), state), want);
            EXPECT_EQ(state.attended, want_state.attended);
          }
        }
      }
    }
    EXPECT_LE(host_streamed->device_peak_bytes(), host_streamed->plan().device_bytes);
    fs::remove_all(dir);
  }
}

// Allocations of one warm Attend call (the state and caches already used once).
int64_t AllocationsOfOneCall(KvCache& cache, const std::vector<float>& q, int32_t threads) {
  AttentionState state(kShape, 1);
  Attend(cache, q, 1, Options(AttentionKernel::kSimd, threads), state);  // warm: scratch, pool
  kvq_test::g_allocations = 0;
  kvq_test::g_track_allocations = true;
  state.Reset();  // sizes unchanged: reuses the vectors
  const Status s = cache.Attend(0, Options(AttentionKernel::kSimd, threads), q.data(), cache.positions(0) - 1, state);
  kvq_test::g_track_allocations = false;
  EXPECT_TRUE(s.ok()) << s.message();
  return kvq_test::g_allocations.load();
}

TEST(KvCacheThreads, NoAllocationPerPage) {
  const LayerFormats f{*FindFormat("int4"), *FindFormat("int4")};
  const std::vector<float> q = Random(int64_t{kShape.n_heads} * kShape.head_dim, 4);
  for (int32_t threads : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << "threads " << threads);
    int64_t streamed_allocations[2] = {};
    for (int i = 0; i < 2; ++i) {
      const int64_t n = i == 0 ? 4 * kPage : 16 * kPage;
      const std::vector<float> kv = Random(n * kRow.elems(), 5);
      auto resident = MakeCache(f, n, {});
      auto streamed = MakeCache(f, n, {.device_bytes = 2 * resident->plan().slot_bytes});
      ASSERT_GT(streamed->plan().device_slots, 0);
      for (KvCache* c : {resident.get(), streamed.get()}) ASSERT_TRUE(c->Append(0, kv.data(), kv.data(), n).ok());
      EXPECT_EQ(AllocationsOfOneCall(*resident, q, threads), 0) << n << " positions resident";
      streamed_allocations[i] = AllocationsOfOneCall(*streamed, q, threads);
    }
    // Streaming sets up its copy job once per call (the fill function), never per page.
    EXPECT_EQ(streamed_allocations[0], streamed_allocations[1]);
    EXPECT_LE(streamed_allocations[1], 2);
  }
}

}  // namespace
}  // namespace kvq
