// `kvq bench attention`: attention time per step for KV specs (a format and its transforms) at
// given contexts — decode (one query token) or a prefill block of query tokens at the end of the
// context — through kvq's own KvCache, with the KV bytes and multiply-adds each step needs, for a
// roofline against ceilings measured in the same run.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvq/attention.h"
#include "kvq/format.h"
#include "kvq/kv_spec.h"

namespace kvq {

struct AttentionBenchConfig {
  std::vector<KvSpec> specs;  ///< arms, each for K and V, run interleaved (A B C A B C ...)
  std::vector<int64_t> contexts;
  AttentionShape shape;
  int32_t threads = 1;
  int32_t reps = 9;  ///< timed steps per arm and context (after one warm-up step)
  int32_t queries = 1;  ///< query tokens per step, at the last positions of the context, causal
  /// AttentionOptions::query_block values, each its own arm (1: the per-token path).
  std::vector<int32_t> query_blocks = {0};
};

struct AttentionBenchRow {
  std::string format;  ///< KvSpecName of the arm's spec
  KvSpec spec;
  int64_t context = 0;
  int32_t queries = 1;
  int32_t query_block = 0;  ///< as given (0: kDefaultQueryBlock)
  double ns_per_step = 0;  ///< median of KvCache::Attend + KvCache::FinishAttention
  double ns_min = 0, ns_max = 0;
  /// K + V bytes of one layer's cache at this context (SpecBytesForRows: encoded blocks plus the
  /// f32 sink and residual rows) — what one step reads.
  int64_t kv_bytes = 0;
  double gbps = 0;         ///< kv_bytes / median time
  /// Multiply-adds of one step: q·k and the acc update, head_dim each per (query head, position
  /// it sees); the softmax's exps and rescales, and a rotation's butterflies, are not counted.
  int64_t score_macs = 0, value_macs = 0;
  bool int8_scores = false;  ///< the key codec's score runs on int8 dot products
};

/// Runs the benchmark; `progress` (may be empty) receives one line per finished context. Errors
/// when a spec does not fit the shape or a cache cannot be made.
Result<std::vector<AttentionBenchRow>> RunAttentionBench(const AttentionBenchConfig& config,
                                                         const std::function<void(const std::string&)>& progress);

}  // namespace kvq
