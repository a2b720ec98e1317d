// Where a cache's pages live: the master copy, in host RAM (one allocation per page, made on
// first write) or in a file on disk (each layer's pages at fixed offsets; only the page being
// filled is held in RAM, written out when full). Mechanism only: the cache decides what to write.
// Host pages may be shared between stores (a forked cache): a shared page is copied before it is
// written (copy on write), so a store never changes bytes another one reads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvq/status.h"

namespace kvq {

class PageStore {
 public:
  /// page_bytes[l]: bytes of one page of layer l; max_pages: pages per layer at most.
  /// disk_dir empty: host RAM; else a new file in that folder (removed on destruction unless keep).
  static Result<std::unique_ptr<PageStore>> Create(std::vector<int64_t> page_bytes,
                                                   int64_t max_pages, const std::string& disk_dir,
                                                   bool keep_file);
  ~PageStore();

  bool on_disk() const { return fd_ >= 0; }
  const std::string& file() const { return path_; }
  int64_t page_bytes(int64_t layer) const { return page_bytes_[layer]; }

  /// The page to write rows into. On disk, pages being filled ("tails", zero-filled when first
  /// asked for) are held in RAM until Filled; the cache keeps few of them (K and V may fill
  /// different pages when their residuals differ).
  Result<uint8_t*> Writable(int64_t layer, int64_t page);
  /// A page being filled is complete: on disk, write it out and drop it from RAM.
  Status Filled(int64_t layer, int64_t page);
  /// The page's bytes in host RAM if they are there (host tier, or a disk tier's tail), else null.
  const uint8_t* InHost(int64_t layer, int64_t page) const;
  /// Copies the page's bytes to dst (from RAM, or pread from the file).
  Status Read(int64_t layer, int64_t page, uint8_t* dst) const;
  /// Forgets a layer's pages (before an import).
  void Clear(int64_t layer);
  /// Host master only: frees a layer's pages from `first_page` on (a truncated cache).
  void DropFrom(int64_t layer, int64_t first_page);
  /// Host bytes held now (pages or tails), shared pages included.
  int64_t host_bytes() const;
  /// Of those, the bytes of pages no other store holds.
  int64_t unshared_host_bytes() const;
  /// Host master only: refers to every page of `from` (same layers and page sizes), sharing them
  /// until one side writes. Replaces this store's pages.
  void SharePagesOf(const PageStore& from);

 private:
  PageStore() = default;
  // Bytes of the host pages (or disk tails) held by at most `max_holders` stores.
  int64_t HeldBytes(long max_holders) const;
  std::vector<int64_t> page_bytes_;
  std::vector<int64_t> layer_offset_;  // disk: byte offset of each layer's page 0
  int64_t max_pages_ = 0;
  // host: [layer][page], shared with forks; written only while this store alone holds the page.
  std::vector<std::vector<std::shared_ptr<uint8_t[]>>> pages_;
  struct Tail {
    int64_t page;
    std::unique_ptr<uint8_t[]> bytes;  // [page_bytes]
  };
  std::vector<std::vector<Tail>> tails_;  // disk: [layer][pages being filled]
  int fd_ = -1;
  std::string path_;
  bool keep_ = false;
};

}  // namespace kvq
