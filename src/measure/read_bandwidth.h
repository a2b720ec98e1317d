// The memory-read ceiling of this machine, measured in the same run as a benchmark so every
// GB/s figure kvq prints has its ceiling beside it.
#pragma once

#include <cstdint>

namespace kvq {

/// Streams a `bytes`-sized buffer (made larger than the caches) through a vector sum on `threads`
/// threads, `reps` times; returns the median GB/s (10^9 bytes per second).
double MeasureReadBandwidthGbps(int64_t bytes, int32_t threads, int32_t reps);

}  // namespace kvq
