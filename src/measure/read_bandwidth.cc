// Streaming-read bandwidth (see read_bandwidth.h). Each thread reads its own contiguous part, as a
// weight matvec's rows are split, and the vector sum (simd::SumF32) keeps eight accumulators, so
// enough loads are in flight that the memory system, not the adds, sets the pace; the hardware
// prefetchers follow each thread's single stream. The buffer is 2 MiB-aligned and advised as huge
// pages where the kernel offers them (fewer TLB misses), and each thread first touches its own
// part. The best of the passes is the ceiling: other work on a shared machine only lowers a pass.
#include "measure/read_bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "base/huge_pages.h"
#include "base/thread_pool.h"
#include "simd/dispatch.h"

namespace kvq {

double MeasureReadBandwidthGbps(int64_t bytes, int32_t threads, int32_t reps) {
  const int64_t size = (std::max<int64_t>(bytes, 1) + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  const int64_t n = size / 4;
  const PageBuffer storage = AllocatePageBuffer(size, PageSize::kHuge);  // [size] bytes
  float* const buffer = reinterpret_cast<float*>(storage.get());  // [n]
  // Thread t's part: elements [t·n/threads, (t+1)·n/threads), written once by that thread so
  // every page is resident (and, on a machine with several memory nodes, local to it).
  auto part = [&](int64_t t) { return std::pair<int64_t, int64_t>{t * n / threads, (t + 1) * n / threads}; };
  ThreadPool& pool = ThreadPool::Shared(threads);
  pool.Run(threads, [&](int64_t t, int32_t) {
    const auto [begin, end] = part(t);
    std::fill(buffer + begin, buffer + end, 1.0f);
  });
  std::vector<float> partial(threads, 0.0f);  // [threads]
  double best = 0.0;
  volatile float sink = 0.0f;
  for (int32_t r = 0; r < reps + 1; ++r) {  // the first pass warms up and is dropped
    const auto t0 = std::chrono::steady_clock::now();
    pool.Run(threads, [&](int64_t t, int32_t) {
      const auto [begin, end] = part(t);
      partial[t] = simd::SumF32(buffer + begin, static_cast<size_t>(end - begin));
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (float p : partial) sink = sink + p;
    if (r > 0) best = std::max(best, static_cast<double>(size) / seconds / 1e9);
  }
  return best;
}

}  // namespace kvq
