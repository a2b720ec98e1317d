// The thread pool runs every item exactly once with a thread index inside its shares, keeps doing
// so over many jobs back to back (the generation hand-off and the bounded spin), lets two pools be
// driven from two threads at once and one pool from two callers, and can be destroyed while its
// workers are asleep or still spinning.
#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace kvq {
namespace {

// Runs one job of n items on `pool` and checks each item ran once, on a thread index below
// min(n, threads), with the items of a share contiguous and in order.
void ExpectEachItemOnce(ThreadPool& pool, int64_t n) {
  std::vector<std::atomic<int>> seen(n);
  std::vector<int32_t> thread_of(n, -1);
  pool.Run(n, [&](int64_t item, int32_t thread) {
    seen[item]++;
    thread_of[item] = thread;
  });
  const int32_t shares = static_cast<int32_t>(std::min<int64_t>(n, pool.threads()));
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(seen[i], 1) << pool.threads() << " threads, " << n << " items, item " << i;
    ASSERT_GE(thread_of[i], 0);
    ASSERT_LT(thread_of[i], shares) << "item " << i;
    if (i > 0) ASSERT_GE(thread_of[i], thread_of[i - 1]) << "shares are contiguous runs, in order";
  }
}

TEST(ThreadPool, EveryItemOnceAndThreadIndexInRange) {
  for (int32_t threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 8, 9, 100}) ExpectEachItemOnce(pool, n);
  }
}

TEST(ThreadPool, ManyJobsBackToBack) {
  // Jobs that follow each other within the spin and jobs after the workers have gone to sleep.
  ThreadPool pool(4);
  int64_t expected = 0;
  std::atomic<int64_t> total{0};
  for (int rep = 0; rep < 5000; ++rep) {
    const int64_t n = 1 + rep % 13;
    pool.Run(n, [&](int64_t item, int32_t) { total.fetch_add(item + 1, std::memory_order_relaxed); });
    expected += n * (n + 1) / 2;
    // A job's writes are visible to the caller once Run returns (no atomics needed to read them).
    ASSERT_EQ(total.load(std::memory_order_relaxed), expected) << "job " << rep;
    if (rep % 1000 == 999) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // past the spin
  }
  for (int rep = 0; rep < 200; ++rep) ExpectEachItemOnce(pool, 37);
}

TEST(ThreadPool, PlainWritesOfEveryItemAreSeenAfterRun) {
  ThreadPool pool(3);
  std::vector<int64_t> out(1000);
  for (int rep = 0; rep < 300; ++rep) {
    pool.Run(static_cast<int64_t>(out.size()), [&](int64_t item, int32_t) { out[item] = item * rep; });
    for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], static_cast<int64_t>(i) * rep);
  }
}

TEST(ThreadPool, TwoPoolsUsedFromTwoThreadsAtOnce) {
  ThreadPool a(2), b(3);
  std::atomic<int64_t> total_a{0}, total_b{0};
  auto hammer = [](ThreadPool& pool, std::atomic<int64_t>& total) {
    for (int rep = 0; rep < 2000; ++rep) pool.Run(10, [&](int64_t item, int32_t) { total += item; });
  };
  std::thread ta(hammer, std::ref(a), std::ref(total_a)), tb(hammer, std::ref(b), std::ref(total_b));
  ta.join();
  tb.join();
  EXPECT_EQ(total_a, 2000 * 45);
  EXPECT_EQ(total_b, 2000 * 45);
}

TEST(ThreadPool, OnePoolUsedFromTwoThreadsAtOnce) {
  // Callers queue on the pool; each job still sees each of its items once.
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  std::atomic<bool> overlap{false};
  std::atomic<int32_t> in_thread_zero{0};
  auto hammer = [&] {
    for (int rep = 0; rep < 1000; ++rep) {
      pool.Run(10, [&](int64_t item, int32_t thread) {
        total += item;
        if (thread == 0 && in_thread_zero.fetch_add(1) != 0) overlap = true;  // per-thread scratch would collide
        if (thread == 0) in_thread_zero.fetch_sub(1);
      });
    }
  };
  std::thread x(hammer), y(hammer);
  x.join();
  y.join();
  EXPECT_EQ(total, 2 * 1000 * 45);
  EXPECT_FALSE(overlap);
}

TEST(ThreadPool, DestroyedWhileIdle) {
  for (int32_t threads : {1, 2, 8}) {
    {
      ThreadPool never_used(threads);  // workers asleep (or still spinning) from the start
    }
    {
      ThreadPool spinning(threads);
      ExpectEachItemOnce(spinning, 16);  // destroyed right after a job: workers still spinning
    }
    {
      ThreadPool asleep(threads);
      ExpectEachItemOnce(asleep, 16);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the bounded spin
    }
  }
}

TEST(ThreadPool, WorkersWakeAfterSleeping) {
  // After the spin ends the workers sleep; the next job must still reach all of them.
  ThreadPool pool(4);
  for (int rep = 0; rep < 5; ++rep) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::vector<std::atomic<int>> by_thread(4);
    pool.Run(4, [&](int64_t, int32_t thread) { by_thread[thread]++; });
    for (int t = 0; t < 4; ++t) EXPECT_EQ(by_thread[t], 1) << "thread " << t;
  }
}

}  // namespace
}  // namespace kvq
