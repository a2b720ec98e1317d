// `kvq eval fidelity`: teacher-forced fidelity of KV formats on a real model — the same tokens
// through an f32 cache and through each format, logits compared at every position (seeds 002 and
// 004). Prints a Markdown table (or JSON) and can draw the memory-vs-damage scatter with gnuplot.
#include <fmt/core.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/json_output.h"
#include "cli/flags.h"
#include "measure/fidelity.h"
#include "model/load_model.h"

#ifndef KVQ_MODELS_DIR
#define KVQ_MODELS_DIR "models"
#endif

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
};

// The bundled evaluation text: data/eval/ beside the source tree's models/ (when run from a build
// folder), else ./data/eval/.
std::string BundledEvalText() {
  const std::filesystem::path rel = "data/eval/tinystories-eval.txt";
  const std::filesystem::path beside = std::filesystem::path(KVQ_MODELS_DIR).parent_path() / rel;
  return std::filesystem::exists(beside) ? beside.string() : rel.string();
}

// A path as printed in tables and JSON: relative to the working directory when it lies below it,
// so a table in the docs does not carry one machine's absolute paths.
std::string DisplayPath(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path rel =
      std::filesystem::path(path).lexically_proximate(std::filesystem::current_path(ec));
  if (ec || rel.empty() || *rel.begin() == "..") return path;
  return rel.string();
}

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
             "perplexity {:.4f}\n\n", model, text, r.positions, bos ? " (BOS included)" : "", r.reference_ppl);
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
          {"formats", formats}};
}

int RunEvalFidelity(const FidelityOptions& o) {
  auto bad = [](const std::string& m) { return BadInput(kCommand, m); };
  auto fail = [](const std::string& m) {
    fmt::print(stderr, "kvq {}: error: {}\n", kCommand, m);
    return 1;
  };
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
  const Result<std::vector<const FormatDesc*>> formats = o.shared.FormatList();
  if (!formats.ok()) return bad(formats.status().message());
  config.formats = *formats;
  if (config.formats.empty()) config.formats.assign(Formats().begin(), Formats().end());

  const std::string text_path = o.text.empty() ? BundledEvalText() : o.text;
  if (!std::filesystem::is_regular_file(text_path)) {
    return bad(fmt::format("-f {}: no such text file (expected a UTF-8 text file to evaluate on)", text_path));
  }
  std::ifstream in(text_path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) return bad(fmt::format("-f {}: cannot read the file", text_path));
  if (text.str().empty()) return bad(fmt::format("-f {}: the file is empty (expected text to evaluate on)", text_path));

  const std::string model_path = o.shared.ModelPath();
  Result<LoadedModel> loaded = LoadModel(model_path, o.shared.TokenizerPath());
  if (!loaded.ok()) return bad(loaded.status().message());
  const Tokenizer tokenizer = std::move(loaded.value().tokenizer);
  const LlamaConfig cfg = loaded->weights.config;
  const FidelityInput input = MakeFidelityInput(tokenizer, text.str(), cfg.seq_len);
  if (input.full_count > static_cast<int64_t>(input.tokens.size())) {
    fmt::print(stderr, "kvq {}: {} gives {} tokens; using the first {} (the model's context)\n", kCommand,
               text_path, input.full_count, input.tokens.size());
  }
  if (input.tokens.size() < 2) {
    return bad(fmt::format("-f {}: the text gives {} token(s); at least 2 are needed", text_path,
                           input.tokens.size()));
  }
  const RowShape row{.n_kv_heads = cfg.n_kv_heads, .head_dim = cfg.head_dim()};
  for (const FormatDesc* f : config.formats) {
    if (Status s = CheckShape(*f, row); !s.ok()) return bad("--format: " + s.message());
  }

  LlamaModel model(std::move(loaded.value().weights), o.shared.threads);
  Result<FidelityReport> report = RunFidelity(model, input.tokens, config, [](const std::string& line) {
    fmt::print(stderr, "kvq {}: {}\n", kCommand, line);
  });
  if (!report.ok()) return fail(report.status().message());

  const std::string model_name = DisplayPath(model_path), text_name = DisplayPath(text_path);
  if (o.shared.json) {
    PrintJson(ReportJson(*report, model_name, text_name));
  } else {
    PrintTable(*report, model_name, text_name, tokenizer.add_bos() && tokenizer.bos() >= 0);
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
      "beside bits per number and memory as a share of f16");
  AddModelFlag(cmd, &o->shared);
  AddTokenizerFlag(cmd, &o->shared);
  cmd->add_option("-f,--file", o->text,
                  "Text to evaluate on (default: data/eval/tinystories-eval.txt); cut to the model's context");
  AddFormatListFlag(cmd, &o->shared, "--format",
                    "KV formats to compare, comma-separated (default: every format; see kvq formats)");
  AddJsonFlag(cmd, &o->shared,
                "Print JSON: model, text, positions, reference_ppl, formats[] with format, bits_per_number, "
                "memory_vs_f16 and top1_agree as fractions (0..1), logit_drift, kl, positions, ppl");
  cmd->add_option("--plot", o->plot, "Also draw memory (x) vs damage (y, log) to FILE.png or FILE.svg (needs gnuplot)");
  cmd->add_option("--plot-y", o->plot_y, "The plot's y axis: kl or drift")->capture_default_str();
  AddThreadsFlag(cmd, &o->shared, "Threads (the numbers do not depend on it)");
  cmd->callback([o, exit_code] { *exit_code = RunEvalFidelity(*o); });
}

}  // namespace kvq::cli
