// `kvq bench matvec`: weight matvec GB/s per weight type over a working set larger than the caches,
// beside the read bandwidth measured in the same run (before and after the arms; the larger is
// the reference, so the fraction printed is the conservative one).
#include <fmt/core.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/json_output.h"
#include "cli/flags.h"
#include "kvq/units.h"
#include "measure/matvec_bench.h"
#include "measure/read_bandwidth.h"
#include "measure/roofline.h"
#include "weights/matvec.h"
#include "weights/weight_type.h"

namespace kvq::cli {
namespace {

struct BenchMatvecOptions {
  SharedOptions shared;  // -t, --json
  std::vector<std::string> types = {"q4_0", "q8_0", "f16", "f32"};
  int64_t rows = 2048;
  int64_t cols = 8192;
  int64_t reps = 9;
  int64_t tokens = 1;
  int64_t working_set = int64_t{1} << 30;
};

int RunBenchMatvec(const BenchMatvecOptions& o) {
  auto bad = [](const std::string& m) { return BadInput("bench matvec", m); };
  MatVecBenchConfig c;
  for (const std::string& name : o.types) {
    const Result<WeightType> type = ParseWeightTypeName(name);
    if (!type.ok()) return bad("--type: " + type.status().message());
    c.types.push_back(*type);
  }
  c.working_set_bytes = o.working_set;
  c.rows = o.rows;
  c.cols = o.cols;
  if (o.reps < 1 || o.reps > 10000) return bad(fmt::format("--reps must be in 1..10000 (got {})", o.reps));
  c.threads = o.shared.threads;
  c.reps = static_cast<int32_t>(o.reps);
  if (o.tokens < 1 || o.tokens > 4096) return bad(fmt::format("--tokens must be in 1..4096 (got {})", o.tokens));
  c.tokens = static_cast<int32_t>(o.tokens);
  if (Status s = CheckMatVecBenchConfig(c); !s.ok()) return bad(s.message());

  // The ceiling reads a buffer as large as one arm's working set (at least kMinReadBandwidthBytes), so both face
  // the caches alike.
  const int64_t bw_bytes = std::max(c.working_set_bytes, kMinReadBandwidthBytes);
  auto progress = [](const std::string& line) { fmt::print(stderr, "bench matvec: {}\n", line); };
  progress(fmt::format("measuring read bandwidth over {} on {} threads...", FormatBytesIec(bw_bytes),
                       c.threads));
  const double bw_before = MeasureReadBandwidthGbps(bw_bytes, c.threads, 5);
  const std::vector<MatVecBenchRow> rows = RunMatVecBench(c, progress);
  progress("measuring read bandwidth again...");
  const double bw_after = MeasureReadBandwidthGbps(bw_bytes, c.threads, 5);
  const double read_gbps = std::max(bw_before, bw_after);
  // The compute ceiling a prefill GEMM on these kernels faces: the best int8-dot rate of this run.
  const ComputeRoofline roofline = MeasureComputeRoofline(c.threads, 5);
  const double int8_peak = roofline.best_int8_gmacs;

  if (o.shared.json) {
    nlohmann::json out = {{"isa", MatVecTargetName()}, {"threads", c.threads}, {"rows", c.rows},
                          {"cols", c.cols}, {"shapes", "[rows][cols] and [cols][rows] alternately"},
                          {"working_set_bytes", c.working_set_bytes}, {"reps", c.reps}, {"tokens", c.tokens},
                          {"read_bandwidth_gbps", read_gbps}, {"read_bandwidth_before_gbps", bw_before},
                          {"read_bandwidth_after_gbps", bw_after}, {"int8_dot_peak_gmacs", int8_peak},
                          {"results", nlohmann::json::array()}};
    for (const MatVecBenchRow& r : rows) {
      out["results"].push_back({{"type", r.type}, {"matrices", r.matrices}, {"sweep_bytes", r.sweep_bytes},
                                {"gbps", r.gbps}, {"gbps_min", r.gbps_min}, {"gbps_max", r.gbps_max},
                                {"us_per_matvec", r.us_per_matvec}, {"gmacs", r.gmacs},
                                {"fraction_of_int8_dot_peak", r.gmacs / int8_peak},
                                {"fraction_of_read_bandwidth", r.gbps / read_gbps}});
    }
    PrintJson(out);
    return 0;
  }
  fmt::print("weight matvec: [{}][{}] and [{}][{}] alternately, {} threads, SIMD target {}\n", c.rows, c.cols,
             c.cols, c.rows, c.threads, MatVecTargetName());
  fmt::print("read bandwidth measured in this run: {:.1f} GB/s (before {:.1f}, after {:.1f}; {} buffer)\n",
             read_gbps, bw_before, bw_after, FormatBytesIec(bw_bytes));
  fmt::print("int8-dot peak measured in this run: {:.1f} GMAC/s on {} threads ({}, registers only; kvq bench "
             "roofline)\n\n", int8_peak, c.threads, roofline.best_int8_instruction);
  if (c.tokens > 1) fmt::print("MatMul over {} tokens per call (prefill); GMAC/s beside the int8-dot peak\n\n", c.tokens);
  fmt::print("{:<9} {:>9} {:>14} {:>12} {:>8} {:>15} {:>7} {:>8} {:>8}\n", "type", "matrices", "weights/sweep",
             c.tokens > 1 ? "us/matmul" : "us/matvec", "GB/s", "min-max GB/s", "of bw", "GMAC/s", "of peak");
  for (const MatVecBenchRow& r : rows) {
    fmt::print("{:<9} {:>9} {:>14} {:>12.1f} {:>8.2f} {:>15} {:>6.0f}% {:>8.1f} {:>7.0f}%\n", r.type, r.matrices,
               FormatBytesIec(r.sweep_bytes), r.us_per_matvec, r.gbps,
               fmt::format("{:.2f}-{:.2f}", r.gbps_min, r.gbps_max), 100.0 * r.gbps / read_gbps, r.gmacs,
               int8_peak > 0 ? 100.0 * r.gmacs / int8_peak : 0.0);
  }
  return 0;
}

}  // namespace

void AddBenchMatvecCommand(CLI::App& bench, int* exit_code) {
  auto o = std::make_shared<BenchMatvecOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "matvec", "Weight matvec GB/s per weight type over a working set larger than the caches, beside the "
                "read bandwidth");
  cmd->add_option("--type", o->types,
                  "Weight types (" + WeightTypeNameList() + "), comma-separated; run as interleaved arms")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--rows", o->rows, "Rows of the first matrix shape (the second is transposed)")
      ->capture_default_str();
  cmd->add_option("--cols", o->cols, "Columns of the first matrix shape")->capture_default_str();
  AddThreadsFlag(cmd, &o->shared);
  cmd->add_option("--reps", o->reps, "Timed sweeps per type (median reported)")->capture_default_str();
  cmd->add_option("--tokens", o->tokens, "Tokens per call: 1 = MatVec (decode), more = MatMul (prefill)")
      ->capture_default_str();
  AddByteSizeFlag(cmd, "--working-set", &o->working_set, "Weight bytes each type sweeps per repetition (e.g. 1GiB)")
      ->default_str("1GiB");
  AddJsonFlag(cmd, &o->shared);
  cmd->callback([o, exit_code] { *exit_code = RunBenchMatvec(*o); });
}

}  // namespace kvq::cli
