// `kvq run`: generate text with a Llama-architecture model through the kvq cache. With no -m it
// runs the bundled stories260K (llama2.c files under models/).
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/json_output.h"
#include "cli/flags.h"
#include "cache/snapshot.h"
#include "kvq/kv_cache.h"
#include "kvq/units.h"
#include "generate/generate.h"
#include "model/load_model.h"

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
};

int RunGenerate(const RunOptions& o) {
  auto bad = [](const std::string& m) { return BadInput("run", m); };
  const SharedOptions& so = o.shared;
  const std::string model_path = so.ModelPath();
  if (o.temp < 0) return bad(fmt::format("--temp must be >= 0 (got {})", o.temp));
  if (o.top_p <= 0 || o.top_p > 1) return bad(fmt::format("--top-p must be in (0, 1] (got {})", o.top_p));
  if (o.min_p < 0 || o.min_p >= 1) return bad(fmt::format("--min-p must be in [0, 1) (got {})", o.min_p));
  if (o.top_k < 0) return bad(fmt::format("--top-k must be >= 0 (got {})", o.top_k));

  Result<LoadedModel> loaded_model = LoadModel(model_path, so.TokenizerPath());
  if (!loaded_model.ok()) return bad(loaded_model.status().message());
  LlamaWeights* weights = &loaded_model.value().weights;
  const Tokenizer* tokenizer = &loaded_model.value().tokenizer;
  const LlamaConfig cfg = weights->config;

  const Result<std::vector<LayerFormats>> kv = so.KvLayers(*weights);  // one for all, or --kv-plan's
  if (!kv.ok()) return bad(kv.status().message());
  const int64_t context = o.context == 0 ? cfg.seq_len : o.context;
  if (context < 0 || context > cfg.seq_len) {
    return bad(fmt::format("-c {}: the model's context is {} positions", o.context, cfg.seq_len));
  }
  // A hybrid model's cache holds its attention layers and its recurrent layers' fixed state.
  KvCacheConfig cache_config{.n_layers = cfg.n_attention_layers(),
                             .n_kv_heads = cfg.n_kv_heads,
                             .head_dim = cfg.head_dim(),
                             .layers = *kv,
                             .key_rope = ModelRopeConfig(cfg),
                             .max_positions = context,
                             .page_positions = DefaultPagePositions(context),
                             .budgets = so.budgets,
                             .state_floats = cfg.state_floats()};
  Result<std::unique_ptr<KvCache>> cache = KvCache::Create(cache_config);
  if (!cache.ok()) return bad(cache.status().message());

  // Prompt cache: a snapshot of the cache after every prompt token but the last, with those ids
  // (and a hybrid model's recurrent state at that point).
  const ModelFingerprint fingerprint = o.prompt_cache.empty() ? ModelFingerprint{} : Fingerprint(*weights);
  std::vector<int32_t> cached_tokens;
  if (!o.prompt_cache.empty() && std::filesystem::exists(o.prompt_cache)) {
    Result<std::vector<int32_t>> loaded = (*cache)->Load(o.prompt_cache, fingerprint);
    if (!loaded.ok()) {
      fmt::print(stderr, "kvq run: error: --prompt-cache {}: {}\n", o.prompt_cache, loaded.status().message());
      return 1;
    }
    const std::vector<int32_t> prompt_tokens = tokenizer->Encode(o.prompt, tokenizer->add_bos());
    const bool prefix = loaded->size() < prompt_tokens.size() &&
                        std::equal(loaded->begin(), loaded->end(), prompt_tokens.begin());
    if (prefix) {
      cached_tokens = std::move(loaded).value();
    } else {  // another prompt: start from an empty cache, and save this prompt's prefix instead
      if (!so.json) {
        fmt::print(stderr, "kvq run: --prompt-cache {} holds another prompt's prefix ({} tokens); recomputing\n",
                   o.prompt_cache, loaded->size());
      }
      cache = KvCache::Create(cache_config);
      if (!cache.ok()) return bad(cache.status().message());
    }
  }
  LlamaModel model(std::move(*weights), so.threads);
  GenerateOptions g{.prompt = o.prompt, .n_new = o.n,
                    .sampling = {.temperature = o.temp, .top_k = o.top_k, .top_p = o.top_p,
                                 .min_p = o.min_p, .seed = o.seed_given ? so.seed : std::random_device{}()}};
  if (!o.prompt_cache.empty()) {
    g.on_prefix = [&](const std::vector<int32_t>& prefix) {
      const Status s = (*cache)->Save(o.prompt_cache, fingerprint, prefix);
      return s.ok() ? s : Status::Error("--prompt-cache: " + s.message());
    };
  }
  auto stream = [&](const std::string& piece) {
    if (!so.json) {
      fmt::print("{}", piece);
      std::fflush(stdout);
    }
  };
  if (!so.json) fmt::print("{}", o.prompt);
  Result<GenerateResult> r = Generate(model, *tokenizer, **cache, g, stream, cached_tokens);
  if (!r.ok()) {
    fmt::print(stderr, "\nkvq run: error: {}\n", r.status().message());
    return 1;
  }
  // The cache's exact bytes, and what f16 (the default) would take for the same positions.
  const FormatDesc* f16 = FindFormat(FormatId::kF16);
  int64_t kv_bytes = 0, kv_bytes_f16 = 0;
  for (int64_t l = 0; l < cache_config.n_layers; ++l) {  // a hybrid's attention layers only
    const RowShape shape{cfg.n_kv_heads, cfg.head_dim()};
    const int64_t n = (*cache)->positions(l);
    const LayerFormats& f = kv->size() == 1 ? kv->front() : (*kv)[static_cast<size_t>(l)];
    kv_bytes += SpecBytesForRows(f.key->key, f.key_transforms, shape, n) +
                SpecBytesForRows(f.value->value, f.value_transforms, shape, n);
    kv_bytes_f16 += BytesForRows(f16->key, shape, n) + BytesForRows(f16->value, shape, n);
  }
  // Prompt speed counts the tokens actually run (a prompt cache skips the rest).
  const double prompt_tps = r->prompt_seconds > 0 ? (r->n_prompt - r->n_reused) / r->prompt_seconds : 0;
  const double decode_tps = r->decode_seconds > 0 ? r->n_decoded / r->decode_seconds : 0;
  const std::string format_name = so.KvFormatName();
  if (so.json) {
    nlohmann::json out = {{"prompt", o.prompt}, {"completion", r->completion}, {"tokens", r->tokens},
                          {"prompt_tps", prompt_tps}, {"decode_tps", decode_tps}, {"kv_bytes", kv_bytes},
                          {"kv_bytes_f16", kv_bytes_f16},
                          {"kv_format", format_name}, {"model", model_path},
                          {"prompt_cache_reused_tokens", r->n_reused}};
    PrintJson(out);
    return 0;
  }
  fmt::print("\n\n");
  std::fflush(stdout);
  if (r->n_reused > 0) {
    fmt::print(stderr, "kvq run: prompt cache {}: reused {} of {} prompt tokens (prefill skipped)\n",
               o.prompt_cache, r->n_reused, r->n_prompt);
  }
  const std::string vs_f16 =
      kv_bytes_f16 > 0 && format_name != "f16"
          ? fmt::format(", {:.1f}% of f16's {} bytes", 100.0 * kv_bytes / kv_bytes_f16, FormatCount(kv_bytes_f16))
          : "";
  fmt::print(stderr, "kvq run: prompt {} tokens at {:.1f} tok/s, decode {} tokens at {:.1f} tok/s; KV cache "
             "{} bytes ({}) in {}{}\n", r->n_prompt, prompt_tps, r->n_decoded, decode_tps, FormatCount(kv_bytes),
             FormatBytesIec(kv_bytes), format_name, vs_f16);
  return 0;
}

}  // namespace

void AddRunCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text with a model (default: the bundled stories260K)");
  AddModelFlag(cmd, &o->shared);
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
  cmd->add_option("--prompt-cache", o->prompt_cache,
                  "Save the cache after the prompt to FILE; reuse it when a later prompt starts with it");
  AddJsonFlag(cmd, &o->shared, "Print one JSON document instead of streaming text");
  cmd->callback([o, exit_code, seed] {
    o->seed_given = seed->count() > 0;
    *exit_code = RunGenerate(*o);
  });
}

}  // namespace kvq::cli
