// The thread pool runs every item exactly once, hands each thread its own index, and survives
// callers on several threads at once (they queue) — the cases the attention driver relies on.
#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace kvq {
namespace {

TEST(ThreadPool, EveryItemOnceAndThreadIndexInRange) {
  for (int32_t threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 7, 100}) {
      std::vector<std::atomic<int>> seen(n);
      std::atomic<bool> bad_thread{false};
      pool.Run(n, [&](int64_t item, int32_t thread) {
        seen[item]++;
        if (thread < 0 || thread >= pool.threads()) bad_thread = true;
      });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(seen[i], 1) << threads << " threads, item " << i;
      EXPECT_FALSE(bad_thread);
    }
  }
}

TEST(ThreadPool, SharedPoolUsedFromTwoThreadsAtOnce) {
  std::atomic<int64_t> total{0};
  auto hammer = [&] {
    for (int rep = 0; rep < 200; ++rep) {
      ThreadPool::Shared(2).Run(10, [&](int64_t item, int32_t) { total += item; });
    }
  };
  std::thread a(hammer), b(hammer);
  a.join();
  b.join();
  EXPECT_EQ(total, 2 * 200 * 45);
}

}  // namespace
}  // namespace kvq
