// `kvq bench attention`: decode-attention time per step for KV formats at given contexts, with the
// KV bytes each step reads and the read bandwidth measured in the same run.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvq/attention.h"
#include "kvq/format.h"

namespace kvq {

struct AttentionBenchConfig {
  std::vector<const FormatDesc*> formats;  ///< arms, run interleaved (A B C A B C ...)
  std::vector<int64_t> contexts;
  AttentionShape shape;
  int32_t threads = 1;
  int32_t reps = 9;  ///< timed decode steps per arm and context (after one warm-up step)
};

struct AttentionBenchRow {
  std::string format;
  int64_t context = 0;
  double ns_per_step = 0;  ///< median
  double ns_min = 0, ns_max = 0;
  int64_t kv_bytes = 0;    ///< K + V bytes one step reads (one layer)
  double gbps = 0;         ///< kv_bytes / median time
};

/// Runs the benchmark; `progress` (may be empty) receives one line per finished context.
std::vector<AttentionBenchRow> RunAttentionBench(const AttentionBenchConfig& config,
                                                 const std::function<void(const std::string&)>& progress);

}  // namespace kvq
