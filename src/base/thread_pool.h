// A small fixed pool of worker threads, owned by whoever runs a forward pass (each session's
// DecoderModel owns one), so concurrent sessions never share workers or a lock.
//
// Hand-off: Run publishes the job and bumps an atomic generation; a worker that finished its last
// job spins on that counter for a bounded time (thread_pool.cc: kSpinPause of pause instructions,
// then up to kSpinYield in all of sched_yield calls) and then sleeps on it (std::atomic::wait, a
// futex on Linux). The caller does its own share and waits for the others the same way. A decode step hands
// jobs out every few microseconds, so a worker catches the next one while still spinning and no
// sleep/wake pair is paid per product.
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
  /// min(n_items, threads()) contiguous runs (thread t takes the t-th run, so `thread` <
  /// min(n_items, threads()) indexes per-thread scratch), and returns when all are done. fn must
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
  void Work(int32_t thread);
  void RunShare(int32_t thread);

  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // callers on several threads queue here
  // The job, written by Run before it bumps generation_ (release) and read by the workers after
  // they see the new value (acquire).
  Call call_ = nullptr;
  const void* fn_ = nullptr;
  int64_t n_items_ = 0;
  int32_t shares_ = 0;  // min(n_items, threads())
  bool stop_ = false;
  std::atomic<uint32_t> generation_{0};  // bumped once per job (and once to stop)
  std::atomic<int32_t> pending_{0};      // workers not yet done with the current job
  // Whether anyone may be asleep on generation_ (workers) or pending_ (the caller): a job's
  // publisher and its last finisher make the notify system call only then.
  std::atomic<int32_t> sleeping_workers_{0};
  std::atomic<bool> caller_sleeping_{false};
};

}  // namespace kvq
