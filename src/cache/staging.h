// The device working set and the thread that fills it. On CPU the "device" is a staging arena:
// a fixed number of page-sized slots, allocated once within the device budget. PageStreamer copies
// pages into the slots on a background thread, in order, while the consumer works on earlier
// ones — with two or more slots the next page is in flight while the current one is consumed.
// A compute device's working set (VRAM, WebGPU buffers) is a KvDevice instead (kvq/kv_device.h).
// Without threads (the WebAssembly build has no pthreads) there is no worker: Acquire copies the
// pages up to the one asked for itself, in the same order, into the same slots.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kvq/status.h"

#if defined(__EMSCRIPTEN__) && !defined(__EMSCRIPTEN_PTHREADS__)
#define KVQ_STAGING_THREAD 0
#else
#define KVQ_STAGING_THREAD 1
#endif

namespace kvq {

class StagingArena {
 public:
  StagingArena(int32_t slots, int64_t slot_bytes);
  int32_t slots() const { return static_cast<int32_t>(held_.size()); }
  int64_t slot_bytes() const { return slot_bytes_; }
  uint8_t* slot(int32_t i) { return memory_.get() + i * slot_bytes_; }
  int64_t capacity_bytes() const { return slot_bytes_ * slots(); }

  /// Accounting of bytes holding data: a slot holds `bytes` until released.
  void Hold(int32_t i, int64_t bytes);
  void Release(int32_t i);
  int64_t held_bytes() const;
  int64_t peak_bytes() const;

 private:
  int64_t slot_bytes_;
  std::unique_ptr<uint8_t[]> memory_;
  std::vector<int64_t> held_;
  int64_t held_total_ = 0;
  int64_t peak_ = 0;
  mutable std::mutex mu_;
};

class PageStreamer {
 public:
  /// fill(page, dst) writes page `page` into dst and returns the bytes written.
  using Fill = std::function<Result<int64_t>(int64_t page, uint8_t* dst)>;

  explicit PageStreamer(StagingArena& arena);
  ~PageStreamer();

  /// Starts streaming pages [0, n_pages) in order.
  void Begin(Fill fill, int64_t n_pages);
  /// Waits for `page` (pages are acquired in order) and returns its slot.
  Result<const uint8_t*> Acquire(int64_t page);
  /// The consumer is done with `page`: its slot may be refilled.
  void Release(int64_t page);
  /// Ends the stream (early, on an error, or after the last page); waits for the worker.
  void End();
  /// Since construction: seconds Acquire waited for a page, seconds the worker spent copying.
  double wait_seconds() const;
  double copy_seconds() const;

 private:
  void Run();
  /// Copies page next_fill_ into its slot with `lock` released meanwhile (mu_ held on entry and exit).
  void CopyNext(std::unique_lock<std::mutex>& lock);

  StagingArena& arena_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Fill fill_;
  int64_t n_pages_ = 0;
  int64_t next_fill_ = 0;           // the next page the worker copies
  std::vector<int64_t> slot_page_;  // page held by each slot, -1 if free
  std::vector<bool> slot_ready_;
  Status error_;
  double wait_seconds_ = 0, copy_seconds_ = 0;  // guarded by mu_
  bool active_ = false;
  bool stop_ = false;
  std::thread worker_;  // not started without threads (KVQ_STAGING_THREAD 0)
};

}  // namespace kvq
