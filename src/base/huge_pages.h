// Large read-mostly buffers (weights repacked at load, the matvec benchmark's working sets, the
// read-bandwidth probe) on transparent huge pages where the kernel offers them: a 2 MiB page is
// one TLB entry and one fault where 4 KiB pages are 512, and a streaming read of gigabytes crosses
// a page every 4 KiB otherwise. One allocator, so the benchmark's arms sit on the pages the model
// reads.
#pragma once

#include <cstdint>
#include <memory>

namespace kvq {

inline constexpr int64_t kHugePageBytes = int64_t{2} << 20;

enum class PageSize {
  kHuge,      // advised MADV_HUGEPAGE: what the model's repacked copy is on
  kOrdinary,  // advised MADV_NOHUGEPAGE: what a file's mapping is on, even where THP is "always"
};

struct PageBufferFree {
  void operator()(uint8_t* p) const;
};
using PageBuffer = std::unique_ptr<uint8_t[], PageBufferFree>;

// `bytes` (at least 1) rounded up to whole 2 MiB pages and 2 MiB-aligned when it is at least one
// such page (else to a 64-byte line), advised before anything touches it; uninitialised. The
// advice is a hint: where the kernel refuses it the contents are the same. Throws std::bad_alloc
// when the memory is not there. (WebAssembly's linear memory has no pages to advise: there every
// buffer is 64-byte lines.)
PageBuffer AllocatePageBuffer(int64_t bytes, PageSize pages);

}  // namespace kvq
