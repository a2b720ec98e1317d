// Streaming-read bandwidth (see read_bandwidth.h): threads take 1 MiB chunks from a shared counter
// (so a thread the OS descheduled on a busy machine does not leave the others idle, as the weight
// matvec hands out its rows) and sum them with a software prefetch 16 KiB ahead — the best
// streaming read kvq's kernels use, so the figure is a ceiling for them, not a plain loop's speed.
#include "measure/read_bandwidth.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <vector>

#include "base/thread_pool.h"
#include "simd/dispatch.h"

namespace kvq {
namespace {

float SumWithPrefetch(const float* a, int64_t n) {
  constexpr int64_t kBlock = 1024, kAhead = 4 * kBlock;  // 4 KiB blocks, prefetched 16 KiB ahead
  float total = 0.0f;
  for (int64_t i = 0; i < n; i += kBlock) {
    for (int64_t line = i + kAhead; line < std::min(n, i + kAhead + kBlock); line += 16) {
      __builtin_prefetch(a + line, 0, 3);
    }
    total += simd::SumF32(a + i, static_cast<size_t>(std::min(kBlock, n - i)));
  }
  return total;
}

}  // namespace

double MeasureReadBandwidthGbps(int64_t bytes, int32_t threads, int32_t reps) {
  const int64_t n = bytes / 4;
  std::vector<float> buffer(n, 1.0f);  // written once, so every page is resident
  std::vector<double> gbps;
  volatile float sink = 0.0f;
  for (int32_t r = 0; r < reps + 1; ++r) {  // the first pass warms up and is dropped
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<float> partial(threads, 0.0f);
    std::atomic<int64_t> next{0};
    constexpr int64_t kChunk = (1 << 20) / 4;
    ThreadPool::Shared(threads).Run(threads, [&](int64_t t, int32_t) {
      for (int64_t begin = next.fetch_add(kChunk); begin < n; begin = next.fetch_add(kChunk)) {
        partial[t] += SumWithPrefetch(buffer.data() + begin, std::min(kChunk, n - begin));
      }
    });
    float total = 0.0f;
    for (float p : partial) total += p;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sink = sink + total;
    if (r > 0) gbps.push_back(static_cast<double>(n) * 4.0 / seconds / 1e9);
  }
  std::nth_element(gbps.begin(), gbps.begin() + gbps.size() / 2, gbps.end());
  return gbps[gbps.size() / 2];
}

}  // namespace kvq
