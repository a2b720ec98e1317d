// A small fixed pool of worker threads, owned by whoever runs a forward pass (each session's
// DecoderModel owns one), so concurrent sessions never share workers or a lock.
//
// Hand-off: Run publishes the job and bumps an atomic generation; a worker that finished its last
// job spins on that counter for a bounded time (thread_pool.cc: kSpinPause of pause instructions,
// then up to kSpinYield in all of sched_yield calls) and then sleeps on it (std::atomic::wait, a
// futex on Linux). A decode step hands jobs out every few microseconds, so a worker catches the
// next one while still spinning and no sleep/wake pair is paid per product.
//
// Shares are claimed, not assigned: the caller and every worker that wakes take the job's shares
// from one counter, and Run returns once every share is done — it never waits for a worker that
// has not come. On a machine with other work (a browser, a build) a worker is often not running
// when the job is published; if share t were that worker's alone, every one of a token's ~100
// jobs would wait a scheduler slice for it (decode 6–16× slower beside one or two busy
// processes, measured on 2 cores, instead of the ~2× that sharing the cores costs). Which thread
// runs a share changes no bit: share t is the same items with the same `thread` index t.
//
// Why bounded: kvq's KV cache streams pages in on a background thread between (and during)
// attention jobs. OpenMP-style workers that spin until the next job would take the core that
// thread needs whenever the step waits on a page or the session is idle. Here an idle worker gives
// its core up within kSpinYield (tens of microseconds; during the yield phase a runnable streaming
// thread on that core already goes first), then sleeps until the next job.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace kvq {

class ThreadPool {
 public:
  /// A pool whose jobs run on `threads` threads in all (the caller's thread is one of them, so
  /// threads − 1 workers are started; 1: none, every job runs inline).
  explicit ThreadPool(int32_t threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int32_t threads() const { return static_cast<int32_t>(workers_.size()) + 1; }

  /// Calls fn(item, thread) for item in [0, n_items), items split statically into
  /// min(n_items, threads()) contiguous runs, the shares (share t is called with `thread` = t, so
  /// `thread` < min(n_items, threads()) indexes per-share scratch; whichever pool thread claims it
  /// runs it), and returns when all are done. fn must
  /// not call Run on this pool. Calls from several threads at once are safe: jobs that use the
  /// workers run one after another (a per-pool mutex, uncontended when a pool has one user, as a
  /// session's has); a pool of one thread runs every job at once, inline, taking no lock.
  template <class F>
  void Run(int64_t n_items, const F& fn) {
    static_assert(std::is_invocable_v<const F&, int64_t, int32_t>);
    RunJob(n_items, [](const void* f, int64_t item, int32_t thread) { (*static_cast<const F*>(f))(item, thread); },
           &fn);
  }

  /// A process-wide pool with `threads` threads, one per count, kept until exit: for one-off tools
  /// (synth, the bandwidth probes) only. Takes a global lock: never call it per job.
  static ThreadPool& Shared(int32_t threads);

 private:
  using Call = void (*)(const void* fn, int64_t item, int32_t thread);
  void RunJob(int64_t n_items, Call call, const void* fn);
  void Work();
  // Takes shares of the job of `generation` until none is left (or that job is over).
  void RunClaimedShares(uint32_t generation);
  void RunShare(int32_t share);

  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // callers on several threads queue here
  // The job, written by Run before it bumps generation_ (release) and read by the workers after
  // they see the new value (acquire).
  Call call_ = nullptr;
  const void* fn_ = nullptr;
  int64_t n_items_ = 0;
  int32_t shares_ = 0;  // min(n_items, threads())
  // Set once, by the destructor, before its last generation bump. Atomic: a worker that wakes late
  // for a job the caller has already finished reads it while the destructor may be writing it.
  std::atomic<bool> stop_{false};
  std::atomic<uint32_t> generation_{0};  // bumped once per job (and once to stop)
  // The current job's claims: [generation: 32 bits][shares: 16][next share: 16] (threads() ≤
  // 65535, checked at construction), one word so that a claim can never take a share of a job
  // other than the one it saw.
  std::atomic<uint64_t> claim_{0};
  std::atomic<int32_t> done_{0};  // shares of the current job done
  // Whether anyone may be asleep on generation_ (workers) or done_ (the caller): a job's
  // publisher and its last finisher make the notify system call only then.
  std::atomic<int32_t> sleeping_workers_{0};
  std::atomic<bool> caller_sleeping_{false};
};

}  // namespace kvq
