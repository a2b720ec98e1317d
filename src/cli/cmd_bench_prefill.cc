// `kvq bench prefill`: real prefill tok/s per KV format and prompt length, the share of the time in
// weights, attention and the rest, and beside each figure its compute ceiling from the peaks
// measured in the same run (measure/prefill_bench.h).
#include <fmt/core.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/json_output.h"
#include "kvq/units.h"
#include "measure/prefill_bench.h"
#include "measure/roofline.h"
#include "model/load_model.h"
#include "weights/matvec.h"

namespace kvq::cli {
namespace {

constexpr int64_t kDefaultLengths[] = {512, 4096, 16384};
constexpr int32_t kRooflineReps = 5;

struct BenchPrefillOptions {
  // -m, --format, --prompt-len (in shared.contexts; empty: kDefaultLengths within the model's
  // context), -t, --json
  SharedOptions shared{.formats = {"f16", "int8", "int4"}};
  std::string prompt_file;  // -f; empty: the bundled data/eval/tinystories-eval.txt
  int32_t reps = 3;
};

// The bundled text: beside the source tree's models/ (run from a build folder), or ./data.
std::string BundledPromptFile() {
  const std::filesystem::path in_tree =
      (std::filesystem::path(KVQ_MODELS_DIR) / "../data/eval/tinystories-eval.txt").lexically_normal();
  return std::filesystem::exists(in_tree) ? in_tree.string() : "data/eval/tinystories-eval.txt";
}

int RunBenchPrefill(const BenchPrefillOptions& o) {
  auto bad = [](const std::string& m) { return BadInput("bench prefill", m); };
  if (o.reps < 1 || o.reps > 1000) return bad(fmt::format("--reps must be in 1..1000 (got {})", o.reps));
  PrefillBenchConfig config;
  config.reps = o.reps;
  const Result<std::vector<KvSpec>> formats = o.shared.FormatList();
  if (!formats.ok()) return bad(formats.status().message());
  config.formats = *formats;
  if (config.formats.empty()) return bad("--format: give at least one format");

  const std::string prompt_path = o.prompt_file.empty() ? BundledPromptFile() : o.prompt_file;
  std::ifstream in(prompt_path, std::ios::binary);
  if (!in) return bad(fmt::format("-f {}: cannot read the prompt file", prompt_path));
  std::stringstream text;
  text << in.rdbuf();

  const std::string model_path = o.shared.ModelPath();
  Result<LoadedModel> loaded = LoadModel(model_path, o.shared.TokenizerPath(), 0, o.shared.LoaderRepack());
  if (!loaded.ok()) return bad(loaded.status().message());
  const DecoderConfig cfg = loaded->weights.config;
  for (const KvSpec& f : config.formats) {
    if (Status s = CheckKvSpec(f, {.n_kv_heads = cfg.n_kv_heads, .head_dim = cfg.head_dim()}); !s.ok()) {
      return bad("--format: " + s.message());
    }
  }
  if (!o.shared.contexts.empty()) {
    for (int64_t n : o.shared.contexts) {
      if (n > cfg.seq_len) {
        return bad(fmt::format("--prompt-len {}: past the model's context of {} positions", n, cfg.seq_len));
      }
    }
    config.lengths = o.shared.contexts;
  } else {
    for (int64_t n : kDefaultLengths) {
      if (n > cfg.seq_len) {
        fmt::print(stderr, "bench prefill: skipping prompt length {}: past the model's context of {}\n", n,
                   cfg.seq_len);
      } else {
        config.lengths.push_back(n);
      }
    }
    if (config.lengths.empty()) config.lengths.push_back(cfg.seq_len);
  }
  const std::vector<int32_t> text_tokens = loaded->tokenizer.Encode(text.str(), /*add_bos=*/false);
  if (text_tokens.empty()) return bad(fmt::format("-f {}: the text has no tokens", prompt_path));
  const int64_t longest = *std::max_element(config.lengths.begin(), config.lengths.end());
  config.prompt = RepeatPrompt(loaded->tokenizer.bos(), text_tokens, longest);

  const int32_t threads = o.shared.threads;
  fmt::print(stderr, "bench prefill: measuring the compute roofline on {} threads\n", threads);
  config.roofline = MeasureComputeRoofline(threads, kRooflineReps);
  const ComputeRoofline& roof = config.roofline;
  DecoderModel model(std::move(loaded->weights), threads);
  const WeightMacs macs = CountWeightMacs(model.weights());
  auto progress = [](const std::string& line) { fmt::print(stderr, "bench prefill: {}\n", line); };
  const Result<std::vector<PrefillBenchRow>> rows = RunPrefillBench(model, config, progress);
  if (!rows.ok()) return bad(rows.status().message());
  const std::string weights_instruction = WeightsCeilingInstruction(macs, roof);
  const std::string prompt_note = fmt::format("{}: {} tokens, after a BOS, repeated to each length", prompt_path,
                                              text_tokens.size());
  if (o.shared.json) {
    nlohmann::json out = {{"model", model_path}, {"threads", threads}, {"matvec_isa", MatVecTargetName()},
                          {"prompt", prompt_note}, {"block_tokens", kPrefillBenchBlock}, {"reps", o.reps},
                          {"best_int8_gmacs", roof.best_int8_gmacs},
                          {"best_int8_instruction", roof.best_int8_instruction},
                          {"best_f32_gmacs", roof.best_f32_gmacs}, {"best_f32_instruction", roof.best_f32_instruction},
                          {"weights_ceiling_instruction", weights_instruction},
                          {"weight_macs_per_token", macs.per_token()},
                          {"classifier_macs", macs.int8_classifier + macs.f32_classifier},
                          {"results", nlohmann::json::array()}};
    for (const PrefillBenchRow& r : *rows) {
      out["results"].push_back(
          {{"format", r.format}, {"length", r.length}, {"s_median", r.s_median}, {"s_min", r.s_min},
           {"s_max", r.s_max}, {"tokens_per_second", r.tokens_per_second}, {"tps_min", r.tps_min},
           {"tps_max", r.tps_max}, {"weights_share", r.weights_share}, {"attention_share", r.attention_share},
           {"rest_share", r.rest_share}, {"weight_macs", r.weight_macs}, {"attention_macs", r.attention_macs},
           {"weights_ceiling_tps", r.weights_ceiling_tps}, {"pct_of_weights_ceiling", r.pct_of_weights_ceiling},
           {"weights_phase_pct_of_peak", r.weights_phase_pct}, {"attention_ceiling_s", r.attention_ceiling_s},
           {"attention_phase_pct_of_peak", r.attention_phase_pct}});
    }
    PrintJson(out);
    return 0;
  }
  const bool hybrid = cfg.n_attention_layers() < cfg.n_layers;
  const std::string layers = hybrid ? fmt::format("{} layers, KV in the {} attention layers", cfg.n_layers,
                                                  cfg.n_attention_layers())
                                    : fmt::format("{} layers", cfg.n_layers);
  fmt::print("prefill: {} ({}, {} query / {} KV heads x {}, context {}), {} threads, matvec SIMD {}\n",
             model_path, layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim(), cfg.seq_len, threads,
             MatVecTargetName());
  fmt::print("prompt: {}\n", prompt_note);
  fmt::print("each prefill: ForwardBlock over blocks of {} tokens into a fresh cache; arms interleaved, {} reps\n",
             kPrefillBenchBlock, o.reps);
  fmt::print("peaks measured in this run: int8 dot {} {:.1f} G mul-add/s, f32 FMA {} {:.1f} G mul-add/s\n",
             roof.best_int8_instruction, roof.best_int8_gmacs, roof.best_f32_instruction, roof.best_f32_gmacs);
  fmt::print("weights: {} mul-add per token + the classifier's {} once per prompt; ceiling from {}\n",
             FormatCount(macs.per_token()), FormatCount(macs.int8_classifier + macs.f32_classifier),
             weights_instruction);
  fmt::print("attention: causal, {}layers x sum_p (p+1) x 2 x heads x head_dim mul-adds; ceiling from {}{}\n\n",
             hybrid ? "attention " : "", roof.best_f32_instruction,
             hybrid ? "\n  (the attn phase also times the recurrent layers whole, which the ceiling does not count)"
                    : "");
  fmt::print("{:<7} {:>6} {:>8} {:>15} {:>8} {:>6} {:>6} {:>10} {:>7} {:>9} {:>12} {:>9}\n", "format", "tokens",
             "tok/s", "min-max", "weights", "attn", "rest", "w-ceiling", "of ceil", "w-phase", "attn ceil ms",
             "a-phase");
  for (const PrefillBenchRow& r : *rows) {
    fmt::print("{:<7} {:>6} {:>8.2f} {:>15} {:>7.1f}% {:>5.1f}% {:>5.1f}% {:>10.1f} {:>6.1f}% {:>8.1f}% {:>12.1f} "
               "{:>8.1f}%\n",
               r.format, r.length, r.tokens_per_second, fmt::format("{:.2f}-{:.2f}", r.tps_min, r.tps_max),
               100 * r.weights_share, 100 * r.attention_share, 100 * r.rest_share, r.weights_ceiling_tps,
               r.pct_of_weights_ceiling, r.weights_phase_pct, 1e3 * r.attention_ceiling_s, r.attention_phase_pct);
  }
  fmt::print("\nweights/attn/rest: shares of the prefill time; w-ceiling: tok/s if the weights' mul-adds ran at the "
             "peak and nothing else took time;\nw-phase, a-phase: the weights and attention phases' own rates as % of "
             "their peaks; attn ceil: the attention's mul-adds at the f32 peak\n");
  return 0;
}

}  // namespace

void AddBenchPrefillCommand(CLI::App& bench, int* exit_code) {
  auto o = std::make_shared<BenchPrefillOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "prefill", "Real prefill tok/s per KV format and prompt length, time shares and compute ceilings");
  AddModelFlag(cmd, &o->shared);
  AddRepackFlags(cmd, &o->shared);
  AddFormatListFlag(cmd, &o->shared, "--format,--formats", "KV formats, comma-separated; interleaved arms");
  AddContextListFlag(cmd, &o->shared, "--prompt-len",
                     "Prompt lengths in tokens, comma-separated (default: 512,4096,16384 within the model's "
                     "context)", 1, INT64_MAX);
  cmd->add_option("-f,--file", o->prompt_file,
                  "Text whose tokens, repeated, make the prompt (default: data/eval/tinystories-eval.txt)")
      ->type_name("FILE");
  AddThreadsFlag(cmd, &o->shared);
  cmd->add_option("--reps", o->reps, "Timed prefills per arm and length (median reported)")->capture_default_str();
  AddJsonFlag(cmd, &o->shared);
  cmd->callback([o, exit_code] { *exit_code = RunBenchPrefill(*o); });
}

}  // namespace kvq::cli
