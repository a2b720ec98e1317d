// The memory-read ceiling of this machine, measured in the same run as a benchmark so every
// GB/s figure kvq prints has its ceiling beside it.
#pragma once

#include <cstdint>

namespace kvq {

/// The buffer the benches stream at least: 4× the largest L3 seen on kvq's hosts (260 MiB), so
/// the caches hold a negligible part of it. (Tests pass smaller buffers to stay fast.)
inline constexpr int64_t kMinReadBandwidthBytes = int64_t{1} << 30;

/// What the cores can stream from memory: a buffer of `bytes` (rounded up to 2 MiB),
/// each of `threads` threads summing its own contiguous part with the widest vectors the
/// dispatched target has, `reps` times after one warm-up pass; returns the best GB/s (10^9 bytes
/// per second), the figure least disturbed by other work on the machine.
double MeasureReadBandwidthGbps(int64_t bytes, int32_t threads, int32_t reps);

}  // namespace kvq
