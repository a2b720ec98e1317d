// `kvq bench decode`: whole-model decode speed vs context per KV format (docs/design.md §5, seed 002).
// The cache is filled directly with random rows encoded in each format (decode time does not
// depend on the values; a real 64K prefill would take hours on 2 cores), then real decode steps
// (every layer, the classifier) are timed with the formats as paired, interleaved arms, their
// order rotating each step, after every weight page has been read once (a MoE model's experts
// would otherwise fault in during the timed steps).
// Beside the times: the KV share of the bytes a step reads and the ceiling that share allows.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvq/format.h"
#include "kvq/kv_spec.h"
#include "kvq/status.h"
#include "model/decoder.h"

namespace kvq {

struct DecodeBenchConfig {
  std::vector<KvSpec> formats;  ///< arms (K and V in the same spec), run A B C A B C ...
  std::vector<int64_t> contexts;           ///< positions in the cache before the timed steps (0 allowed)
  int32_t reps = 5;                        ///< timed steps per arm and context, after one warm-up step
  uint64_t seed = 1;                       ///< of the random fill
};

struct DecodeBenchRow {
  std::string format;
  int64_t context = 0;
  double ms_median = 0, ms_min = 0, ms_max = 0;  ///< one decode step
  double tokens_per_second = 0;                   ///< 1000 / ms_median
  int64_t kv_bytes = 0;       ///< K + V bytes a step reads at this context, every attention layer
  int64_t weight_bytes = 0;   ///< weight bytes a step reads: WeightBytesPerStep + expert_bytes
  int64_t expert_bytes = 0;   ///< of those, routed experts' (MoE), measured: mean over the timed steps
  int64_t state_bytes = 0;    ///< a hybrid's recurrent state, read (and written) once per step
  double kv_share = 0;        ///< the reference arm's KV bytes / (its KV + weight + state bytes)
  double ceiling = 1;         ///< 1 / (1 − kv_share · (1 − kv_bytes / reference kv_bytes))
  double speedup = 1;         ///< measured: reference median / this median
};

/// Weight bytes one decode step reads apart from a MoE model's routed experts (which depend on the
/// token and are measured per step): every layer's matrices, norms and biases — attention's or the
/// recurrent mixer's, the dense FFN or the shared expert and the router — the classifier, and one
/// embedding row.
int64_t WeightBytesPerStep(const DecoderWeights& weights);

/// The arm the ceiling and speedup are relative to: f16 when it is an arm, else the first.
const KvSpec* DecodeBenchReference(const DecodeBenchConfig& config);

/// KV bytes a step reads at `context` for `format` (every attention layer — a hybrid's recurrent
/// layers hold none — K and V; 0 at context 0).
Result<int64_t> DecodeKvBytes(const DecoderConfig& model, const KvSpec& format, int64_t context);

/// Runs the benchmark on `model` (its thread count is the model's). Errors: a context past the
/// model's limit, a cache that cannot be created. `progress` (may be empty) gets a line per stage.
Result<std::vector<DecodeBenchRow>> RunDecodeBench(DecoderModel& model, const DecodeBenchConfig& config,
                                                   const std::function<void(const std::string&)>& progress);

}  // namespace kvq
