// A small fixed pool of worker threads that sleep (not spin) between jobs. kvq's attention runs one
// short parallel job per layer; OpenMP's spinning workers would steal the core that the cache's
// streaming thread needs between jobs, so kvq uses this pool instead.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvq {

class ThreadPool {
 public:
  /// A pool whose jobs run on `threads` threads in all (the caller's thread is one of them).
  explicit ThreadPool(int32_t threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int32_t threads() const { return static_cast<int32_t>(workers_.size()) + 1; }

  /// Calls fn(item, thread) for item in [0, n_items), items split statically into contiguous runs
  /// (thread t takes the t-th run), and returns when all are done. `thread` < threads() indexes
  /// per-thread scratch. Calls from several threads run one after another; fn must not call Run.
  void Run(int64_t n_items, const std::function<void(int64_t item, int32_t thread)>& fn);

  /// A process-wide pool with `threads` threads, one per count, kept until exit.
  static ThreadPool& Shared(int32_t threads);

 private:
  void Work(int32_t thread);
  void RunShare(int32_t thread);

  std::vector<std::thread> workers_;
  std::mutex run_mu_;
  std::mutex mu_;
  std::condition_variable start_, done_;
  const std::function<void(int64_t, int32_t)>* fn_ = nullptr;
  int64_t n_items_ = 0;
  uint64_t generation_ = 0;
  int32_t pending_ = 0;
  bool stop_ = false;
};

}  // namespace kvq
