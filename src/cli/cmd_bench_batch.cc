// `kvq bench batch`: total decode tok/s of N sessions stepping together through Session::RunBatch
// (or, with --concurrent, each on its own OS thread and pool), per session count, as interleaved arms (api_bench/batch_bench.h), with each count's speed over the
// first count's and the bit-identity check beside it.
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/json_output.h"
#include "kvq/kv_spec.h"
#include "kvq/model.h"
#include "api_bench/batch_bench.h"

namespace kvq::cli {
namespace {

struct BenchBatchOptions {
  // -m, --tokenizer, --kv/--kv-k/--kv-v, --context (a list), -t, --json
  SharedOptions shared{.contexts = {256}};
  std::vector<int64_t> sessions = {1, 2, 4, 8};
  int32_t steps = 16;
  int32_t rounds = 5;
  bool concurrent = false;
  int32_t session_threads = 1;
};

int RunBenchBatch(const BenchBatchOptions& o) {
  auto bad = [](const std::string& m) { return BadInput("bench batch", m); };
  BatchBenchConfig config;
  config.sessions.clear();
  for (int64_t n : o.sessions) config.sessions.push_back(static_cast<int32_t>(n));
  config.contexts = o.shared.contexts;
  config.steps = o.steps;
  config.rounds = o.rounds;
  config.concurrent = o.concurrent;
  config.session_threads = o.session_threads;
  const Result<LayerFormats> layer = o.shared.KvLayer();  // prerope given by --kv goes to K alone
  if (!layer.ok()) return bad(layer.status().message());
  config.kv.key_format = KvSpecName(layer->Key());
  config.kv.value_format = KvSpecName(layer->Value());
  const std::string model_path = o.shared.ModelPath();
  ModelOptions load = o.shared.LoadOptions();
  load.kv = config.kv;
  Result<std::unique_ptr<Model>> model = Model::Load(model_path, load);
  if (!model.ok()) return bad(model.status().message());
  const ModelInfo& info = (*model)->info();
  for (int64_t n : config.contexts) {
    if (BatchBenchPositions(config, n) > info.context) {
      return bad(fmt::format(
          "--context {}: the model's context is {} positions, so at most {} can be filled before "
          "{} decode steps (1 + --rounds x --steps)",
          n, info.context,
          std::max<int64_t>(info.context - (BatchBenchPositions(config, n) - n), 0),
          BatchBenchPositions(config, n) - n));
    }
  }
  auto progress = [json = o.shared.json](const std::string& line) {
    if (!json) fmt::print(stderr, "bench batch: {}\n", line);
  };
  const Result<std::vector<BatchBenchRow>> rows = RunBatchBench(**model, config, progress);
  if (!rows.ok()) return bad(rows.status().message());
  const std::string kv = LayerFormatsName(*layer);
  const std::string step =
      o.concurrent
          ? fmt::format("one decode token per session, every session on its own OS thread at once "
                        "with {} thread{} of its own (no batching: the weights read once per session)",
                        o.session_threads, o.session_threads == 1 ? "" : "s")
          : "Session::RunBatch of one decode token per session (each weight matrix read once per step)";
  const int32_t threads = o.concurrent ? o.session_threads : info.threads;
  if (o.shared.json) {
    nlohmann::json out = {{"model", model_path},
                          {"architecture", info.architecture},
                          {"n_layers", info.n_layers},
                          {"dim", info.dim},
                          {"threads", threads},
                          {"concurrent", o.concurrent},
                          {"matvec_isa", info.simd_target},
                          {"kv", kv},
                          {"steps", config.steps},
                          {"rounds", config.rounds},
                          {"step", step},
                          {"results", nlohmann::json::array()}};
    for (const BatchBenchRow& r : *rows) {
      out["results"].push_back({{"context", r.context},
                                {"sessions", r.sessions},
                                {"tokens_per_second", r.tokens_per_second},
                                {"tps_min", r.tps_min},
                                {"tps_max", r.tps_max},
                                {"ms_per_step", r.ms_per_step},
                                {"per_session_tps", r.per_session_tps},
                                {"vs_first", r.vs_first},
                                {"bit_identical", r.bit_identical}});
    }
    PrintJson(out);
  } else {
    fmt::print("{} decode: {} ({}, {} layers, dim {}), KV {}, {} thread{}{}, matvec SIMD {}\n",
               o.concurrent ? "concurrent" : "batched", model_path, info.architecture, info.n_layers,
               info.dim, kv, threads, threads == 1 ? "" : "s", o.concurrent ? " per session" : "",
               info.simd_target);
    fmt::print(
        "a step = {}; arms interleaved over {} rounds of {} timed steps (order rotated each "
        "round); tok/s = "
        "median over rounds, min-max = slowest and fastest round; vs = over the first arm ({} "
        "session{})\n",
        step, config.rounds, config.steps, config.sessions[0], config.sessions[0] == 1 ? "" : "s");
    fmt::print(
        "bits = every session's logits after the run equal the first arm's first session's (all "
        "ran the "
        "same tokens)\n\n");
    fmt::print("{:>8} {:>8} {:>10} {:>19} {:>10} {:>12} {:>8} {:>5}\n", "context", "sessions",
               "tok/s", "min-max tok/s", "ms/step", "tok/s/sess", "vs", "bits");
    for (const BatchBenchRow& r : *rows) {
      fmt::print("{:>8} {:>8} {:>10.1f} {:>19} {:>10.2f} {:>12.1f} {:>7.2f}x {:>5}\n", r.context,
                 r.sessions, r.tokens_per_second,
                 fmt::format("{:.1f}-{:.1f}", r.tps_min, r.tps_max), r.ms_per_step,
                 r.per_session_tps, r.vs_first, r.bit_identical ? "same" : "DIFF");
    }
  }
  for (const BatchBenchRow& r : *rows) {
    if (!r.bit_identical) {
      fmt::print(stderr,
                 "kvq bench batch: error: {} sessions at context {}: logits differ from a session "
                 "run alone\n",
                 r.sessions, r.context);
      return 1;
    }
  }
  return 0;
}

}  // namespace

void AddBenchBatchCommand(CLI::App& bench, int* exit_code) {
  auto o = std::make_shared<BenchBatchOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "batch",
      "Total decode tok/s of N sessions stepping together (Session::RunBatch) per session count");
  AddModelFlag(cmd, &o->shared);
  AddRepackFlags(cmd, &o->shared);
  AddTokenizerFlag(cmd, &o->shared);
  AddKvFormatFlags(cmd, &o->shared);
  cmd->add_option("--sessions", o->sessions,
                  "Session counts, comma-separated: each an arm whose sessions decode together")
      ->delimiter(',')
      ->check(IntInRange(1, 256))
      ->capture_default_str();
  AddContextListFlag(cmd, &o->shared, "--context,--contexts",
                     "Positions each session holds before the timed steps, comma-separated", 0,
                     INT64_MAX);
  cmd->add_option("--steps", o->steps, "Timed decode steps per arm and round")
      ->check(IntInRange(1, 100000))
      ->capture_default_str();
  cmd->add_option("--rounds", o->rounds, "Rounds: each runs every arm once (medians over rounds)")
      ->check(IntInRange(1, 1000))
      ->capture_default_str();
  cmd->add_flag("--concurrent", o->concurrent,
                "Each session decodes on its own OS thread at once, with --session-threads threads of "
                "its own, instead of the sessions stepping together through one batched pass (tok/s "
                "is then the sessions' aggregate; the 1-session arm is one session alone)");
  cmd->add_option("--session-threads", o->session_threads, "With --concurrent: each session's threads")
      ->check(IntInRange(1, 1024))
      ->capture_default_str();
  AddThreadsFlag(cmd, &o->shared);
  AddJsonFlag(cmd, &o->shared);
  cmd->callback([o, exit_code] { *exit_code = RunBenchBatch(*o); });
}

}  // namespace kvq::cli
