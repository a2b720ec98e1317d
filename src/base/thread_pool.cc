// ThreadPool (see thread_pool.h).
#include "base/thread_pool.h"

#include <map>
#include <memory>

namespace kvq {

ThreadPool::ThreadPool(int32_t threads) {
  for (int32_t t = 1; t < threads; ++t) workers_.emplace_back([this, t] { Work(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void ThreadPool::RunShare(int32_t thread) {
  const int64_t n = n_items_;
  const int32_t t = threads();
  for (int64_t item = n * thread / t; item < n * (thread + 1) / t; ++item) (*fn_)(item, thread);
}

void ThreadPool::Work(int32_t thread) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    RunShare(thread);
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_ == 0) done_.notify_one();
  }
}

void ThreadPool::Run(int64_t n_items, const std::function<void(int64_t, int32_t)>& fn) {
  std::lock_guard<std::mutex> one_job_at_a_time(run_mu_);  // callers on several threads queue here
  if (workers_.empty() || n_items <= 1) {
    for (int64_t i = 0; i < n_items; ++i) fn(i, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_items_ = n_items;
    pending_ = static_cast<int32_t>(workers_.size());
    ++generation_;
  }
  start_.notify_all();
  RunShare(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return pending_ == 0; });
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
