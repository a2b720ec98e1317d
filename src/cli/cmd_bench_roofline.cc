// `kvq bench roofline`: the compute ceilings of this machine (peak f32 FMA and int8 dot rates per
// vector width, measured on every thread at once) beside its read bandwidth — the numbers the
// other benchmarks' "of peak" columns divide by, printed on their own.
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/json_output.h"
#include "kvq/units.h"
#include "measure/read_bandwidth.h"
#include "measure/roofline.h"
#include "weights/matvec.h"

namespace kvq::cli {
namespace {

struct BenchRooflineOptions {
  SharedOptions shared;  // -t, --json
  int64_t reps = 5;
};

int RunBenchRoofline(const BenchRooflineOptions& o) {
  if (o.reps < 1 || o.reps > 1000) {
    return BadInput("bench roofline", fmt::format("--reps must be in 1..1000 (got {})", o.reps));
  }
  const int32_t threads = o.shared.threads;
  const int32_t reps = static_cast<int32_t>(o.reps);
  const ComputeRoofline peak = MeasureComputeRoofline(threads, reps);
  const int64_t bw_bytes = kMinReadBandwidthBytes;
  const double bw = MeasureReadBandwidthGbps(bw_bytes, threads, reps);
  if (o.shared.json) {
    nlohmann::json out = {{"threads", threads}, {"weights_isa", MatVecTargetName()},
                          {"read_bandwidth_gbps", bw}, {"best_f32_gmacs", peak.best_f32_gmacs},
                          {"best_f32_instruction", peak.best_f32_instruction},
                          {"best_int8_gmacs", peak.best_int8_gmacs},
                          {"best_int8_instruction", peak.best_int8_instruction},
                          {"f32", nlohmann::json::array()}, {"int8", nlohmann::json::array()}};
    for (const PeakRate& p : peak.f32) {
      out["f32"].push_back({{"instruction", p.instruction}, {"vector_bits", p.vector_bits}, {"gmacs", p.gmacs}});
    }
    for (const PeakRate& p : peak.int8) {
      out["int8"].push_back({{"instruction", p.instruction}, {"vector_bits", p.vector_bits}, {"gmacs", p.gmacs}});
    }
    PrintJson(out);
    return 0;
  }
  fmt::print("compute and memory ceilings, {} threads (weight kernels dispatch to {})\n", threads,
             MatVecTargetName());
  fmt::print("{:<26} {:>5} {:>14}\n", "instruction", "bits", "G mul-add/s");
  for (const auto* group : {&peak.f32, &peak.int8}) {
    for (const PeakRate& p : *group) fmt::print("{:<26} {:>5} {:>14.1f}\n", p.instruction, p.vector_bits, p.gmacs);
  }
  fmt::print("read bandwidth: {:.1f} GB/s ({} buffer)\n", bw, FormatBytesIec(bw_bytes));
  return 0;
}

}  // namespace

void AddBenchRooflineCommand(CLI::App& bench, int* exit_code) {
  auto o = std::make_shared<BenchRooflineOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "roofline", "Peak f32 FMA and int8 dot rates per vector width and the read bandwidth of this machine");
  AddThreadsFlag(cmd, &o->shared);
  cmd->add_option("--reps", o->reps, "Timed repetitions per peak (median reported)")->capture_default_str();
  AddJsonFlag(cmd, &o->shared);
  cmd->callback([o, exit_code] { *exit_code = RunBenchRoofline(*o); });
}

}  // namespace kvq::cli
