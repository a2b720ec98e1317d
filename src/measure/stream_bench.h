// `kvq bench stream`: decode attention over a cache streamed through a bounded device working set
// against the same cache resident, and the copy time alone, so the overlap of prefetch with
// compute is visible.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvq/attention.h"
#include "kvq/format.h"

namespace kvq {

struct StreamBenchConfig {
  std::vector<const FormatDesc*> formats;
  std::vector<int64_t> contexts;
  AttentionShape shape;
  int32_t threads = 1;
  int32_t page_positions = 256;
  int64_t device_bytes = 0;  ///< working-set budget for the streamed arm
  int32_t reps = 7;
};

struct StreamBenchRow {
  std::string format;
  int64_t context = 0;
  int64_t kv_bytes = 0;
  int32_t device_slots = 0;
  int64_t device_peak_bytes = 0;
  double resident_ns = 0;  ///< medians per decode step
  double streamed_ns = 0;
  double copy_ns = 0;      ///< copying the same pages into the working set, no attention
};

Result<std::vector<StreamBenchRow>> RunStreamBench(const StreamBenchConfig& config,
                                                   const std::function<void(const std::string&)>& progress);

}  // namespace kvq
