// PageStore (see page_store.h). Disk I/O is pread/pwrite at fixed offsets, so pages never move
// and a short read or write is an error naming the file, not a silent hole.
#include "cache/page_store.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>

namespace kvq {
namespace {

Status IoError(const std::string& what, const std::string& path) {
  return Status::Error(fmt::format("{} {}: {}", what, path, std::strerror(errno)));
}

Status FullPwrite(int fd, const uint8_t* p, int64_t bytes, int64_t offset, const std::string& path) {
  while (bytes > 0) {
    const ssize_t n = pwrite(fd, p, static_cast<size_t>(bytes), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return IoError("cannot write the KV cache file", path);
    p += n, bytes -= n, offset += n;
  }
  return Status::Ok();
}

// Reserves [0, bytes) of fd's file; 0 or the errno. Emscripten has no Linux fallocate.
int ReserveFile(int fd, int64_t bytes) {
#if defined(__EMSCRIPTEN__)
  return posix_fallocate(fd, 0, bytes);
#else
  return fallocate(fd, 0, 0, bytes) == 0 ? 0 : errno;
#endif
}

}  // namespace

Result<std::unique_ptr<PageStore>> PageStore::Create(std::vector<int64_t> page_bytes,
                                                     int64_t max_pages, const std::string& disk_dir,
                                                     bool keep_file) {
  std::unique_ptr<PageStore> s(new PageStore());
  s->page_bytes_ = std::move(page_bytes);
  s->max_pages_ = max_pages;
  const size_t layers = s->page_bytes_.size();
  s->pages_.resize(layers);
  if (disk_dir.empty()) return s;
  static std::atomic<int> counter{0};
  s->path_ = fmt::format("{}/kvq-cache-{}-{}.kv", disk_dir, getpid(), counter++);
  s->fd_ = open(s->path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (s->fd_ < 0) return IoError("--kv-disk: cannot create", s->path_);
  s->keep_ = keep_file;
  int64_t offset = 0;
  for (int64_t b : s->page_bytes_) {
    s->layer_offset_.push_back(offset);
    offset += b * max_pages;
  }
  s->tails_.resize(layers);
  // Reserve the whole file now: a full disk is refused at start, not when a page fills later.
  if (const int err = offset > 0 ? ReserveFile(s->fd_, offset) : 0; err != 0 && err != EOPNOTSUPP) {
    errno = err;
    return IoError(fmt::format("--kv-disk: cannot reserve {} bytes for", offset), s->path_);
  }
  return s;
}

PageStore::~PageStore() {
  if (fd_ >= 0) {
    close(fd_);
    if (!keep_) unlink(path_.c_str());
  }
}

Result<uint8_t*> PageStore::Writable(int64_t layer, int64_t page) {
  const int64_t bytes = page_bytes_[layer];
  if (!on_disk()) {
    auto& pages = pages_[layer];
    if (static_cast<int64_t>(pages.size()) <= page) pages.resize(page + 1);
    if (!pages[page]) {
      pages[page] = std::shared_ptr<uint8_t[]>(new uint8_t[static_cast<size_t>(bytes)]());  // zeroed
    } else if (pages[page].use_count() > 1) {
      // Shared with a fork: write a copy. Only a thread using this store adds holders to its
      // pages, so a count of 1 seen here cannot grow while the page is written.
      std::shared_ptr<uint8_t[]> copy(new uint8_t[static_cast<size_t>(bytes)]);
      std::memcpy(copy.get(), pages[page].get(), static_cast<size_t>(bytes));
      pages[page] = std::move(copy);
    }
    return pages[page].get();
  }
  for (Tail& t : tails_[layer]) {
    if (t.page == page) return t.bytes.get();
  }
  tails_[layer].push_back({page, std::make_unique<uint8_t[]>(bytes)});  // zeroed
  return tails_[layer].back().bytes.get();
}

Status PageStore::Filled(int64_t layer, int64_t page) {
  if (!on_disk()) return Status::Ok();
  std::vector<Tail>& tails = tails_[layer];
  for (size_t i = 0; i < tails.size(); ++i) {
    if (tails[i].page != page) continue;
    if (Status s = FullPwrite(fd_, tails[i].bytes.get(), page_bytes_[layer],
                              layer_offset_[layer] + page * page_bytes_[layer], path_);
        !s.ok()) {
      return s;
    }
    tails.erase(tails.begin() + static_cast<std::ptrdiff_t>(i));
    return Status::Ok();
  }
  return Status::Error(fmt::format("KV cache page {} of layer {} was not being filled", page, layer));
}

const uint8_t* PageStore::InHost(int64_t layer, int64_t page) const {
  if (!on_disk()) {
    const auto& pages = pages_[layer];
    return page < static_cast<int64_t>(pages.size()) ? pages[page].get() : nullptr;
  }
  for (const Tail& t : tails_[layer]) {
    if (t.page == page) return t.bytes.get();
  }
  return nullptr;
}

Status PageStore::Read(int64_t layer, int64_t page, uint8_t* dst) const {
  const int64_t bytes = page_bytes_[layer];
  if (const uint8_t* p = InHost(layer, page)) {
    std::memcpy(dst, p, bytes);
    return Status::Ok();
  }
  if (!on_disk()) return Status::Error(fmt::format("KV cache page {} of layer {} was never written", page, layer));
  int64_t done = 0;
  const int64_t offset = layer_offset_[layer] + page * bytes;
  while (done < bytes) {
    const ssize_t n = pread(fd_, dst + done, static_cast<size_t>(bytes - done), offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError("cannot read the KV cache file", path_);
    if (n == 0) {
      return Status::Error(fmt::format("the KV cache file {} is shorter than expected (page {} of layer {})",
                                       path_, page, layer));
    }
    done += n;
  }
  return Status::Ok();
}

void PageStore::Clear(int64_t layer) {
  pages_[layer].clear();
  if (on_disk()) tails_[layer].clear();
}

void PageStore::DropFrom(int64_t layer, int64_t first_page) {
  auto& pages = pages_[layer];
  if (static_cast<int64_t>(pages.size()) > first_page) pages.resize(first_page);
}

void PageStore::SharePagesOf(const PageStore& from) {
  pages_ = from.pages_;
}

int64_t PageStore::HeldBytes(long max_holders) const {
  int64_t total = 0;
  for (size_t l = 0; l < page_bytes_.size(); ++l) {
    if (on_disk()) {
      total += static_cast<int64_t>(tails_[l].size()) * page_bytes_[l];
    } else {
      for (const auto& p : pages_[l]) total += p && p.use_count() <= max_holders ? page_bytes_[l] : 0;
    }
  }
  return total;
}

int64_t PageStore::host_bytes() const { return HeldBytes(std::numeric_limits<long>::max()); }
int64_t PageStore::unshared_host_bytes() const { return HeldBytes(1); }

}  // namespace kvq
