// `kvq run`: generate text with a model through the kvq cache, as a client of the public API
// (kvq::Model, Session::Generate). With no -m it runs the bundled stories260K (llama2.c files
// under models/).
#include <fmt/core.h>

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/hub_flag.h"
#include "cli/json_output.h"
#include "kvq/generator.h"
#include "kvq/kv_memory.h"
#include "kvq/model.h"
#include "kvq/session.h"
#include "kvq/units.h"

namespace kvq::cli {
namespace {

struct RunOptions {
  SharedOptions shared;  // -m, --tokenizer, --kv*, budgets, --seed, -t, --json
  std::string prompt;
  int32_t n = 256;
  float temp = 0.8f;
  int32_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  bool seed_given = false;
  int64_t context = 0;
  std::string prompt_cache;
  std::string grammar, grammar_file, json_schema, json_schema_file;  // at most one given
  SpeculationOptions speculation;
};

// The GBNF that --grammar, --grammar-file, --json-schema or --json-schema-file give ("" for none),
// checked; errors name the flag.
Result<std::string> GrammarOf(const RunOptions& o) {
  struct Source {
    const char* flag;
    const std::string& value;
    bool file, schema;
  };
  const Source sources[] = {{"--grammar", o.grammar, false, false},
                            {"--grammar-file", o.grammar_file, true, false},
                            {"--json-schema", o.json_schema, false, true},
                            {"--json-schema-file", o.json_schema_file, true, true}};
  const Source* given = nullptr;
  for (const Source& s : sources) {
    if (s.value.empty()) continue;
    if (given) return Status::Error(fmt::format("{} and {}: give at most one grammar", given->flag, s.flag));
    given = &s;
  }
  if (!given) return std::string();
  std::string text = given->value;
  if (given->file) {
    std::ifstream in(given->value, std::ios::binary);
    if (!in) return Status::Error(fmt::format("{} {}: cannot read the file", given->flag, given->value));
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (given->schema) {
    Result<std::string> gbnf = JsonSchemaGrammar(text);
    if (!gbnf.ok()) return Status::Error(fmt::format("{}: {}", given->flag, gbnf.status().message()));
    text = std::move(gbnf).value();
  }
  if (Status s = Generator::Check({.grammar = text}); !s.ok()) {
    return Status::Error(fmt::format("{}: {}", given->flag, s.message()));
  }
  return text;
}

// Ctrl-C during `kvq run`: the first sets the flag the session's abort callback reads (the
// prompt stops within a block, generation before the next token, and the stats line still
// prints); a second, while the first is being honoured, exits at once.
std::atomic<bool> g_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free, "read and written in a signal handler");

extern "C" void OnInterrupt(int) {
  if (g_interrupted.exchange(true)) _exit(130);  // 128 + SIGINT, as a shell reports it
}

// Installs OnInterrupt for SIGINT while alive; the previous handler is restored after.
class InterruptScope {
 public:
  InterruptScope() {
    struct sigaction sa {};
    sa.sa_handler = OnInterrupt;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &previous_);
  }
  ~InterruptScope() { sigaction(SIGINT, &previous_, nullptr); }
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

