// `kvq eval attention`: attention error vs context per KV spec (a format and its transforms;
// seed 000's measurement one) — on a model's real q, K, V captured from a text, or on Gaussian rows
// (--synthetic) — with the log-log slope of the mean error against the context.
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/eval_text.h"
#include "cli/json_output.h"
#include "cli/flags.h"
#include "attention_eval/attention_eval.h"
#include "kvq/attention.h"
#include "kvq/model.h"

namespace kvq::cli {
namespace {

// Seed 000's lengths: 16 up to its 2,787-token prompt.
const std::vector<int64_t> kDefaultContexts = {16, 64, 256, 1024, 2787};
constexpr const char* kCommand = "eval attention";

struct EvalAttentionOptions {
  SharedOptions shared;  // -m, --tokenizer, --format, --contexts, --seed, -t, --json
  std::string text;
  int64_t layer = -1, head = -1;
  bool synthetic = false;
  // Synthetic shape overrides (0: the model's).
  int64_t layers = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  // Which of the optional flags were given.
  bool contexts_given = false, layer_given = false, head_given = false;
};

std::string JoinContexts(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t n : v) s += (s.empty() ? "" : ", ") + std::to_string(n);
  return s;
}

std::string Sci(double x) { return fmt::format("{:.3e}", x); }

// What the header says about where the rows came from, also written into the JSON.
struct Source {
  nlohmann::json json;
  std::vector<std::string> lines;
};

void PrintAttentionReport(const EvalAttentionOptions& o, const Source& src, const AttentionErrorReport& report) {
  if (o.shared.json) {
    nlohmann::json out = src.json;
    out["results"] = nlohmann::json::array();
    for (const AttentionErrorRow& r : report.rows) {
      out["results"].push_back(
          {{"format", r.format}, {"context", r.context}, {"mean_abs_error", r.mean_abs_error},
           {"max_abs_error", r.max_abs_error}, {"positions_attended", r.positions_attended},
           {"top1_changed", r.top1_changed ? nlohmann::json(*r.top1_changed) : nlohmann::json(nullptr)},
           {"worst_layer", r.worst_layer}, {"worst_layer_mean_abs_error", r.worst_layer_mean_abs_error},
           {"reference_mean_abs", r.reference_mean_abs}, {"effective_positions", r.effective_positions},
           {"rounding_bound", r.rounding_bound ? nlohmann::json(*r.rounding_bound) : nlohmann::json(nullptr)}});
    }
    out["slope"] = nlohmann::json::object();
    for (const auto& [format, slope] : report.slopes) {
      out["slope"][format] = slope ? nlohmann::json(*slope) : nlohmann::json(nullptr);
    }
    PrintJson(out);
    return;
  }
  for (const std::string& line : src.lines) fmt::print("{}\n", line);
  size_t w = 10;
  bool any_bound = false;
  for (const AttentionErrorRow& r : report.rows) {
    w = std::max(w, r.format.size());
    any_bound = any_bound || (r.rounding_bound && *r.rounding_bound > 0);
  }
  if (any_bound) {
    fmt::print("f32 bound: for f32 K and V with rotation, the first-order bound on max abs err from f32 rounding "
               "(worst case, errors summed linearly; the harness refuses a row past it; f32 without rotation: 0)\n");
  }
  fmt::print("\n{:<{}} {:>8} {:>12} {:>12} {:>20} {:>10} {:>9} {:>9} {:>8}{}\n", "format", w, "context",
             "mean abs err", "max abs err", "worst layer (mean)", "mean |ref|", "eff. pos", "attended", "top-1",
             any_bound ? fmt::format(" {:>10}", "f32 bound") : "");
  fmt::print("{:<{}} {:>8} {:>12} {:>12} {:>20} {:>10} {:>9} {:>9} {:>8}\n", "", w, "", "", "", "", "", "", "",
             "changed");
  std::string previous;
  for (const AttentionErrorRow& r : report.rows) {
    if (!previous.empty() && r.format != previous) fmt::print("\n");
    previous = r.format;
    fmt::print("{:<{}} {:>8} {:>12} {:>12} {:>20} {:>10} {:>9.1f} {:>9} {:>8}{}\n", r.format, w, r.context,
               Sci(r.mean_abs_error), Sci(r.max_abs_error),
               fmt::format("{} ({})", r.worst_layer, Sci(r.worst_layer_mean_abs_error)), Sci(r.reference_mean_abs),
               r.effective_positions, r.positions_attended, r.top1_changed ? (*r.top1_changed ? "yes" : "no") : "-",
               !any_bound ? "" : r.rounding_bound ? fmt::format(" {:>10}", Sci(*r.rounding_bound)) : fmt::format(" {:>10}", "-"));
  }
  fmt::print("\nlog-log slope of mean abs error vs context (least squares over the contexts; -0.5 is 1/sqrt(n)):\n");
  for (const auto& [format, slope] : report.slopes) {
    fmt::print("  {:<{}} {}\n", format, w, slope ? fmt::format("{:+.3f}", *slope) : std::string("- (an error is 0)"));
  }
}

int RunEvalAttention(const EvalAttentionOptions& o) {
  auto bad = [](const std::string& m) { return BadInput(kCommand, m); };
  auto fail = [](const std::string& m) {
    fmt::print(stderr, "kvq {}: error: {}\n", kCommand, m);
    return 1;
  };
  AttentionErrorConfig config;
  const Result<std::vector<KvSpec>> formats = o.shared.FormatList();
  if (!formats.ok()) return bad(formats.status().message());
  for (const KvSpec& f : *formats) {
    if (std::find(config.formats.begin(), config.formats.end(), f) == config.formats.end()) config.formats.push_back(f);
  }
  if (config.formats.empty()) return bad("--format: expected at least one format");
  std::vector<int64_t> contexts = o.contexts_given ? o.shared.contexts : kDefaultContexts;
  if (contexts.empty()) return bad("--contexts: expected at least one context length");
  std::sort(contexts.begin(), contexts.end());
  contexts.erase(std::unique(contexts.begin(), contexts.end()), contexts.end());
  const struct { int64_t value; const char* flag; } shape_flags[] = {
      {o.layers, "--layers"}, {o.q_heads, "--q-heads"}, {o.kv_heads, "--kv-heads"}, {o.head_dim, "--head-dim"}};
  bool all_shape_flags = true;
  for (const auto& s : shape_flags) {
    if (s.value != 0 && !o.synthetic) return bad(fmt::format("{} sets the shape of --synthetic rows only", s.flag));
    if (s.value < 0 || s.value > 65536) return bad(fmt::format("{} must be in 1..65536 (got {})", s.flag, s.value));
    all_shape_flags = all_shape_flags && s.value != 0;
  }

  // The model: its shape and context, and for model rows its weights and tokenizer. Synthetic rows
  // with every shape flag given need no model.
  const bool need_model = !o.synthetic || !all_shape_flags;
  const std::string model_path = o.shared.ModelPath();
  std::unique_ptr<Model> loaded;
  if (need_model) {
    Result<std::unique_ptr<Model>> m =
        Model::Load(model_path, o.shared.LoadOptions());
    if (!m.ok()) return bad(m.status().message());
    loaded = std::move(m.value());
  }
  SyntheticShape shape;  // n_layers: the layers with KV (a hybrid's attention layers)
  if (loaded) {
    const ModelInfo& info = loaded->info();
    shape = {.n_layers = info.n_attention_layers, .n_heads = info.n_heads, .n_kv_heads = info.n_kv_heads,
             .head_dim = info.head_dim};
  }
  if (o.synthetic) {
    if (o.layers) shape.n_layers = static_cast<int32_t>(o.layers);
    if (o.q_heads) shape.n_heads = static_cast<int32_t>(o.q_heads);
    if (o.kv_heads) shape.n_kv_heads = static_cast<int32_t>(o.kv_heads);
    if (o.head_dim) shape.head_dim = static_cast<int32_t>(o.head_dim);
    if (shape.n_heads % shape.n_kv_heads != 0) {
      return bad(fmt::format("--q-heads {} must be a multiple of --kv-heads {}", shape.n_heads, shape.n_kv_heads));
    }
    if (shape.head_dim > kMaxHeadDim) return bad(fmt::format("--head-dim must be at most {}", kMaxHeadDim));
  }
  const std::string rows_of = o.synthetic ? "the synthetic rows" : "the model";
  if (!o.synthetic && o.layer_given) {  // the model's layer index: one that attends
    const ModelInfo& info = loaded->info();
    const std::vector<int32_t> attention_layers = AttentionLayersOf(*loaded);  // [attention layer] model layer
    if (std::find(attention_layers.begin(), attention_layers.end(), o.layer) == attention_layers.end()) {
      return bad(fmt::format("--layer {}: the model's layers with attention (and KV) are {}{}", o.layer,
                             fmt::join(attention_layers, ", "),
                             info.n_attention_layers < info.n_layers ? " (the others are recurrent)" : ""));
    }
  } else if (o.layer_given && (o.layer < 0 || o.layer >= shape.n_layers)) {
    return bad(fmt::format("--layer {}: {} has {} layers (0..{})", o.layer, rows_of, shape.n_layers, shape.n_layers - 1));
  }
  if (o.head_given && (o.head < 0 || o.head >= shape.n_heads)) {
    return bad(fmt::format("--head {}: {} has {} query heads (0..{})", o.head, rows_of, shape.n_heads, shape.n_heads - 1));
  }
  for (const KvSpec& f : config.formats) {
    if (Status s = CheckKvSpec(f, {.n_kv_heads = shape.n_kv_heads, .head_dim = shape.head_dim}); !s.ok()) {
      return bad("--format: " + s.message());
    }
  }
  config.layer = o.layer_given ? static_cast<int32_t>(o.layer) : -1;
  config.head = o.head_given ? static_cast<int32_t>(o.head) : -1;

  Source src;
  const std::string measured = fmt::format(
      "measured: {} of {}", o.head_given ? fmt::format("query head {}", o.head) : std::string("every query head"),
      o.layer_given ? fmt::format("layer {}", o.layer) : std::string("every layer (mean over layers; worst layer named)"));
  src.json = {{"isa", AttentionSimdTarget()}, {"score_arithmetic", ScoreArithmeticLabel()},
              {"layer", o.layer_given ? nlohmann::json(o.layer) : nlohmann::json(nullptr)},
              {"head", o.head_given ? nlohmann::json(o.head) : nlohmann::json(nullptr)},
              {"shape", {{"layers", shape.n_layers}, {"q_heads", shape.n_heads}, {"kv_heads", shape.n_kv_heads},
                         {"head_dim", shape.head_dim}}}};
  auto progress = [](const std::string& line) { fmt::print(stderr, "eval attention: {}\n", line); };
  Result<AttentionErrorReport> report = Status::Error("not run");

  // Every layer's K and V rows are held at once in f32 (then a cache per format and context): in
  // double, so a silly flag cannot overflow the check.
  auto rows_too_big = [&](int64_t positions) -> std::string {
    const double bytes = static_cast<double>(shape.n_layers) * static_cast<double>(positions) *
                         shape.n_kv_heads * shape.head_dim * 2 * 4;
    if (bytes <= static_cast<double>(int64_t{4} << 30)) return "";
    return fmt::format("--contexts: {} positions of {} layers would hold {:.3g} GB of f32 K/V rows (at most 4 GiB)",
                       positions, shape.n_layers, bytes / 1e9);
  };
  if (o.synthetic) {
    if (const std::string e = rows_too_big(contexts.back()); !e.empty()) return bad(e);
    config.contexts = contexts;
    src.json["source"] = "synthetic";
    src.json["seed"] = o.shared.seed;
    src.json["contexts"] = contexts;
    src.lines = {fmt::format("attention error vs context: synthetic rows (q, K, V drawn N(0, 1), seed {}), {} layers, "
                             "{} query heads, {} KV heads, head_dim {}, scale 1/sqrt(head_dim)",
                             o.shared.seed, shape.n_layers, shape.n_heads, shape.n_kv_heads, shape.head_dim),
                 "query at position context - 1 (attends to every position); reference: the f32 rows; candidate: "
                 "each spec's KvCache (rows 0..n-2 appended as a block, the query's row alone; finished through the "
                 "cache, which undoes V's rotation)",
                 measured, fmt::format("contexts: {}; attention kernel: SIMD {}; int8/int4 scores {}",
                                       JoinContexts(contexts), AttentionSimdTarget(), ScoreArithmeticLabel())};
    report = EvalSyntheticAttentionError(shape, o.shared.seed, config, progress);
  } else {
    const int64_t limit = loaded->info().trained_context;
    std::string cap_note;
    if (o.contexts_given) {
      if (contexts.back() > limit) {
        return bad(fmt::format("--contexts: {} is past the model's context of {} positions ({})", contexts.back(), limit,
                               model_path));
      }
    } else if (contexts.back() > limit) {
      std::vector<int64_t> dropped;
      for (int64_t n : contexts) {
        if (n > limit) dropped.push_back(n);
      }
      contexts.erase(std::remove_if(contexts.begin(), contexts.end(), [&](int64_t n) { return n >= limit; }),
                     contexts.end());
      contexts.push_back(limit);
      cap_note = fmt::format("contexts capped at the model's context of {} positions ({} dropped, {} added)", limit,
                             JoinContexts(dropped), limit);
    }
    if (const std::string e = rows_too_big(contexts.back()); !e.empty()) return bad(e);
    config.contexts = contexts;
    const bool default_text = o.text.empty();
    const std::string text_path = default_text ? BundledEvalText() : o.text;
    Result<std::string> text = ReadEvalText(text_path);
    if (!text.ok()) {
      return bad(text.status().message() + (default_text ? " (the default evaluation text; pass -f FILE)" : ""));
    }
    const AttentionTextInput input = AttentionTextOf(*loaded, *text, contexts.back());
    if (static_cast<int64_t>(input.tokens.size()) < contexts.back()) {
      return bad(fmt::format("-f {}: the text gives no tokens to run", text_path));
    }
    const std::string text_line =
        input.repeats > 1
            ? fmt::format("text: {} ({} tokens, shorter than the largest context {}: repeated, {} copies)", text_path,
                          input.text_tokens, contexts.back(), input.repeats)
            : fmt::format("text: {} ({} tokens, the first {} run)", text_path, input.text_tokens, contexts.back());
    src.json["source"] = "model";
    src.json["model"] = model_path;
    src.json["text"] = text_path;
    src.json["text_tokens"] = input.text_tokens;
    src.json["text_repeats"] = input.repeats;
    src.json["model_context"] = limit;
    src.json["contexts"] = contexts;
    src.json["contexts_note"] = cap_note.empty() ? nlohmann::json(nullptr) : nlohmann::json(cap_note);
    const int32_t all_layers = loaded->info().n_layers;
    const std::string layers = shape.n_layers == all_layers
                                   ? fmt::format("{} layers", all_layers)
                                   : fmt::format("{} layers, {} of them attention layers with KV, measured",
                                                 all_layers, shape.n_layers);
    src.lines = {fmt::format("attention error vs context: model rows from {} ({}, {} query heads, {} KV heads, "
                             "head_dim {}, context {})",
                             model_path, layers, shape.n_heads, shape.n_kv_heads, shape.head_dim, limit),
                 text_line,
                 "q, K, V after RoPE captured from an f32 run; query at position context - 1; reference: the model's "
                 "own attention output; candidate: each spec's KvCache (rows 0..n-2 appended as a block, the "
                 "query's row alone; finished through the cache, which undoes V's rotation)",
                 measured + "; top-1 changed: the next token's argmax with those attention outputs replaced",
                 fmt::format("contexts: {}; attention kernel: SIMD {}; int8/int4 scores {}", JoinContexts(contexts),
                             AttentionSimdTarget(), ScoreArithmeticLabel())};
    if (!cap_note.empty()) src.lines.push_back(cap_note);
    report = EvalModelAttentionError(*loaded, input.tokens, config, progress);
  }
  if (!report.ok()) return fail(report.status().message());
  PrintAttentionReport(o, src, *report);
  return 0;
}

}  // namespace

