// `kvq bench context`: one whole-model decode step at a very long context (a million positions
// and more) per KV format and cache tier — the master in host RAM read in place, the host master
// streamed through a small working set, the master on disk streamed — with the bytes each tier
// holds, the time per step, whether the tiers' logits are bit-identical, and what bounds the step
// (KV bytes over the read bandwidth, disk bytes over the disk's read rate, attention operations
// over the kernel's rate with its window in cache), each measured in the same run.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "kvq/format.h"
#include "kvq/kv_cache.h"
#include "kvq/status.h"
#include "model/decoder.h"

namespace kvq {

enum class CacheTier { kHost, kStreamed, kDisk };
const char* CacheTierName(CacheTier tier);
/// "host", "streamed" or "disk"; the error lists them.
Result<CacheTier> ParseCacheTier(std::string_view name);

using ProgressFn = std::function<void(const std::string&)>;

/// Fills every layer of an empty `cache` with n positions of random rows, fast: a pool of a few
/// pages encoded once by Append, then byte copies of those pages (AppendPageCopies, cache/page_copies.h),
/// then the last partial page by Append. The step's cost and every tier's bits do not depend on
/// the values repeating. `progress` (may be empty) gets a line every few seconds with an ETA.
Status FillContext(KvCache& cache, int64_t n, uint64_t seed, const ProgressFn& progress,
                   const std::string& name);

struct ContextBenchConfig {
  std::vector<const FormatDesc*> formats;  ///< K and V in the same format
  std::vector<CacheTier> tiers;            ///< arms: formats x tiers, interleaved step by step
  std::vector<int64_t> contexts;           ///< positions in the cache before the steps
  int32_t reps = 3;                        ///< timed steps per arm, after one untimed step
  uint64_t seed = 1;
  std::string disk_dir;             ///< the disk tier's folder
  int64_t device_bytes = 0;         ///< working set of the streamed tiers; 0: 8 pages
  int64_t host_bytes = 0;           ///< host budget of each cache (0: none), checked by KvCache
  bool past_model_context = false;  ///< allow contexts past the model's context_length
  bool cold_disk = true;  ///< drop the disk file from the OS page cache before each disk step
  int64_t read_bandwidth_bytes = int64_t{1} << 30;  ///< buffer of the read-bandwidth measurement
};

struct ContextBenchRow {
  std::string format;
  CacheTier tier = CacheTier::kHost;
  int64_t context = 0;
  double ms_median = 0, ms_min = 0, ms_max = 0;  ///< one decode step
  double fill_seconds = 0;
  KvTierPlan plan;                ///< the cache's bytes per tier
  int64_t device_peak_bytes = 0;  ///< the working set's most bytes at once
  int64_t kv_bytes = 0;           ///< K + V bytes a step reads, every layer (the cache at context)
  double attention_macs = 0;      ///< multiply-adds of a step's attention: QK and PV, every layer
  double compute_gmacs = 0;       ///< the attention kernel's rate for this format, window in cache
  /// Bounds on the attention part of a step, ms: bytes / read bandwidth; disk bytes / disk read
  /// rate (disk tier only, else 0); operations / kernel rate.
  double memory_ms = 0, disk_ms = 0, compute_ms = 0;
  /// Measured, median per step (streamed tiers; 0 when resident): ms an attention thread waited
  /// for the next page (one acquires at a time), ms the copy thread spent reading pages.
  double wait_ms = 0, copy_ms = 0;
  /// The resource that needs the most time per step: "memory" or "compute" (their bounds), or
  /// "disk" / "stream" when a streamed tier's measured copy time is larger than both.
  std::string limiter;
  /// Every step's logits equal, bit for bit, those of this format's first tier (true for it).
  bool logits_identical = true;
  std::string compared_with;  ///< the first tier's name
};

struct ContextBenchReport {
  std::vector<ContextBenchRow> rows;
  double read_gbps = 0;       ///< streaming-read bandwidth, the model's threads
  double disk_read_gbps = 0;  ///< sequential read of a cold cache file (0: no disk tier)
  int64_t disk_read_bytes = 0;
  double weights_ms = 0;  ///< median decode step at context 0 (weights and the rest)
};

/// Runs the benchmark. Errors: a context past the model's (unless past_model_context), a cache
/// that cannot be created (budgets, disk space), I/O.
Result<ContextBenchReport> RunContextBench(DecoderModel& model, const ContextBenchConfig& config,
                                           const ProgressFn& progress);

}  // namespace kvq
