// `kvq eval fidelity`: teacher-forced fidelity of KV formats on a real model — the same tokens
// through an f32 cache and through each format, logits compared at every position (seeds 002 and
// 004). Prints a Markdown table (or JSON) and can draw the memory-vs-damage scatter with gnuplot.
// With --kl-divergence-base / --kl-divergence-base-out it compares kvq with llama.cpp instead:
// one KV spec over llama-perplexity's chunking, against (or into) a llama.cpp logits file.
#include <fmt/core.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/eval_text.h"
#include "cli/json_output.h"
#include "cli/flags.h"
#include "fidelity_eval/fidelity_eval.h"
#include "kvq/model.h"

extern char** environ;

namespace kvq::cli {
namespace {

constexpr const char* kCommand = "eval fidelity";

struct FidelityOptions {
  // -m, --tokenizer, --format (empty: every registered format), -t, --json
  SharedOptions shared{.threads = 1};
  std::string text;
  std::string plot;
  std::string plot_y = "kl";
  // The llama.cpp comparison: the base file to read, the file to write, the chunk length (-c).
  std::string kl_base, kl_base_out;
  int64_t ctx_size = 0;  // 0: not given
  bool kv_given = false, format_given = false;
};

constexpr int64_t kLlamaPerplexityCtx = 512;  // llama-perplexity's default -c

// The executable `name` in a folder of PATH, or "" when there is none.
std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// Runs gnuplot on a generated script (a temporary file) and checks the plot file it should write.
Status DrawPlot(const std::string& gnuplot, const std::string& script, const std::string& output) {
  const std::filesystem::path script_path =
      std::filesystem::temp_directory_path() / fmt::format("kvq-fidelity-{}.gp", getpid());
  {
    std::ofstream out(script_path, std::ios::binary | std::ios::trunc);
    out << script;
    if (!out.good()) return Status::Error(fmt::format("cannot write the gnuplot script {}", script_path.string()));
  }
  std::error_code ec;
  std::filesystem::remove(output, ec);  // a stale plot must not pass for a new one
  const std::string script_arg = script_path.string();
  char* argv[] = {const_cast<char*>("gnuplot"), const_cast<char*>(script_arg.c_str()), nullptr};
  pid_t pid = 0;
  const int spawn_error = posix_spawn(&pid, gnuplot.c_str(), nullptr, nullptr, argv, environ);
  int wstatus = 0;
  const bool waited = spawn_error == 0 && waitpid(pid, &wstatus, 0) == pid;
  std::filesystem::remove(script_path, ec);
  if (spawn_error != 0) return Status::Error(fmt::format("cannot start {}: {}", gnuplot, std::strerror(spawn_error)));
  if (!waited || !WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    return Status::Error(fmt::format("gnuplot failed drawing {} (exit status {})", output,
                                     waited && WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1));
  }
  if (!std::filesystem::exists(output) || std::filesystem::file_size(output) == 0) {
    return Status::Error(fmt::format("gnuplot exited without writing {}", output));
  }
  return Status::Ok();
}

std::string Percent(double fraction) { return fmt::format("{:.1f}%", 100.0 * fraction); }

void PrintTable(const FidelityReport& r, const std::string& model, const std::string& text, bool bos) {
  fmt::print("Teacher-forced fidelity: model {}, text {}, {} positions{}; reference: f32 cache, "
             "perplexity {:.4f}; int8/int4 scores {}\n\n", model, text, r.positions, bos ? " (BOS included)" : "",
             r.reference_ppl, ScoreArithmeticLabel());
  fmt::print("bits/number and memory count every byte held at {} positions (f32 residual and sink rows, "
             "per-tensor scales included)\n\n", r.positions);
  fmt::print("| format | bits/number | memory vs f16 | logit drift | KL (nats) | top-1 agree | ppl |\n");
  fmt::print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const FidelityRow& f : r.formats) {
    fmt::print("| {} | {:.4g} | {} | {:.4g} | {:.4g} | {}/{} ({}) | {:.4f} |\n", f.format, f.bits_per_number,
               Percent(f.memory_vs_f16), f.logit_drift, f.kl, f.top1_agree, f.positions,
               Percent(static_cast<double>(f.top1_agree) / static_cast<double>(f.positions)), f.ppl);
  }
}

nlohmann::json ReportJson(const FidelityReport& r, const std::string& model, const std::string& text) {
  nlohmann::json formats = nlohmann::json::array();
  for (const FidelityRow& f : r.formats) {
    formats.push_back({{"format", f.format}, {"bits_per_number", f.bits_per_number},
                       {"memory_vs_f16", f.memory_vs_f16}, {"kv_bytes", f.kv_bytes},
                       {"logit_drift", f.logit_drift}, {"kl", f.kl},
                       {"top1_agree", static_cast<double>(f.top1_agree) / static_cast<double>(f.positions)},
                       {"top1_agree_count", f.top1_agree}, {"positions", f.positions}, {"ppl", f.ppl}});
  }
  return {{"model", model}, {"text", text}, {"positions", r.positions}, {"reference_ppl", r.reference_ppl},
          {"score_arithmetic", ScoreArithmeticLabel()},
          {"formats", formats}};
}

std::string Pm(const ValueWithError& v, double scale, int precision) {
  return fmt::format("{:.{}f} ± {:.{}f}", scale * v.value, precision, scale * v.error, precision);
}

// llama-perplexity --kl-divergence's closing statistics, in its order and wording.
void PrintKlSummary(const KlSummary& s) {
  fmt::print("====== Perplexity statistics ======\n");
  fmt::print("Mean PPL(Q)                   : {}\n", Pm(s.ppl, 1, 6));
  fmt::print("Mean PPL(base)                : {}\n", Pm(s.ppl_base, 1, 6));
  fmt::print("Cor(ln(PPL(Q)), ln(PPL(base))): {:.2f}%\n", 100 * s.ln_ppl_correlation);
  fmt::print("Mean ln(PPL(Q)/PPL(base))     : {}\n", Pm(s.ln_ppl_ratio, 1, 6));
  fmt::print("Mean PPL(Q)/PPL(base)         : {}\n", Pm(s.ppl_ratio, 1, 6));
  fmt::print("Mean PPL(Q)-PPL(base)         : {}\n\n", Pm(s.ppl_diff, 1, 6));
  fmt::print("====== KL divergence statistics ======\n");
  fmt::print("Mean    KLD: {}\n", Pm(s.kl, 1, 6));
  for (const Quantile& q : s.kl_quantiles) {
    const std::string name = q.name == "max" ? "Maximum" : q.name == "min" ? "Minimum" : q.name == "median" ? "Median " : q.name;
    fmt::print("{:<7} KLD: {:.6f}\n", name, q.value);
  }
  fmt::print("\n====== Token probability statistics ======\n");
  fmt::print("Mean    Δp: {} %\n", Pm(s.p_diff, 100, 3));
  for (const Quantile& q : s.p_diff_quantiles) {
    const std::string name = q.name == "max" ? "Maximum" : q.name == "min" ? "Minimum" : q.name == "median" ? "Median " : q.name;
    fmt::print("{:<7} Δp: {:.3f}%\n", name, 100 * q.value);
  }
  fmt::print("RMS Δp    : {} %\n", Pm(s.p_diff_rms, 100, 3));
  fmt::print("Same top p: {} % ({}/{} positions)\n", Pm(s.same_top, 100, 3), s.same_top_count, s.count);
}

nlohmann::json Pair(const ValueWithError& v) { return {{"value", v.value}, {"error", v.error}}; }

nlohmann::json QuantilesJson(const std::vector<Quantile>& qs) {
  nlohmann::json j = nlohmann::json::object();
  for (const Quantile& q : qs) j[q.name] = q.value;
  return j;
}

nlohmann::json KlJson(const KlReport& r, const std::string& model, const std::string& text, const std::string& kv,
                      const std::string& base, const std::string& out) {
  nlohmann::json j = {{"model", model}, {"text", text}, {"kv", kv}, {"n_ctx", r.n_ctx}, {"n_chunk", r.n_chunk},
                      {"positions", r.positions}, {"ppl", r.ppl}};
  j["kl_divergence_base"] = base.empty() ? nlohmann::json() : nlohmann::json(base);
  j["kl_divergence_base_out"] = out.empty() ? nlohmann::json() : nlohmann::json(out);
  if (!r.compared) return j;
  const KlSummary& s = r.summary;
  j["comparison"] = {
      {"count", s.count}, {"ppl", Pair(s.ppl)}, {"ppl_base", Pair(s.ppl_base)},
      {"ln_ppl_ratio", Pair(s.ln_ppl_ratio)}, {"ppl_ratio", Pair(s.ppl_ratio)}, {"ppl_diff", Pair(s.ppl_diff)},
      {"ln_ppl_correlation", s.ln_ppl_correlation},
      {"kl", {{"mean", s.kl.value}, {"error", s.kl.error}, {"quantiles", QuantilesJson(s.kl_quantiles)}}},
      {"p_diff", {{"mean", s.p_diff.value}, {"error", s.p_diff.error}, {"rms", Pair(s.p_diff_rms)},
                  {"quantiles", QuantilesJson(s.p_diff_quantiles)}}},
      {"same_top", {{"fraction", s.same_top.value}, {"error", s.same_top.error}, {"count", s.same_top_count}}}};
  return j;
}

// The llama.cpp comparison (--kl-divergence-base and/or --kl-divergence-base-out): one KV spec,
// llama-perplexity's chunks of the text, the base file's records compared and/or kvq's written.
int RunKl(const FidelityOptions& o, const std::string& text_path, const std::string& text) {
  auto bad = [](const std::string& m) { return BadInput(kCommand, m); };
  auto fail = [](const std::string& m) {
    fmt::print(stderr, "kvq {}: error: {}\n", kCommand, m);
    return 1;
  };
  const Result<LayerFormats> kv = o.shared.KvLayer();
  if (!kv.ok()) return bad(kv.status().message());
  if (!o.kl_base_out.empty() && o.kl_base_out == o.kl_base) {
    return bad(fmt::format("--kl-divergence-base-out {}: the same file as --kl-divergence-base", o.kl_base_out));
  }
  // The base file is checked before the model is loaded: a wrong file costs no model load.
  std::optional<KlBaseFile> base;
  if (!o.kl_base.empty()) {
    Result<KlBaseFile> r = KlBaseFile::Open(o.kl_base);
    if (!r.ok()) return bad("--kl-divergence-base " + r.status().message());
    base = std::move(r.value());
    if (o.ctx_size != 0 && o.ctx_size != base->n_ctx()) {
      return bad(fmt::format("-c {}: {} was written with n_ctx {}; leave -c out (the file's n_ctx is used) or "
                             "give the same", o.ctx_size, o.kl_base, base->n_ctx()));
    }
  }
  const std::string model_path = o.shared.ModelPath();
  Result<std::unique_ptr<Model>> model =
      Model::Load(model_path, o.shared.LoadOptions());
  if (!model.ok()) return bad(model.status().message());
  const ModelInfo& info = (*model)->info();
  const int64_t n_ctx = base ? base->n_ctx()
                             : o.ctx_size != 0 ? o.ctx_size : std::min<int64_t>(kLlamaPerplexityCtx, info.trained_context);
  if (n_ctx > info.trained_context) {
    return bad(fmt::format("-c {}: more than the model's context of {} positions", n_ctx, info.trained_context));
  }
  // llama-perplexity tokenizes the whole text with BOS first when the vocabulary adds one.
  const FidelityTokens all = FidelityTokensOf(**model, text, -1);
  if (base) {
    if (Status s = base->CheckMatches(**model, all.tokens); !s.ok()) {
      return bad("--kl-divergence-base " + s.message());
    }
  }
  const std::vector<int32_t> tokens = KlChunkTokens(all.tokens, static_cast<int32_t>(n_ctx));
  if (tokens.empty()) {
    return bad(fmt::format("-f {}: the text gives {} tokens, fewer than one chunk of -c {} (llama-perplexity "
                           "itself needs 2 chunks)", text_path, all.tokens.size(), n_ctx));
  }
  if (tokens.size() < all.tokens.size()) {
    fmt::print(stderr, "kvq {}: {} gives {} tokens; using {} chunks of {} ({} tokens), as llama-perplexity does\n",
               kCommand, text_path, all.tokens.size(), tokens.size() / n_ctx, n_ctx, tokens.size());
  }
  const RowShape row{.n_kv_heads = info.n_kv_heads, .head_dim = info.head_dim};
  for (const KvSpec& spec : {kv->Key(), kv->Value()}) {
    if (Status s = CheckKvSpec(spec, row); !s.ok()) return bad("--kv: " + s.message());
  }
  std::optional<KlOutFile> out;
  if (!o.kl_base_out.empty()) {
    Result<KlOutFile> w = KlOutFile::Create(o.kl_base_out, static_cast<int32_t>(n_ctx), **model, tokens);
    if (!w.ok()) return fail("--kl-divergence-base-out " + w.status().message());
    out = std::move(w.value());
  }
  const KlEvalConfig run{.kv = *kv, .n_ctx = static_cast<int32_t>(n_ctx), .base = base ? &*base : nullptr,
                         .out = out ? &*out : nullptr};
  Result<KlReport> report = EvalKlDivergence(**model, tokens, run, [](const std::string& line) {
    fmt::print(stderr, "kvq {}: {}\n", kCommand, line);
  });
  if (!report.ok()) return fail(report.status().message());
  if (out) {
    if (Status s = out->Close(); !s.ok()) return fail("--kl-divergence-base-out " + s.message());
    fmt::print(stderr, "kvq {}: wrote {} ({} chunks of {} tokens, {} records)\n", kCommand, o.kl_base_out,
               report->n_chunk, report->n_ctx, report->positions);
  }
  const std::string model_name = DisplayPath(model_path), text_name = DisplayPath(text_path);
  if (o.shared.json) {
    PrintJson(KlJson(*report, model_name, text_name, o.shared.KvFormatName(),
                     base ? DisplayPath(o.kl_base) : "", out ? DisplayPath(o.kl_base_out) : ""));
    return 0;
  }
  fmt::print("kvq (KV {}) on model {}, text {}: {} chunks of {} tokens{}, {} positions scored (the second half "
             "of each chunk); PPL {:.4f}\n", o.shared.KvFormatName(), model_name, text_name, report->n_chunk,
             report->n_ctx, all.bos >= 0 ? " (each starting with BOS)" : "", report->positions, report->ppl);
  if (out) fmt::print("wrote kvq's log-probabilities to {} (llama-perplexity --kl-divergence reads it)\n", o.kl_base_out);
  if (report->compared) {
    fmt::print("against the llama.cpp logits file {}\n\n", DisplayPath(o.kl_base));
    PrintKlSummary(report->summary);
  }
  return 0;
}

int RunEvalFidelity(const FidelityOptions& o) {
  auto bad = [](const std::string& m) { return BadInput(kCommand, m); };
  auto fail = [](const std::string& m) {
    fmt::print(stderr, "kvq {}: error: {}\n", kCommand, m);
    return 1;
  };
  const bool kl_mode = !o.kl_base.empty() || !o.kl_base_out.empty();
  if (kl_mode && (o.format_given || !o.plot.empty())) {
    return bad("--format and --plot compare KV formats with an f32 cache; with --kl-divergence-base(-out) kvq "
               "runs one KV spec (--kv, --kv-k, --kv-v)");
  }
  if (kl_mode && !o.shared.kv_plan.empty()) {
    return bad("--kv-plan is an arm compared with an f32 cache; with --kl-divergence-base(-out) kvq runs one KV "
               "spec for every layer (--kv, --kv-k, --kv-v)");
  }
  if (!kl_mode && (o.kv_given || o.ctx_size != 0)) {
    return bad("--kv, --kv-k, --kv-v and -c apply with --kl-divergence-base or --kl-divergence-base-out (use "
               "--format to compare KV formats with an f32 cache)");
  }
  if (o.plot_y != "kl" && o.plot_y != "drift") return bad(fmt::format("--plot-y must be kl or drift (got '{}')", o.plot_y));
  std::string gnuplot;
  if (!o.plot.empty()) {
    // Refuse a bad plot request before the run, not after it.
    if (Status s = CheckFidelityPlotPath(o.plot); !s.ok()) return bad("--plot " + s.message());
    gnuplot = FindOnPath("gnuplot");
    if (gnuplot.empty()) {
      return fail("--plot needs gnuplot, which is not on PATH (scripts/setup.sh installs gnuplot-nox)");
    }
  }
  FidelityConfig config;
  const Result<std::vector<KvSpec>> specs = o.shared.FormatList();
  if (!specs.ok()) return bad(specs.status().message());
  for (const KvSpec& spec : *specs) config.arms.push_back(FidelityArm::Uniform(spec));
  if (specs->empty() && (o.shared.kv_plan.empty() || o.format_given)) {
    for (const FormatDesc* f : Formats()) config.arms.push_back(FidelityArm::Uniform(f));
  }

  const std::string text_path = o.text.empty() ? BundledEvalText() : o.text;
  const Result<std::string> text = ReadEvalText(text_path);
  if (!text.ok()) return bad(text.status().message());
  if (kl_mode) return RunKl(o, text_path, *text);

  const std::string model_path = o.shared.ModelPath();
  Result<std::unique_ptr<Model>> model =
      Model::Load(model_path, o.shared.LoadOptions());
  if (!model.ok()) return bad(model.status().message());
  const ModelInfo& info = (*model)->info();
  const FidelityTokens input = FidelityTokensOf(**model, *text, info.trained_context);
  if (input.full_count > static_cast<int64_t>(input.tokens.size())) {
    fmt::print(stderr, "kvq {}: {} gives {} tokens; using the first {} (the model's context)\n", kCommand,
               text_path, input.full_count, input.tokens.size());
  }
  if (input.tokens.size() < 2) {
    return bad(fmt::format("-f {}: the text gives {} token(s); at least 2 are needed", text_path,
                           input.tokens.size()));
  }
  const RowShape row{.n_kv_heads = info.n_kv_heads, .head_dim = info.head_dim};
  for (const FidelityArm& arm : config.arms) {
    for (const KvSpec& spec : {arm.layers[0].Key(), arm.layers[0].Value()}) {
      if (Status s = CheckKvSpec(spec, row); !s.ok()) return bad("--format: " + s.message());
    }
  }
  if (!o.shared.kv_plan.empty()) {  // the plan is one more arm, after the --format ones
    Result<std::vector<LayerFormats>> plan = o.shared.KvLayers((*model)->fingerprint());
    if (!plan.ok()) return bad(plan.status().message());
    config.arms.push_back({.name = "plan " + DisplayPath(o.shared.kv_plan), .layers = std::move(plan.value())});
  } else if (o.shared.kv_bits > 0) {
    return bad("--kv-bits: needs --kv-plan (the plan whose bits it bounds)");
  }

  Result<FidelityReport> report = EvalFidelity(**model, input.tokens, config, [](const std::string& line) {
    fmt::print(stderr, "kvq {}: {}\n", kCommand, line);
  });
  if (!report.ok()) return fail(report.status().message());

  const std::string model_name = DisplayPath(model_path), text_name = DisplayPath(text_path);
  if (o.shared.json) {
    PrintJson(ReportJson(*report, model_name, text_name));
  } else {
    PrintTable(*report, model_name, text_name, input.bos >= 0);
  }
  std::fflush(stdout);
  if (!o.plot.empty()) {
    const FidelityPlotOptions plot{
        .output = o.plot, .metric = o.plot_y == "kl" ? FidelityPlotMetric::kKl : FidelityPlotMetric::kLogitDrift,
        .title = fmt::format("kvq eval fidelity: {} on {}", model_name, text_name)};
    const Result<std::string> script = FidelityPlotScript(*report, plot);
    if (!script.ok()) return fail("--plot " + script.status().message());
    if (Status s = DrawPlot(gnuplot, *script, o.plot); !s.ok()) return fail("--plot: " + s.message());
    fmt::print(stderr, "kvq {}: wrote {}\n", kCommand, o.plot);
  }
  return 0;
}

}  // namespace

