// `kvq bench context`: a whole-model decode step at a very long context (1M, 4M positions) per KV
// format and cache tier (host, streamed, disk), with the bytes per tier, the time per step, the
// bounds measured in the same run and the limiter they name, and whether the tiers' logits are
// bit-identical.
#include <fmt/core.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/json_output.h"
#include "kvq/kv_memory.h"
#include "kvq/units.h"
#include "measure/context_bench.h"
#include "model/cache_config.h"
#include "model/load_model.h"
#include "weights/matvec.h"

namespace kvq::cli {
namespace {

struct BenchContextOptions {
  // -m, --format, --context, --kv-device-budget, --kv-host-budget, --kv-disk, -t, --seed, --json
  SharedOptions shared{.formats = {"int4"}, .contexts = {1048576}};
  std::vector<std::string> tiers{"host"};
  int32_t reps = 3;
  bool past_model_context = false;
  bool warm_disk = false;
};

int64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? int64_t{pages} * page : int64_t{8} << 30;
}

int RunBenchContext(const BenchContextOptions& o) {
  auto bad = [](const std::string& m) { return BadInput("bench context", m); };
  if (o.reps <= 0 || o.reps > 100)
    return bad(fmt::format("--reps must be in 1..100 (got {})", o.reps));
  ContextBenchConfig config{.reps = o.reps,
                            .seed = o.shared.seed,
                            .disk_dir = o.shared.budgets.disk_dir,
                            .device_bytes = o.shared.budgets.device_bytes,
                            .host_bytes = o.shared.budgets.host_bytes,
                            .past_model_context = o.past_model_context,
                            .cold_disk = !o.warm_disk};
  const Result<std::vector<const FormatDesc*>> formats = o.shared.PlainFormatList();
  if (!formats.ok()) return bad(formats.status().message());
  config.formats = *formats;
  bool disk = false;
  for (const std::string& name : o.tiers) {
    const Result<CacheTier> tier = ParseCacheTier(name);
    if (!tier.ok()) return bad("--tier: " + tier.status().message());
    config.tiers.push_back(*tier);
    disk = disk || *tier == CacheTier::kDisk;
  }
  if (config.formats.empty() || config.tiers.empty())
    return bad("give at least one --format and one --tier");
  if (disk && config.disk_dir.empty())
    return bad("--tier disk needs --kv-disk DIR (the folder of the cache file)");
  if (!disk && !config.disk_dir.empty()) return bad("--kv-disk is only used by --tier disk");
  config.contexts = o.shared.contexts;

  const std::string model_path = o.shared.ModelPath();
  Result<LoadedModel> loaded = LoadModel(model_path, o.shared.TokenizerPath(), 0, o.shared.LoaderRepack());
  if (!loaded.ok()) return bad(loaded.status().message());
  const DecoderConfig cfg = loaded->weights.config;
  std::vector<std::string> notes;
  for (int64_t n : config.contexts) {
    if (n + 1 + o.reps <= cfg.seq_len) continue;
    if (!o.past_model_context) {
      return bad(fmt::format(
          "--context {}: the model's context_length is {} positions, so at most {} can be "
          "filled before {} decode steps; --past-model-context runs past it",
          n, cfg.seq_len, std::max<int64_t>(cfg.seq_len - 1 - o.reps, 0), 1 + o.reps));
    }
    notes.push_back(fmt::format(
        "context {} is past the model's context_length of {} (--past-model-context): RoPE "
        "is computed at those positions like any other; the step's work does not depend on it",
        n, cfg.seq_len));
  }
  // The arms of a context are alive at once: their host bytes must fit in 80% of RAM.
  for (int64_t n : config.contexts) {
    int64_t host = 0;
    for (const FormatDesc* f : config.formats) {
      if (Status s = CheckShape(*f, {.n_kv_heads = cfg.n_kv_heads, .head_dim = cfg.head_dim()});
          !s.ok()) {
        return bad("--format: " + s.message());
      }
      for (CacheTier t : config.tiers) {
        if (t == CacheTier::kDisk) continue;
        const Result<int64_t> b = KvBytesForContext(
            *f,
            ModelKvShape(cfg),
            n + 1 + o.reps);
        if (!b.ok()) return bad("--context: " + b.status().message());
        host += *b;
      }
    }
    if (host > PhysicalMemoryBytes() / 10 * 8) {
      return bad(fmt::format(
          "--context {}: the host and streamed arms would hold {} of KV in RAM at once, over 80% "
          "of this machine's {}: fewer formats or tiers, or --tier disk",
          n, FormatBytesIec(host), FormatBytesIec(PhysicalMemoryBytes())));
    }
  }

  DecoderModel model(std::move(loaded->weights), o.shared.threads);
  auto progress = [](const std::string& line) { fmt::print(stderr, "bench context: {}\n", line); };
  const Result<ContextBenchReport> report = RunContextBench(model, config, progress);
  if (!report.ok()) return bad(report.status().message());
  const ContextBenchReport& r = *report;
  if (o.shared.json) {
    nlohmann::json out = {{"model", model_path},
                          {"threads", o.shared.threads},
                          {"model_context", cfg.seq_len},
                          {"read_gbps", r.read_gbps},
                          {"disk_read_gbps", r.disk_read_gbps},
                          {"disk_read_bytes", r.disk_read_bytes},
                          {"cold_disk", config.cold_disk},
                          {"context0_step_ms", r.weights_ms},
                          {"notes", notes},
                          {"results", nlohmann::json::array()}};
    for (const ContextBenchRow& x : r.rows) {
      out["results"].push_back({{"format", x.format},
                                {"tier", CacheTierName(x.tier)},
                                {"context", x.context},
                                {"ms_median", x.ms_median},
                                {"ms_min", x.ms_min},
                                {"ms_max", x.ms_max},
                                {"fill_seconds", x.fill_seconds},
                                {"host_bytes", x.plan.host_bytes},
                                {"disk_bytes", x.plan.disk_bytes},
                                {"device_bytes", x.plan.device_bytes},
                                {"device_peak_bytes", x.device_peak_bytes},
                                {"kv_bytes", x.kv_bytes},
                                {"attention_macs", x.attention_macs},
                                {"compute_gmacs", x.compute_gmacs},
                                {"memory_ms", x.memory_ms},
                                {"disk_ms", x.disk_ms},
                                {"compute_ms", x.compute_ms},
                                {"wait_ms", x.wait_ms},
                                {"copy_ms", x.copy_ms},
                                {"limiter", x.limiter},
                                {"logits_identical", x.logits_identical},
                                {"compared_with", x.compared_with}});
    }
    PrintJson(out);
    return 0;
  }
  fmt::print(
      "context: {} ({} layers, {} query heads, {} KV heads x {}, model context_length {}), {} "
      "threads, "
      "matvec SIMD {}\n",
      model_path, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim(), cfg.seq_len,
      o.shared.threads, MatVecTargetName());
  for (const std::string& note : notes) fmt::print("note: {}\n", note);
  fmt::print(
      "cache fill: random rows, a pool of 4 pages encoded per layer, then page copies (not a "
      "prefill)\n");
  fmt::print("measured in this run: read bandwidth {:.1f} GB/s; ", r.read_gbps);
  if (r.disk_read_gbps > 0) {
    fmt::print("disk read {:.2f} GB/s ({} of the cache file, cold); ", r.disk_read_gbps,
               FormatBytesIec(r.disk_read_bytes));
  }
  fmt::print("decode step at context 0 {:.1f} ms\n", r.weights_ms);
  if (disk) {
    fmt::print("disk tier: {}\n",
               config.cold_disk ? "the file is dropped from the OS page cache before each step"
                                : "the OS page cache is left warm (--warm-disk)");
  }
  fmt::print(
      "bounds on a step's attention: KV bytes / read bandwidth (memory), / disk read (disk), "
      "multiply-adds / "
      "the kernel's rate with its window in cache (compute); measured per step: waited = attention "
      "waiting "
      "for the next page (one thread acquires at a time), copy = the copy thread reading pages; "
      "limiter: the "
      "largest of memory, compute and (streamed tiers) copy; {} timed steps after one untimed "
      "(medians)\n\n",
      o.reps);
  fmt::print(
      "{:<6} {:<9} {:>9} {:>10} {:>10} {:>11} {:>9} {:>17} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} "
      "{:>8}  {}\n",
      "format", "tier", "context", "host", "disk", "work set", "ms/step", "min-max ms", "fill s",
      "memory", "disk", "compute", "waited", "copy", "limiter", "logits");
  for (const ContextBenchRow& x : r.rows) {
    const std::string logits =
        x.compared_with == CacheTierName(x.tier)
            ? "reference"
            : fmt::format("{} vs {}", x.logits_identical ? "identical" : "DIFFER", x.compared_with);
    fmt::print(
        "{:<6} {:<9} {:>9} {:>10} {:>10} {:>11} {:>9.0f} {:>17} {:>8.1f} {:>7.0f}ms {:>7.0f}ms "
        "{:>7.0f}ms "
        "{:>7.0f}ms {:>7.0f}ms {:>8}  {}\n",
        x.format, CacheTierName(x.tier), x.context, FormatBytesIec(x.plan.host_bytes),
        FormatBytesIec(x.plan.disk_bytes), FormatBytesIec(x.plan.device_bytes), x.ms_median,
        fmt::format("{:.0f}-{:.0f}", x.ms_min, x.ms_max), x.fill_seconds, x.memory_ms, x.disk_ms,
        x.compute_ms, x.wait_ms, x.copy_ms, x.limiter, logits);
  }
  fmt::print("\nper step (every tier of a format alike):\n");
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const ContextBenchRow& x = r.rows[i];
    if (i > 0 && x.format == r.rows[i - 1].format && x.context == r.rows[i - 1].context) continue;
    fmt::print(
        "  {} at {}: KV read {} ({} bytes), attention {:.1f} G multiply-adds at {:.2f} GMAC/s (the "
        "kernel, "
        "window in cache)\n",
        x.format, x.context, FormatBytesIec(x.kv_bytes), x.kv_bytes, x.attention_macs / 1e9,
        x.compute_gmacs);
  }
  for (const ContextBenchRow& x : r.rows) {
    if (x.copy_ms <= 0) continue;
    fmt::print(
        "  {}/{} at {}: the copy thread read the cache at {:.2f} GB/s during the steps (KV bytes / "
        "copy time)\n",
        x.format, CacheTierName(x.tier), x.context, x.kv_bytes / (x.copy_ms * 1e6));
  }
  bool all_identical = true;
  for (const ContextBenchRow& x : r.rows) all_identical = all_identical && x.logits_identical;
  return all_identical ? 0 : 1;
}

}  // namespace

