// `kvq bench decode`: whole-model decode tok/s vs context per KV format, with the KV share of the
// bytes a step reads, the ceiling it allows and the measured speedup beside it, and a verdict on
// whether each smaller format is worth a kernel (its ceiling at 32K clears 10%).
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/json_output.h"
#include "cli/flags.h"
#include "kvq/kv_memory.h"
#include "kvq/units.h"
#include "measure/decode_bench.h"
#include "model/load_model.h"
#include "weights/matvec.h"

namespace kvq::cli {
namespace {

constexpr int64_t kVerdictContext = 32768;  // the ceiling at 32K decides
constexpr double kVerdictThreshold = 0.10;  // under a 10% ceiling: not worth a kernel

struct BenchDecodeOptions {
  // -m, --format, --context (empty: 4K, 16K, 32K, 64K bounded by the model and memory), -t,
  // --seed, --json
  SharedOptions shared{.formats = {"f16", "int8", "int4"}};
  int64_t kv_budget = 0;  // 0: 60% of RAM
  int32_t reps = 5;
};

int64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? int64_t{pages} * page : int64_t{8} << 30;
}

int RunBenchDecode(const BenchDecodeOptions& o) {
  auto bad = [](const std::string& m) { return BadInput("bench decode", m); };
  if (o.reps <= 0 || o.reps > 1000) return bad(fmt::format("--reps must be in 1..1000 (got {})", o.reps));
  DecodeBenchConfig config;
  config.reps = o.reps;
  config.seed = o.shared.seed;
  const Result<std::vector<KvSpec>> formats = o.shared.FormatList();
  if (!formats.ok()) return bad(formats.status().message());
  config.formats = *formats;
  if (config.formats.empty()) return bad("--format: give at least one format");
  const int64_t budget = o.kv_budget != 0 ? o.kv_budget : PhysicalMemoryBytes() / 10 * 6;
  const std::string model_path = o.shared.ModelPath();
  Result<LoadedModel> loaded = LoadModel(model_path, o.shared.TokenizerPath(), 0, o.shared.LoaderRepack());
  if (!loaded.ok()) return bad(loaded.status().message());
  const DecoderConfig cfg = loaded->weights.config;
  for (const KvSpec& f : config.formats) {
    if (Status s = CheckKvSpec(f, {.n_kv_heads = cfg.n_kv_heads, .head_dim = cfg.head_dim()}); !s.ok()) {
      return bad("--format: " + s.message());
    }
  }

  // Contexts: what was asked (each must fit), or the defaults that fit the model and the budget.
  auto arms_bytes = [&](int64_t n) -> int64_t {
    int64_t total = 0;
    for (const KvSpec& f : config.formats) {
      const Result<int64_t> b = DecodeKvBytes(cfg, f, n + 1 + o.reps);
      total += b.ok() ? *b : (int64_t{1} << 62);
    }
    return total;
  };
  const int64_t limit = int64_t{cfg.seq_len} - 1 - o.reps;
  const std::vector<int64_t>& contexts = o.shared.contexts;
  if (!contexts.empty()) {
    for (int64_t n : contexts) {
      if (n < 0 || n > limit) {
        return bad(fmt::format("--context {}: the model's context is {} positions, so at most {} can be filled "
                               "before {} decode steps", n, cfg.seq_len, std::max<int64_t>(limit, 0), 1 + o.reps));
      }
      if (arms_bytes(n) > budget) {
        return bad(fmt::format("--context {}: the {} arms would hold {} of KV at once, over the budget of {} "
                               "(--kv-budget, or fewer formats)", n, config.formats.size(),
                               FormatBytesIec(arms_bytes(n)), FormatBytesIec(budget)));
      }
    }
    config.contexts = contexts;
  } else {
    for (int64_t n : {4096, 16384, 32768, 65536}) {
      if (n > limit) {
        fmt::print(stderr, "bench decode: skipping context {}: past the model's context of {}\n", n, cfg.seq_len);
      } else if (arms_bytes(n) > budget) {
        fmt::print(stderr, "bench decode: skipping context {}: the arms would hold {} of KV (budget {})\n", n,
                   FormatBytesIec(arms_bytes(n)), FormatBytesIec(budget));
      } else {
        config.contexts.push_back(n);
      }
    }
    if (config.contexts.empty()) config.contexts.push_back(std::max<int64_t>(limit, 0));
  }

  DecoderModel model(std::move(loaded->weights), o.shared.threads);
  auto progress = [](const std::string& line) { fmt::print(stderr, "bench decode: {}\n", line); };
  const Result<std::vector<DecodeBenchRow>> rows = RunDecodeBench(model, config, progress);
  if (!rows.ok()) return bad(rows.status().message());
  const KvSpec* reference = DecodeBenchReference(config);
  const int64_t weight_bytes = WeightBytesPerStep(model.weights());
  // What else a step reads, from the reference arm's rows: the weights (a MoE model's routed
  // experts as measured, their mean over the contexts run) and a hybrid's recurrent state.
  int64_t other_bytes = 0, expert_bytes = 0, ref_rows = 0;
  for (const DecodeBenchRow& r : *rows) {
    if (r.format != KvSpecName(*reference)) continue;
    other_bytes += r.weight_bytes + r.state_bytes;
    expert_bytes += r.expert_bytes;
    ++ref_rows;
  }
  other_bytes /= std::max<int64_t>(ref_rows, 1);
  expert_bytes /= std::max<int64_t>(ref_rows, 1);
  const int64_t state_bytes = cfg.state_floats() * 4;

  // Worth a kernel? From the shapes: the ceiling at 32K of every smaller arm.
  nlohmann::json verdicts = nlohmann::json::array();
  std::vector<std::string> verdict_lines;
  const Result<int64_t> ref32 = DecodeKvBytes(cfg, *reference, kVerdictContext);
  for (const KvSpec& spec : config.formats) {
    const KvSpec* f = &spec;
    const Result<int64_t> kv32 = DecodeKvBytes(cfg, spec, kVerdictContext);
    if (f == reference || !ref32.ok() || !kv32.ok()) continue;
    const double share = static_cast<double>(*ref32) / static_cast<double>(*ref32 + other_bytes);
    const double ceiling = SpeedupCeiling(share, static_cast<double>(*kv32) / static_cast<double>(*ref32));
    const bool clears = ceiling - 1.0 >= kVerdictThreshold;
    verdicts.push_back({{"format", KvSpecName(*f)}, {"context", kVerdictContext}, {"kv_share", share}, {"ceiling", ceiling},
                        {"verdict", clears ? "worth a kernel" : "not worth a kernel"}});
    verdict_lines.push_back(fmt::format(
        "{} vs {} at 32K: KV share {:.1f}%, ceiling {:.3f}x (+{:.1f}%) -> {}", KvSpecName(*f), KvSpecName(*reference),
        100 * share, ceiling, 100 * (ceiling - 1),
        clears ? "clears 10%: worth a kernel" : "under 10%: not worth a kernel"));
  }
  const std::string fill = "random rows encoded in each format (not a prefill)";
  if (o.shared.json) {
    nlohmann::json out = {{"model", model_path}, {"threads", o.shared.threads}, {"matvec_isa", MatVecTargetName()},
                          {"weight_bytes_per_step", weight_bytes + expert_bytes},
                          {"expert_bytes_per_step", expert_bytes}, {"state_bytes", state_bytes},
                          {"attention_layers", cfg.n_attention_layers()}, {"layers", cfg.n_layers},
                          {"reference", KvSpecName(*reference)}, {"fill", fill},
                          {"reps", o.reps}, {"results", nlohmann::json::array()}, {"kernel_verdicts", verdicts}};
    if (cfg.seq_len < kVerdictContext) out["kernel_verdicts_note"] = "computed from shapes past the model's context";
    for (const DecodeBenchRow& r : *rows) {
      out["results"].push_back({{"format", r.format}, {"context", r.context}, {"ms_median", r.ms_median},
                                {"ms_min", r.ms_min}, {"ms_max", r.ms_max}, {"tokens_per_second", r.tokens_per_second},
                                {"kv_bytes", r.kv_bytes}, {"weight_bytes", r.weight_bytes},
                                {"expert_bytes", r.expert_bytes}, {"state_bytes", r.state_bytes}, {"kv_share", r.kv_share},
                                {"ceiling", r.ceiling}, {"speedup", r.speedup}});
    }
    PrintJson(out);
    return 0;
  }
  const std::string layers = cfg.n_attention_layers() == cfg.n_layers
                                 ? fmt::format("{} layers", cfg.n_layers)
                                 : fmt::format("{} layers, KV in the {} attention layers", cfg.n_layers,
                                               cfg.n_attention_layers());
  fmt::print("decode: {} ({}, {} KV heads x {}, context {}), weights read per step {}, {} threads, "
             "matvec SIMD {}\n", model_path, layers, cfg.n_kv_heads, cfg.head_dim(), cfg.seq_len,
             FormatBytesIec(weight_bytes + expert_bytes), o.shared.threads, MatVecTargetName());
  if (cfg.moe.n_experts > 0 || state_bytes > 0) {
    fmt::print("  of which routed experts {} (measured: the experts the reference arm's steps chose, mean); "
               "recurrent state read per step {}\n", FormatBytesIec(expert_bytes), FormatBytesIec(state_bytes));
  }
  fmt::print("cache fill: {}; arms interleaved, {} timed steps each; ceiling and speedup vs {}\n\n", fill, o.reps,
             KvSpecName(*reference));
  fmt::print("{:<8} {:>8} {:>10} {:>17} {:>8} {:>11} {:>9} {:>9} {:>9}\n", "format", "context", "ms/step",
             "min-max ms", "tok/s", "KV read", "KV share", "ceiling", "measured");
  for (const DecodeBenchRow& r : *rows) {
    fmt::print("{:<8} {:>8} {:>10.2f} {:>17} {:>8.2f} {:>11} {:>8.1f}% {:>8.3f}x {:>8.3f}x\n", r.format, r.context,
               r.ms_median, fmt::format("{:.2f}-{:.2f}", r.ms_min, r.ms_max), r.tokens_per_second,
               FormatBytesIec(r.kv_bytes), 100 * r.kv_share, r.ceiling, r.speedup);
  }
  if (!verdict_lines.empty()) {
    fmt::print("\nworth a kernel? (a smaller format is, only if its ceiling at 32K clears 10%){}:\n",
               cfg.seq_len < kVerdictContext ? ", from shapes past this model's context" : "");
    for (const std::string& line : verdict_lines) fmt::print("  {}\n", line);
  }
  return 0;
}

}  // namespace

