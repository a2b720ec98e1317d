// StagingArena and PageStreamer (see staging.h).
#include "cache/staging.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvq {

StagingArena::StagingArena(int32_t slots, int64_t slot_bytes)
    : slot_bytes_(slot_bytes),
      memory_(std::make_unique<uint8_t[]>(static_cast<size_t>(slots) * slot_bytes)),
      held_(slots, 0) {}

void StagingArena::Hold(int32_t i, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  held_total_ += bytes - held_[i];
  held_[i] = bytes;
  peak_ = std::max(peak_, held_total_);
}

void StagingArena::Release(int32_t i) { Hold(i, 0); }

int64_t StagingArena::held_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_total_;
}

int64_t StagingArena::peak_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

PageStreamer::PageStreamer(StagingArena& arena)
    : arena_(arena), slot_page_(arena.slots(), -1), slot_ready_(arena.slots(), false) {
  if (KVQ_STAGING_THREAD) worker_ = std::thread([this] { Run(); });
}

PageStreamer::~PageStreamer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void PageStreamer::Begin(Fill fill, int64_t n_pages) {
  std::lock_guard<std::mutex> lock(mu_);
  fill_ = std::move(fill);
  n_pages_ = n_pages;
  next_fill_ = 0;
  error_ = Status::Ok();
  std::fill(slot_page_.begin(), slot_page_.end(), -1);
  std::fill(slot_ready_.begin(), slot_ready_.end(), false);
  active_ = true;
  cv_.notify_all();
}

void PageStreamer::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // Wait for a page to copy whose slot is free.
    cv_.wait(lock, [this] {
      return stop_ || (active_ && next_fill_ < n_pages_ &&
                       slot_page_[next_fill_ % arena_.slots()] == -1);
    });
    if (stop_) return;
    CopyNext(lock);
  }
}

void PageStreamer::CopyNext(std::unique_lock<std::mutex>& lock) {
  const int64_t page = next_fill_++;
  const int32_t slot = static_cast<int32_t>(page % arena_.slots());
  slot_page_[slot] = page;
  slot_ready_[slot] = false;
  // fill_ stays put while this copy runs: Begin replaces it only after End, which waits for
  // the copy in flight. (Copying it here would allocate once per page.)
  const Fill& fill = fill_;
  lock.unlock();
  const auto t0 = std::chrono::steady_clock::now();
  const Result<int64_t> bytes = fill(page, arena_.slot(slot));  // the copy runs unlocked
  if (bytes.ok()) arena_.Hold(slot, *bytes);
  lock.lock();
  copy_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!bytes.ok() && error_.ok()) error_ = bytes.status();
  slot_ready_[slot] = true;
  cv_.notify_all();
}

Result<const uint8_t*> PageStreamer::Acquire(int64_t page) {
  const int32_t slot = static_cast<int32_t>(page % arena_.slots());
  std::unique_lock<std::mutex> lock(mu_);
  const auto t0 = std::chrono::steady_clock::now();
  if (!KVQ_STAGING_THREAD) {
    // No worker: copy in order up to `page` here, while its slot is free (as the worker would).
    while (!(slot_page_[slot] == page && slot_ready_[slot]) && active_ && next_fill_ <= page &&
           next_fill_ < n_pages_ && slot_page_[next_fill_ % arena_.slots()] == -1) {
      CopyNext(lock);
    }
    if (!(slot_page_[slot] == page && slot_ready_[slot])) {
      return Status::Error(fmt::format("staging: page {} acquired out of order or its slot is still held "
                                       "(no copy thread in this build)", page));
    }
  }
  cv_.wait(lock, [&] { return slot_page_[slot] == page && slot_ready_[slot]; });
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!error_.ok()) return error_;
  return static_cast<const uint8_t*>(arena_.slot(slot));
}

void PageStreamer::Release(int64_t page) {
  const int32_t slot = static_cast<int32_t>(page % arena_.slots());
  arena_.Release(slot);
  std::lock_guard<std::mutex> lock(mu_);
  slot_page_[slot] = -1;
  slot_ready_[slot] = false;
  cv_.notify_all();
}

void PageStreamer::End() {
  std::unique_lock<std::mutex> lock(mu_);
  n_pages_ = std::min(n_pages_, next_fill_);  // no new copies
  // Wait for any copy in flight, then free every slot.
  cv_.wait(lock, [this] {
    for (size_t s = 0; s < slot_page_.size(); ++s) {
      if (slot_page_[s] != -1 && !slot_ready_[s]) return false;
    }
    return true;
  });
  for (size_t s = 0; s < slot_page_.size(); ++s) {
    if (slot_page_[s] != -1) arena_.Release(static_cast<int32_t>(s));
    slot_page_[s] = -1;
    slot_ready_[s] = false;
  }
  active_ = false;
  cv_.notify_all();
}

double PageStreamer::wait_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return wait_seconds_;
}

double PageStreamer::copy_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return copy_seconds_;
}

}  // namespace kvq
