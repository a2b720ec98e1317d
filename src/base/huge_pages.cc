// Page-advised buffers (see huge_pages.h).
#include "base/huge_pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <new>

namespace kvq {

void PageBufferFree::operator()(uint8_t* p) const { std::free(p); }

PageBuffer AllocatePageBuffer(int64_t bytes, PageSize pages) {
#if defined(__EMSCRIPTEN__)
  constexpr int64_t kAlign = 64;
#else
  constexpr int64_t kAlign = kHugePageBytes;
#endif
  const int64_t size = (std::max<int64_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  PageBuffer buffer(static_cast<uint8_t*>(std::aligned_alloc(kAlign, static_cast<size_t>(size))));
  if (buffer == nullptr) throw std::bad_alloc();
#if !defined(__EMSCRIPTEN__)
  madvise(buffer.get(), static_cast<size_t>(size), pages == PageSize::kHuge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
#else
  (void)pages;
#endif
  return buffer;
}

}  // namespace kvq