 private:
  struct sigaction previous_ {};
};

// --kv / --kv-k / --kv-v or --kv-plan's specs as the public KvOptions, with the budgets and -c.
KvOptions KvOptionsOf(const std::vector<LayerFormats>& layers, const SharedOptions& so, int64_t context) {
  KvOptions kv{.budgets = so.budgets, .context = context};
  if (layers.size() == 1) {
    kv.key_format = KvSpecName(layers[0].Key());
    kv.value_format = KvSpecName(layers[0].Value());
  } else {
    for (const LayerFormats& l : layers) kv.layers.push_back({KvSpecName(l.Key()), KvSpecName(l.Value())});
  }
  return kv;
}

int RunGenerate(const RunOptions& o) {
  auto bad = [](const std::string& m) { return BadInput("run", m); };
  const SharedOptions& so = o.shared;
  const std::string model_path = so.ModelPath();
  if (o.temp < 0) return bad(fmt::format("--temp must be >= 0 (got {})", o.temp));
  if (o.top_p <= 0 || o.top_p > 1) return bad(fmt::format("--top-p must be in (0, 1] (got {})", o.top_p));
  if (o.min_p < 0 || o.min_p >= 1) return bad(fmt::format("--min-p must be in [0, 1) (got {})", o.min_p));
  if (o.top_k < 0) return bad(fmt::format("--top-k must be >= 0 (got {})", o.top_k));
  const Result<std::string> grammar = GrammarOf(o);
  if (!grammar.ok()) return bad(grammar.status().message());

  Result<std::unique_ptr<Model>> loaded = Model::Load(model_path, {.tokenizer_path = so.TokenizerPath(),
                                                                   .threads = so.threads});
  if (!loaded.ok()) return bad(loaded.status().message());
  const Model& model = **loaded;
  const ModelInfo& info = model.info();
  // One spec for all layers, or --kv-plan's (checked against the model's fingerprint: only then is
  // it computed, as it reads every weight).
  const Result<std::vector<LayerFormats>> layers =
      so.KvLayers(so.kv_plan.empty() ? ModelFingerprint{} : model.fingerprint());
  if (!layers.ok()) return bad(layers.status().message());
  if (o.context < 0 || o.context > info.trained_context) {
    return bad(fmt::format("-c {}: the model's context is {} positions", o.context, info.trained_context));
  }
  Result<std::unique_ptr<Session>> made = model.NewSession(KvOptionsOf(*layers, so, o.context));
  if (!made.ok()) return bad(made.status().message());
  Session& session = **made;

  const std::vector<int32_t> prompt_ids = model.Tokenize(o.prompt);
  // Prompt cache: a snapshot of the session after every prompt token but the last (SavePrefix),
  // which Generate reuses when it is a prefix of this prompt and clears when it is not.
  if (!o.prompt_cache.empty() && std::filesystem::exists(o.prompt_cache)) {
    if (Result<int64_t> n = session.LoadPrefix(o.prompt_cache); !n.ok()) {
      fmt::print(stderr, "kvq run: error: --prompt-cache {}: {}\n", o.prompt_cache, n.status().message());
      return 1;
    }
    const std::span<const int32_t> held = session.tokens();
    const bool prefix = held.size() < prompt_ids.size() && std::equal(held.begin(), held.end(), prompt_ids.begin());
    if (!prefix && !so.json) {  // another prompt: this one's prefix is saved instead
      fmt::print(stderr, "kvq run: --prompt-cache {} holds another prompt's prefix ({} tokens); recomputing\n",
                 o.prompt_cache, held.size());
    }
  }
  const GenerateRequest request{
      .max_tokens = o.n,
      .sampling = {.temperature = o.temp, .top_k = o.top_k, .top_p = o.top_p, .min_p = o.min_p,
                   .seed = o.seed_given ? so.seed : std::random_device{}()},
      .grammar = *grammar,
      .save_prefix = o.prompt_cache,
      .speculation = o.speculation};
  auto stream = [&](int32_t, const std::string& text) {
    if (!so.json) {
      fmt::print("{}", text);
      std::fflush(stdout);
    }
    return true;
  };
  if (!so.json) fmt::print("{}", o.prompt);
  g_interrupted = false;
  session.SetAbortCallback([] { return g_interrupted.load(); });
  const InterruptScope interrupt_scope;
  Result<Completion> c = session.Generate(prompt_ids, request, stream);
  if (!c.ok()) {
    fmt::print(stderr, "\nkvq run: error: {}\n", c.status().message());
    return 1;
  }
  // Decode passes: the session holds the prompt and every generated token that was run (or, when
  // Ctrl-C stopped the prompt, part of the prompt and none).
  const int64_t n_decoded = std::max<int64_t>(0, session.positions() - c->n_prompt);
  const int64_t n_prompt_run = std::min<int64_t>(session.positions(), c->n_prompt) - c->n_reused;
  // The cache's exact bytes, and what f16 (the default) would take for the same positions.
  const int64_t kv_bytes = session.kv_bytes();
  const Result<int64_t> f16_bytes = KvBytesForContext(
      *FindFormat(FormatId::kF16),
      {.n_layers = info.n_attention_layers, .n_kv_heads = info.n_kv_heads, .head_dim = info.head_dim},
      session.positions());
  const int64_t kv_bytes_f16 = f16_bytes.ok() ? *f16_bytes : 0;  // an error: no positions
  // Prompt speed counts the tokens actually run (a prompt cache skips the rest).
  const double prompt_tps = c->prompt_seconds > 0 ? n_prompt_run / c->prompt_seconds : 0;
  const double decode_tps = c->decode_seconds > 0 ? n_decoded / c->decode_seconds : 0;
  const std::string format_name = so.KvFormatName();
  const char* finish = FinishReasonName(c->finish);
  if (so.json) {
    std::vector<int32_t> tokens = prompt_ids;
    tokens.insert(tokens.end(), c->tokens.begin(), c->tokens.end());
    nlohmann::json out = {{"prompt", o.prompt}, {"completion", c->text}, {"tokens", tokens},
                          {"prompt_tps", prompt_tps}, {"decode_tps", decode_tps}, {"kv_bytes", kv_bytes},
                          {"kv_bytes_f16", kv_bytes_f16},
                          {"kv_format", format_name}, {"model", model_path},
                          {"prompt_cache_reused_tokens", c->n_reused}, {"finish_reason", finish},
                          {"decode_passes", c->speculation.passes}, {"drafted_tokens", c->speculation.drafted},
                          {"accepted_tokens", c->speculation.accepted}};
    PrintJson(out);
    return 0;
  }
  fmt::print("\n\n");
  std::fflush(stdout);
  if (c->n_reused > 0) {
    fmt::print(stderr, "kvq run: prompt cache {}: reused {} of {} prompt tokens (prefill skipped)\n",
               o.prompt_cache, c->n_reused, c->n_prompt);
  }
  const std::string vs_f16 =
      kv_bytes_f16 > 0 && format_name != "f16"
          ? fmt::format(", {:.1f}% of f16's {} bytes", 100.0 * kv_bytes / kv_bytes_f16, FormatCount(kv_bytes_f16))
          : "";
  // Ctrl-C during the prompt: say how much of it ran.
  const std::string prompt_cut =
      session.positions() < c->n_prompt ? fmt::format(" ({} run before Ctrl-C)", session.positions()) : "";
  const SpeculationStats& spec = c->speculation;
  const std::string drafts =
      o.speculation.source == DraftSource::kNone
          ? ""
          : fmt::format(" in {} passes ({} drafted, {} kept)", spec.passes, spec.drafted, spec.accepted);
  fmt::print(stderr, "kvq run: prompt {} tokens{} at {:.1f} tok/s, decode {} tokens{} at {:.1f} tok/s; KV cache "
             "{} bytes ({}) in {}{}; finish: {}\n", c->n_prompt, prompt_cut, prompt_tps, n_decoded, drafts,
             decode_tps, FormatCount(kv_bytes), FormatBytesIec(kv_bytes), format_name, vs_f16, finish);
  return 0;
}

}  // namespace

void AddRunCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text with a model (default: the bundled stories260K)");
  AddModelFlag(cmd, &o->shared);
  AddHfRepoFlag(cmd, &o->shared);
  AddTokenizerFlag(cmd, &o->shared);
  cmd->add_option("-p,--prompt", o->prompt, "Prompt text");
  cmd->add_option("-n,--n-predict", o->n, "New tokens to generate at most (llama.cpp's -n)")->capture_default_str();
  cmd->add_option("--temp", o->temp, "Temperature; 0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "Top-k (0 = off)")->capture_default_str();
  cmd->add_option("--top-p", o->top_p, "Top-p / nucleus (1 = off)")->capture_default_str();
  cmd->add_option("--min-p", o->min_p, "Min-p (0 = off)")->capture_default_str();
  CLI::Option* seed = AddSeedFlag(cmd, &o->shared, "Sampling seed (default: random)");
  cmd->add_option("-c,--ctx-size", o->context, "Context size (default: the model's)");
  AddKvFormatFlags(cmd, &o->shared);
  AddKvPlanFlags(cmd, &o->shared);
  AddScoreArithmeticFlag(cmd);
  AddBudgetFlags(cmd, &o->shared);
  AddThreadsFlag(cmd, &o->shared);
  AddSpeculationFlags(cmd, &o->speculation);
  cmd->add_option("--prompt-cache", o->prompt_cache,
                  "Save the cache after the prompt to FILE; reuse it when a later prompt starts with it");
  cmd->add_option("--grammar", o->grammar, "GBNF (llama.cpp's syntax, start rule root) the output follows");
  cmd->add_option("--grammar-file", o->grammar_file, "Read the --grammar GBNF from FILE");
  cmd->add_option("--json-schema", o->json_schema,
                  "A JSON Schema the output follows (JSON text; the subset is in docs/serving.md)");
  cmd->add_option("--json-schema-file", o->json_schema_file, "Read the --json-schema schema from FILE");
  AddJsonFlag(cmd, &o->shared, "Print one JSON document instead of streaming text");
  cmd->callback([o, exit_code, seed] {
    o->seed_given = seed->count() > 0;
    *exit_code = ResolveModelFlag("run", &o->shared);
    if (*exit_code == 0) *exit_code = RunGenerate(*o);
  });
}

}  // namespace kvq::cli
