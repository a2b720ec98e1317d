// Page-advised buffers (see huge_pages.h).
#include "base/huge_pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <new>

namespace kvq {

void PageBufferFree::operator()(uint8_t* p) const { std::free(p); }

PageBuffer AllocatePageBuffer(int64_t bytes, PageSize pages) {
  // Under one huge page there is none to be had: a cache line's alignment, and no rounding that
  // would make a small model's copy 2 MiB (allocations stay proportional to the input).
#if defined(__EMSCRIPTEN__)
  const bool whole_pages = false;
#else
  const bool whole_pages = bytes >= kHugePageBytes;
#endif
  const int64_t align = whole_pages ? kHugePageBytes : 64;
  const int64_t size = (std::max<int64_t>(bytes, 1) + align - 1) / align * align;
  PageBuffer buffer(static_cast<uint8_t*>(std::aligned_alloc(static_cast<size_t>(align), static_cast<size_t>(size))));
  if (buffer == nullptr) throw std::bad_alloc();
#if !defined(__EMSCRIPTEN__)
  if (whole_pages) madvise(buffer.get(), static_cast<size_t>(size), pages == PageSize::kHuge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
#endif
  (void)pages;
  return buffer;
}

}  // namespace kvq
