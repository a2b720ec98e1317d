// Streaming-read bandwidth (see read_bandwidth.h): each thread sums its own contiguous slice, as
// attention threads read their own KV heads.
#include "measure/read_bandwidth.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "base/thread_pool.h"
#include "simd/dispatch.h"

namespace kvq {

double MeasureReadBandwidthGbps(int64_t bytes, int32_t threads, int32_t reps) {
  const int64_t n = bytes / 4;
  std::vector<float> buffer(n, 1.0f);  // written once, so every page is resident
  std::vector<double> gbps;
  volatile float sink = 0.0f;
  for (int32_t r = 0; r < reps + 1; ++r) {  // the first pass warms up and is dropped
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<float> partial(threads, 0.0f);
    ThreadPool::Shared(threads).Run(threads, [&](int64_t t, int32_t) {
      const int64_t begin = n * t / threads, end = n * (t + 1) / threads;
      partial[t] = simd::SumF32(buffer.data() + begin, static_cast<size_t>(end - begin));
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
