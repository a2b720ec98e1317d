// ThreadPool (see thread_pool.h).
#include "base/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kvq {
namespace {

// The bounded spin (thread_pool.h): pause instructions for the first kSpinPause, then
// pause-and-yield until kSpinYield has passed since the spin began, then sleep. A decode step's
// gaps between jobs (a norm, RoPE, an activation quantised) are a few microseconds, well inside.
constexpr std::chrono::nanoseconds kSpinPause{5'000};
constexpr std::chrono::nanoseconds kSpinYield{50'000};

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spins until done() holds or the bounded spin is over; returns done()'s last value.
template <class P>
bool SpinUntil(const P& done) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    for (int i = 0; i < 64; ++i) {  // the clock is read once per 64 polls
      if (done()) return true;
      CpuRelax();
    }
    const auto elapsed = std::chrono::steady_clock::now() - start;
    if (elapsed >= kSpinYield) return done();
    if (elapsed >= kSpinPause) std::this_thread::yield();
  }
}

}  // namespace

ThreadPool::ThreadPool(int32_t threads) {
  if (threads > 0xffff) {  // a caller bug: claim_ holds the share count in 16 bits (every surface allows ≤ 1024)
    std::fprintf(stderr, "kvq: ThreadPool: %d threads, at most 65535\n", threads);
    std::abort();
  }
  for (int32_t t = 1; t < threads; ++t) workers_.emplace_back([this] { Work(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(run_mu_);  // after any job another thread is running
    stop_.store(true, std::memory_order_relaxed);  // published by the generation bump below
    generation_.fetch_add(1, std::memory_order_seq_cst);
  }
  generation_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void ThreadPool::RunShare(int32_t share) {
  const int64_t n = n_items_;
  const int32_t s = shares_;
  for (int64_t item = n * share / s; item < n * (share + 1) / s; ++item) call_(fn_, item, share);
}

void ThreadPool::RunClaimedShares(uint32_t generation) {
  uint64_t c = claim_.load(std::memory_order_acquire);
  for (;;) {
    // The job of `generation` is over, or another one is out (this thread will see its new
    // generation_ next): nothing of this one to take.
    if (static_cast<uint32_t>(c >> 32) != generation) return;
    const uint32_t shares = static_cast<uint32_t>(c >> 16) & 0xffff;
    const uint32_t share = static_cast<uint32_t>(c) & 0xffff;
    if (share >= shares) return;  // every share taken
    if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    // The share is this thread's; the job's fields stay as published until every share is done,
    // and this one is not yet.
    RunShare(static_cast<int32_t>(share));
    if (done_.fetch_add(1, std::memory_order_seq_cst) + 1 == static_cast<int32_t>(shares) &&
        caller_sleeping_.load(std::memory_order_seq_cst)) {
      done_.notify_one();
    }
    c = claim_.load(std::memory_order_acquire);
  }
}

void ThreadPool::Work() {
  uint32_t seen = 0;
  for (;;) {
    if (!SpinUntil([&] { return generation_.load(std::memory_order_acquire) != seen; })) {
      // Announce the sleep before the last look at the counter (inside wait): either Run sees
      // the announcement and notifies, or this thread sees Run's new generation and does not
      // block (all four accesses seq_cst).
      sleeping_workers_.fetch_add(1, std::memory_order_seq_cst);
      generation_.wait(seen, std::memory_order_seq_cst);
      sleeping_workers_.fetch_sub(1, std::memory_order_relaxed);
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_relaxed)) return;  // ordered after the acquire load above
    RunClaimedShares(seen);
  }
}

void ThreadPool::RunJob(int64_t n_items, Call call, const void* fn) {
  if (n_items <= 0) return;
  if (workers_.empty()) {  // no shared state to guard: concurrent callers each run their own
    for (int64_t i = 0; i < n_items; ++i) call(fn, i, 0);
    return;
  }
  std::lock_guard<std::mutex> one_job_at_a_time(run_mu_);
  if (n_items == 1) {  // not worth a hand-off; under the lock, as thread 0 may be busy elsewhere
    call(fn, 0, 0);
    return;
  }
  // Every share of the previous job is done (the wait below), so no thread reads these now; a
  // worker that wakes late for an earlier job finds that job's generation gone from claim_.
  call_ = call;
  fn_ = fn;
  n_items_ = n_items;
  shares_ = static_cast<int32_t>(std::min<int64_t>(n_items, threads()));
  done_.store(0, std::memory_order_relaxed);
  const uint32_t generation = generation_.load(std::memory_order_relaxed) + 1;
  claim_.store(uint64_t{generation} << 32 | uint64_t(shares_) << 16, std::memory_order_release);
  generation_.store(generation, std::memory_order_seq_cst);  // wakes the spinning workers
  if (sleeping_workers_.load(std::memory_order_seq_cst) > 0) generation_.notify_all();
  RunClaimedShares(generation);  // the caller takes shares too, all of them if no worker comes
  if (!SpinUntil([&] { return done_.load(std::memory_order_acquire) == shares_; })) {
    caller_sleeping_.store(true, std::memory_order_seq_cst);
    for (int32_t d; (d = done_.load(std::memory_order_seq_cst)) != shares_;) done_.wait(d, std::memory_order_seq_cst);
    caller_sleeping_.store(false, std::memory_order_relaxed);
  }
  // done_ reached shares_ through every share's release increment and was read with acquire (or
  // seq_cst): their writes are visible here.
}

ThreadPool& ThreadPool::Shared(int32_t threads) {
  // One pool per thread count, alive until exit, so a reference handed out stays valid.
  static std::mutex mu;
  static std::map<int32_t, std::unique_ptr<ThreadPool>>* pools = new std::map<int32_t, std::unique_ptr<ThreadPool>>();
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<ThreadPool>& pool = (*pools)[threads];
  if (!pool) pool = std::make_unique<ThreadPool>(threads);
  return *pool;
}

}  // namespace kvq
