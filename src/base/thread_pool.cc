// ThreadPool (see thread_pool.h).
#include "base/thread_pool.h"

#include <algorithm>
#include <chrono>
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
  for (int32_t t = 1; t < threads; ++t) workers_.emplace_back([this, t] { Work(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(run_mu_);  // after any job another thread is running
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_seq_cst);
  }
  generation_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void ThreadPool::RunShare(int32_t thread) {
  const int64_t n = n_items_;
  const int32_t s = shares_;
  for (int64_t item = n * thread / s; item < n * (thread + 1) / s; ++item) call_(fn_, item, thread);
}

void ThreadPool::Work(int32_t thread) {
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
    if (stop_) return;
    if (thread < shares_) RunShare(thread);
    if (pending_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
        caller_sleeping_.load(std::memory_order_seq_cst)) {
      pending_.notify_one();
    }
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
  call_ = call;
  fn_ = fn;
  n_items_ = n_items;
  shares_ = static_cast<int32_t>(std::min<int64_t>(n_items, threads()));
  pending_.store(static_cast<int32_t>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_seq_cst);  // publishes the job (release)
  if (sleeping_workers_.load(std::memory_order_seq_cst) > 0) generation_.notify_all();
  RunShare(0);
  if (!SpinUntil([&] { return pending_.load(std::memory_order_acquire) == 0; })) {
    caller_sleeping_.store(true, std::memory_order_seq_cst);
    for (int32_t p; (p = pending_.load(std::memory_order_seq_cst)) != 0;) pending_.wait(p, std::memory_order_seq_cst);
    caller_sleeping_.store(false, std::memory_order_relaxed);
  }
  // pending_ reached 0 through every worker's release decrement and was read with acquire (or
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