void AddEvalFidelityCommand(CLI::App& eval, int* exit_code) {
  auto o = std::make_shared<FidelityOptions>();
  CLI::App* cmd = eval.add_subcommand(
      "fidelity",
      "Teacher-forced fidelity of KV formats: the same tokens through an f32 cache and through each\n"
      "format (K and V), one decode step per token, logits compared at every position: logit drift\n"
      "(mean |dlogit| over positions x vocab), mean KL(ref||cand), top-1 agreement and perplexity,\n"
      "beside bits per number and memory as a share of f16. With --kl-divergence-base or\n"
      "--kl-divergence-base-out: kvq against llama.cpp through llama-perplexity's logits file");
  AddModelFlag(cmd, &o->shared);
  AddRepackFlags(cmd, &o->shared);
  AddTokenizerFlag(cmd, &o->shared);
  cmd->add_option("-f,--file", o->text,
                  "Text to evaluate on (default: data/eval/tinystories-eval.txt); cut to the model's context")
      ->type_name("FILE");
  AddFormatListFlag(cmd, &o->shared, "--format,--formats",
                    "KV specs to compare, comma-separated, each for K and V of every layer: FORMAT[+rot][+sinkN]"
                    "[+resN]\n(default: every format, or none beside --kv-plan; see kvq formats)");
  AddJsonFlag(cmd, &o->shared,
                "Print JSON: model, text, positions, reference_ppl, formats[] with format, bits_per_number, "
                "memory_vs_f16 and top1_agree as fractions (0..1), logit_drift, kl, positions, ppl; with\n"
                "--kl-divergence-base(-out): model, text, kv, n_ctx, n_chunk, positions, ppl, the two files and\n"
                "comparison{count, ppl, ppl_base, ln_ppl_ratio, ppl_ratio, ppl_diff (value, error), kl and\n"
                "p_diff (mean, error, quantiles; p_diff.rms), same_top (fraction, error, count)}");
  cmd->add_option("--plot", o->plot, "Also draw memory (x) vs damage (y, log) to FILE.png or FILE.svg (needs gnuplot)")
      ->check(OutputFilePath())->type_name("FILE");
  cmd->add_option("--plot-y", o->plot_y, "The plot's y axis: kl or drift")->capture_default_str();
  AddThreadsFlag(cmd, &o->shared, "Threads (the numbers do not depend on it)");
  cmd->add_option("--kl-divergence-base", o->kl_base,
                  "Compare with llama.cpp: read FILE, written by llama-perplexity --kl-divergence-base FILE on\n"
                  "the same text, and report KL divergence, same-top-token share and delta-p of kvq's logits\n"
                  "(KV spec from --kv/--kv-k/--kv-v) against it over its chunks, as llama-perplexity\n"
                  "--kl-divergence does; the text must tokenize to the file's ids")
      ->type_name("FILE");
  cmd->add_option("--kl-divergence-base-out", o->kl_base_out,
                  "Write kvq's log-probabilities to FILE in llama.cpp's layout (chunks of -c tokens of the\n"
                  "text), for llama-perplexity --kl-divergence --kl-divergence-base FILE")
      ->check(OutputFilePath())->type_name("FILE");
  cmd->add_option("-c,--ctx-size", o->ctx_size,
                  "Chunk length for --kl-divergence-base-out (default: 512 as llama-perplexity, or the model's\n"
                  "context when smaller); with --kl-divergence-base the file's n_ctx is used")
      ->check(IntInRange(3, int64_t{1} << 30));
  AddKvFormatFlags(cmd, &o->shared);
  AddKvPlanFlags(cmd, &o->shared);
  AddScoreArithmeticFlag(cmd);
  cmd->callback([o, cmd, exit_code] {
    o->kv_given = cmd->count("--kv") + cmd->count("--kv-k") + cmd->count("--kv-v") > 0;
    o->format_given = cmd->count("--format") > 0;
    *exit_code = RunEvalFidelity(*o);
  });
}

}  // namespace kvq::cli
