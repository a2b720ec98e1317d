// AttendWindows (kvq/attention.h): one dispatch over a whole list of windows gives the same bits
// as AttendWindow on each window in turn, for every thread count; each window is acquired and
// released exactly once; a window that fails to arrive stops every query at the same window, so
// the state holds exactly the windows before it (docs/design.md §3).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "attention/attention_fixture.h"

namespace kvq::testing_attention {
namespace {

// Windows of a fixture Cache handed out one by one; Acquire(fail_at) fails; a delay per
// Acquire stands in for a copy thread that delivers pages late.
class ListSource final : public KvWindowSource {
 public:
  ListSource(const Cache& cache, Windows windows, int64_t fail_at = -1, int delay_us = 0)
      : cache_(cache), windows_(std::move(windows)), fail_at_(fail_at), delay_us_(delay_us),
        acquires_(windows_.size()), releases_(windows_.size()) {}
  int64_t n_windows() const override { return static_cast<int64_t>(windows_.size()); }
  kvq::Result<KvWindow> Acquire(int64_t i) override {
    ++acquires_[i];
    if (delay_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
    if (i == fail_at_) return Status::Error("window " + std::to_string(i) + " did not arrive");
    return cache_.Window(windows_[i].first, windows_[i].second);
  }
  void Release(int64_t i) override { ++releases_[i]; }

  int acquires(size_t i) const { return acquires_[i]; }
  int releases(size_t i) const { return releases_[i]; }

 private:
  const Cache& cache_;
  Windows windows_;
  int64_t fail_at_;
  int delay_us_;
  std::vector<std::atomic<int>> acquires_, releases_;
};

Result RunSource(const Cache& cache, const AttentionOptions& o, ListSource& source, Status* status) {
  AttentionState state(cache.shape(), static_cast<int32_t>(cache.q().size() / (cache.shape().n_heads *
                                                                                cache.shape().head_dim)));
  *status = AttendWindows(o, cache.q().data(), cache.first_query_position(), source, state);
  return ResultOf(state);
}

constexpr AttentionShape kShape{.n_heads = 8, .n_kv_heads = 4, .head_dim = 32};

TEST(AttendWindows, OneDispatchIsBitIdenticalToWindowByWindowForEveryThreadCount) {
  for (const char* name : {"f16", "int4", "int4-kivi", "fp8-e4m3"}) {
    const FormatDesc* f = *FindFormat(name);
    for (int32_t tokens : {1, 5}) {
      const Cache cache(*f, kShape, 300, tokens, 11);
      for (AttentionKernel kernel : {AttentionKernel::kScalar, AttentionKernel::kSimd}) {
        const AttentionOptions o = Options(kShape, kernel);
        for (int64_t size : {32, 64, 100, 300}) {
          const Result want = cache.Run(o, Even(300, size));
          for (int32_t threads : {1, 2, 3, 8}) {
            SCOPED_TRACE(::testing::Message() << name << " tokens " << tokens << " windows of " << size
                                              << " threads " << threads
                                              << (kernel == AttentionKernel::kSimd ? " simd" : " scalar"));
            AttentionOptions ot = o;
            ot.threads = threads;
            ListSource source(cache, Even(300, size), -1, threads > 1 ? 50 : 0);
            Status s;
            EXPECT_TRUE(BitIdentical(RunSource(cache, ot, source, &s), want));
            EXPECT_TRUE(s.ok()) << s.message();
            for (int64_t i = 0; i < source.n_windows(); ++i) {
              EXPECT_EQ(source.acquires(i), 1) << "window " << i;
              EXPECT_EQ(source.releases(i), 1) << "window " << i;
            }
          }
        }
      }
    }
  }
}

TEST(AttendWindows, AWindowThatFailsStopsEveryQueryBeforeIt) {
  const Cache cache(**FindFormat("int8"), kShape, 300, 5, 12);
  const Windows windows = Even(300, 64);  // 5 windows
  for (AttentionKernel kernel : {AttentionKernel::kScalar, AttentionKernel::kSimd}) {
    for (int64_t fail_at : {0, 2, 4}) {
      const Result want = cache.Run(Options(kShape, kernel), Windows(windows.begin(), windows.begin() + fail_at));
      for (int32_t threads : {1, 2, 4}) {
        SCOPED_TRACE(::testing::Message() << "fail at " << fail_at << " threads " << threads);
        AttentionOptions o = Options(kShape, kernel);
        o.threads = threads;
        ListSource source(cache, windows, fail_at, 50);
        Status s;
        const Result got = RunSource(cache, o, source, &s);
        ASSERT_FALSE(s.ok());
        EXPECT_EQ(s.message(), "window " + std::to_string(fail_at) + " did not arrive");
        EXPECT_TRUE(BitIdentical(got, want));
        for (int64_t i = 0; i < source.n_windows(); ++i) {
          EXPECT_EQ(source.acquires(i), i <= fail_at ? 1 : 0) << "window " << i;
          EXPECT_EQ(source.releases(i), i < fail_at ? 1 : 0) << "window " << i;
        }
      }
    }
  }
}

// The same with position chunks shared by the threads (chunks of 64, windows of 50 that straddle
// them): chunk states are merged only for the windows that arrived.
TEST(AttendWindows, AWindowThatFailsStopsEveryQueryBeforeItWithChunks) {
  for (int32_t kv_heads : {1, 2}) {
    const AttentionShape shape{.n_heads = 4 * kv_heads, .n_kv_heads = kv_heads, .head_dim = 32};
    for (int32_t tokens : {1, 5}) {
      const Cache cache(**FindFormat("int8"), shape, 300, tokens, 15);
      const Windows windows = Even(300, 50);  // 6 windows
      for (AttentionKernel kernel : {AttentionKernel::kScalar, AttentionKernel::kSimd}) {
        AttentionOptions o = Options(shape, kernel);
        o.position_chunk = 64;
        for (int64_t fail_at : {1, 3, 5}) {
          const Result want = cache.Run(o, Windows(windows.begin(), windows.begin() + fail_at));
          for (int32_t threads : {2, 3, 8}) {
            SCOPED_TRACE(::testing::Message() << "kv heads " << kv_heads << " tokens " << tokens << " fail at "
                                              << fail_at << " threads " << threads);
            AttentionOptions ot = o;
            ot.threads = threads;
            ListSource source(cache, windows, fail_at, 50);
            Status s;
            const Result got = RunSource(cache, ot, source, &s);
            ASSERT_FALSE(s.ok());
            EXPECT_TRUE(BitIdentical(got, want));
            for (int64_t i = 0; i < source.n_windows(); ++i) {
              EXPECT_EQ(source.releases(i), i < fail_at ? 1 : 0) << "window " << i;
            }
          }
        }
      }
    }
  }
}

// The state's scratch is reused: a second call with the same state gives the same bits as the
// first (nothing left over from the first call leaks in), also after a call with other sizes.
TEST(AttendWindows, ReusedStateGivesTheSameBits) {
  const Cache big(**FindFormat("f16"), kShape, 300, 5, 13);
  const Cache small(**FindFormat("f16"), kShape, 70, 1, 14);
  AttentionOptions o = Options(kShape, AttentionKernel::kSimd);
  o.threads = 3;
  const Result want_big = big.Run(Options(kShape, AttentionKernel::kSimd), Even(300, 32));
  const Result want_small = small.Run(Options(kShape, AttentionKernel::kSimd), Even(70, 64));
  AttentionState state5(kShape, 5), state1(kShape, 1);
  for (int round = 0; round < 3; ++round) {
    for (const Cache* c : {&big, &small}) {
      AttentionState& state = c == &big ? state5 : state1;
      state.Reset();
      ListSource source(*c, c == &big ? Even(300, 32) : Even(70, 64));
      ASSERT_TRUE(AttendWindows(o, c->q().data(), c->first_query_position(), source, state).ok());
      EXPECT_TRUE(BitIdentical(ResultOf(state), c == &big ? want_big : want_small)) << "round " << round;
    }
  }
}

}  // namespace
}  // namespace kvq::testing_attention