void AddEvalAttentionCommand(CLI::App& eval, int* exit_code) {
  auto o = std::make_shared<EvalAttentionOptions>();
  for (const FormatDesc* f : Formats()) o->shared.formats.push_back(f->name);
  CLI::App* cmd = eval.add_subcommand(
      "attention", "Attention error vs context per KV spec: one query at position n-1 over n cached "
                   "positions, reference f32 rows vs the spec's KvCache");
  AddModelFlag(cmd, &o->shared);
  AddRepackFlags(cmd, &o->shared);
  AddTokenizerFlag(cmd, &o->shared);
  cmd->add_option("-f,--file", o->text, "Text to run (default data/eval/tinystories-eval.txt); repeated when shorter "
                                        "than the largest context")
      ->type_name("FILE");
  AddFormatListFlag(cmd, &o->shared, "--format,--formats",
                    "KV specs (FORMAT[+rot][+sinkN][+resN]), comma-separated, each for K and V (default: every "
                    "format, plain)");
  AddScoreArithmeticFlag(cmd);
  CLI::Option* contexts = AddContextListFlag(
      cmd, &o->shared, "--contexts,--context", "Context lengths, comma-separated (default 16,64,256,1024,2787; model rows cap "
                                     "the defaults at the model's context)", 1, INT64_MAX);
  CLI::Option* layer = cmd->add_option("--layer", o->layer, "Measure only this layer (default: every layer, averaged)");
  CLI::Option* head = cmd->add_option("--head", o->head, "Measure only this query head (default: every head)");
  cmd->add_flag("--synthetic", o->synthetic, "Gaussian q, K, V rows of the model's shape instead of the model's own");
  AddSeedFlag(cmd, &o->shared, "Seed of the synthetic rows")->capture_default_str();
  cmd->add_option("--layers", o->layers, "Synthetic rows: layers (default: the model's)");
  cmd->add_option("--q-heads", o->q_heads, "Synthetic rows: query heads (default: the model's)");
  cmd->add_option("--kv-heads", o->kv_heads, "Synthetic rows: KV heads (default: the model's)");
  cmd->add_option("--head-dim", o->head_dim, "Synthetic rows: numbers per head (default: the model's)");
  AddThreadsFlag(cmd, &o->shared, "Threads of the model's forward pass");
  AddJsonFlag(cmd, &o->shared);
  cmd->callback([o, exit_code, contexts, layer, head] {
    o->contexts_given = contexts->count() > 0;
    o->layer_given = layer->count() > 0;
    o->head_given = head->count() > 0;
    *exit_code = RunEvalAttention(*o);
  });
}

}  // namespace kvq::cli