void AddBenchContextCommand(CLI::App& bench, int* exit_code) {
  auto o = std::make_shared<BenchContextOptions>();
  CLI::App* cmd =
      bench.add_subcommand("context",
                           "One decode step at a very long context per KV format and cache tier: "
                           "bytes per tier, time per "
                           "step, its limiter, and whether the tiers' logits are bit-identical");
  AddModelFlag(cmd, &o->shared);
  AddRepackFlags(cmd, &o->shared);
  AddFormatListFlag(cmd, &o->shared, "--format,--formats", "KV formats, comma-separated");
  AddContextListFlag(cmd, &o->shared, "--context,--contexts",
                     "Positions in the cache before the steps, comma-separated", 0,
                     int64_t{1} << 30);
  cmd->add_option("--tier,--tiers", o->tiers,
                  "Cache tiers, comma-separated: host (master in RAM, read in place), streamed "
                  "(host master through "
                  "the working set), disk (master in a file in --kv-disk DIR, streamed)")
      ->delimiter(',')
      ->capture_default_str();
  AddBudgetFlags(cmd, &o->shared);
  cmd->add_flag("--past-model-context", o->past_model_context,
                "Allow contexts past the model file's context_length (printed with the results)");
  cmd->add_flag("--warm-disk", o->warm_disk,
                "Leave the disk tier's file in the OS page cache between steps");
  AddThreadsFlag(cmd, &o->shared);
  cmd->add_option("--reps", o->reps, "Timed decode steps per arm (median reported)")
      ->capture_default_str();
  AddSeedFlag(cmd, &o->shared, "Seed of the random cache fill")->capture_default_str();
  AddJsonFlag(cmd, &o->shared);
  cmd->callback([o, exit_code] { *exit_code = RunBenchContext(*o); });
}

}  // namespace kvq::cli