RepackOptions SharedOptions::LoaderRepack() const {
  return {.policy = static_cast<RepackPolicy>(repack), .memory_available = repack_memory_available};
}

void AddBenchDecodeCommand(CLI::App& bench, int* exit_code) {
  auto o = std::make_shared<BenchDecodeOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "decode", "Whole-model decode tok/s vs context per KV format, with KV share, ceiling and measured speedup");
  AddModelFlag(cmd, &o->shared);
  AddRepackFlags(cmd, &o->shared);
  AddFormatListFlag(cmd, &o->shared, "--format,--formats", "KV formats, comma-separated; paired, interleaved arms");
  AddScoreArithmeticFlag(cmd);
  AddContextListFlag(cmd, &o->shared, "--context,--contexts",
                     "Positions in the cache before the timed steps, comma-separated (default: 4096,16384,32768,65536 "
                     "within the model's context and --kv-budget)", 0, INT64_MAX);
  AddByteSizeFlag(cmd, "--kv-budget", &o->kv_budget, "Most KV bytes the arms may hold at once (default: 60% of RAM)");
  AddThreadsFlag(cmd, &o->shared);
  cmd->add_option("--reps", o->reps, "Timed decode steps per arm and context (median reported)")->capture_default_str();
  AddSeedFlag(cmd, &o->shared, "Seed of the random cache fill")->capture_default_str();
  AddJsonFlag(cmd, &o->shared);
  cmd->callback([o, exit_code] { *exit_code = RunBenchDecode(*o); });
}

}  // namespace kvq::cli
