// `kvq bench matvec`: weight matvec throughput per weight type, in GB/s of weight bytes read,
// beside the read bandwidth measured in the same run. Each type sweeps a working set larger than
// the last-level cache (matrices [rows][cols] and [cols][rows] alternately, as a layer's FFN up
// and down projections), so the weights come from memory as in a decode step.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvq/status.h"
#include "model/decoder_weights.h"

namespace kvq {

struct MatVecBenchConfig {
  std::vector<WeightType> types;          ///< arms, run interleaved (A B C A B C ...)
  int64_t rows = 2048;                    ///< the first matrix shape is [rows][cols], the next [cols][rows]
  int64_t cols = 8192;
  int64_t working_set_bytes = int64_t{1} << 30;  ///< weight bytes swept per arm and repetition (at least)
  int32_t threads = 2;
  int32_t reps = 9;                       ///< timed sweeps per arm (after one warm-up sweep)
  int32_t tokens = 1;                     ///< 1: MatVec; more: MatMul over that many tokens (prefill)
};

struct MatVecBenchRow {
  std::string type;        ///< "Q4_0", ...
  int64_t matrices = 0;    ///< matrices in the arm's working set
  int64_t sweep_bytes = 0; ///< weight bytes of one sweep (all matrices once)
  double gbps = 0;         ///< sweep_bytes / median sweep time (10^9 bytes per second)
  double gbps_min = 0, gbps_max = 0;  ///< from the slowest and the fastest sweep
  double us_per_matvec = 0;           ///< median sweep time / matrices (per MatMul call with tokens > 1)
  double gmacs = 0;                   ///< rows·cols·tokens multiply-adds per second (10^9), median sweep
};

/// A registered weight type's name, any case ("q4_0", "Q8_0", ...) -> the type; the error lists
/// the names (weights/weight_type.h).
Result<WeightType> ParseWeightTypeName(const std::string& name);

/// Ok if the config can run: at least one registered type, shapes of whole blocks (rows and cols
/// multiples of each type's block_elems, since the second shape is transposed), positive counts. Messages name the
/// field as the CLI flag (--type, --rows, --cols, --threads, --reps, --working-set).
Status CheckMatVecBenchConfig(const MatVecBenchConfig& config);

/// Runs the benchmark (config must pass CheckMatVecBenchConfig); `progress` (may be empty)
/// receives a line per phase.
std::vector<MatVecBenchRow> RunMatVecBench(const MatVecBenchConfig& config,
                                           const std::function<void(const std::string&)>& progress);

}  // namespace kvq
