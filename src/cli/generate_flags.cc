// The generation flags of kvq run and kvq chat (generate_flags.h), the model and session they
// describe, and the Ctrl-C handler both use.
#include "cli/generate_flags.h"

#include <fmt/core.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <string_view>
#include <utility>

#include "cli/hub_flag.h"
#include "kvq/generator.h"
#include "kvq/kv_spec.h"

namespace kvq::cli {

std::atomic<bool> g_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free, "read and written in a signal handler");

namespace {

extern "C" void OnInterrupt(int) {
  if (g_interrupted.exchange(true)) _exit(130);  // 128 + SIGINT, as a shell reports it
}

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

// One --logit-bias value as (token id, bias): llama.cpp's TOKEN_ID+BIAS or TOKEN_ID-BIAS (the sign
// is the bias's: "15043-1" lowers token 15043 by 1) or the page's TOKEN_ID:BIAS ("15043:-1",
// "15043:+2.5"); BIAS a decimal number, or inf for a ban ("15043-inf": Sampler::Sample never picks
// a token at -infinity). NaN and +inf are refused. Stricter than llama.cpp's stof, which reads
// "15043+1x" as +1: the whole value is read or it is refused.
Result<std::pair<int32_t, float>> ParseLogitBias(std::string_view value) {
  auto refuse = [&](std::string_view why) {
    return Status::Error(fmt::format("--logit-bias {}: {}", value, why));
  };
  constexpr std::string_view kSyntax =
      "expected TOKEN_ID+BIAS, TOKEN_ID-BIAS or TOKEN_ID:BIAS (e.g. 15043+1, 15043-inf to ban, "
      "15043:-2.5)";
  const char* const end = value.data() + value.size();
  int64_t id = -1;
  const auto [after_id, id_error] = std::from_chars(value.data(), end, id);
  if (id_error == std::errc::result_out_of_range || (id_error == std::errc() && id > INT32_MAX)) {
    return refuse("the token id is out of range");
  }
  if (id_error != std::errc() || id < 0 || value[0] == '-') return refuse(kSyntax);
  if (after_id == end) return refuse(fmt::format("the bias has no sign; {}", kSyntax));
  const char sign = *after_id;
  const char* number = after_id + 1;
  // After + or -, the sign is the bias's own ("15043+-1" is refused); after ':', one may follow.
  bool negative = sign == '-';
  if (sign == ':' && number != end && (*number == '+' || *number == '-'))
    negative = *number++ == '-';
  if ((sign != '+' && sign != '-' && sign != ':') || number == end || *number == '+' ||
      *number == '-') {
    return refuse(kSyntax);
  }
  float magnitude = 0.0f;
  const auto [after_number, number_error] =
      std::from_chars(number, end, magnitude, std::chars_format::general);
  if (number_error == std::errc::result_out_of_range)
    return refuse("the bias is out of a float's range");
  if (number_error != std::errc() || after_number != end) return refuse(kSyntax);
  const float bias = negative ? -magnitude : magnitude;
  if (std::isnan(bias) || bias == std::numeric_limits<float>::infinity()) {
    return refuse(fmt::format("the bias must be a finite number or -inf (a ban) (got {})", bias));
  }
  return std::pair{static_cast<int32_t>(id), bias};
}

}  // namespace

InterruptScope::InterruptScope() {
  g_interrupted = false;
  struct sigaction sa {};
  sa.sa_handler = OnInterrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &previous_);
}

InterruptScope::~InterruptScope() { sigaction(SIGINT, &previous_, nullptr); }

SamplerOptions GenerateFlags::Sampling() const {
  // --seed -1 (llama.cpp's spelling of "random") arrives as the largest 64-bit value.
  const bool seed_given = seed != nullptr && seed->count() > 0 && shared.seed != UINT64_MAX;
  SamplerOptions o{.temperature = temp,
                   .top_k = top_k,
                   .top_p = top_p,
                   .min_p = min_p,
                   .seed = seed_given ? shared.seed : std::random_device{}(),
                   .repeat_penalty = repeat_penalty,
                   .frequency_penalty = frequency_penalty,
                   .presence_penalty = presence_penalty,
                   .repeat_last_n = repeat_last_n};
  // In the order given: an id given twice has both added, as the sampler applies them in turn.
  for (const std::string& value : logit_bias) o.logit_bias.push_back(ParseLogitBias(value).value());
  return o;
}

Status GenerateFlags::Check() const {
  // NaN passes every comparison below: refused first, with the infinities.
  for (const auto& [flag, value] : {std::pair{"--temp", temp}, {"--top-p", top_p}, {"--min-p", min_p},
                                    {"--repeat-penalty", repeat_penalty}, {"--frequency-penalty", frequency_penalty},
                                    {"--presence-penalty", presence_penalty}}) {
    if (!std::isfinite(value)) return Status::Error(fmt::format("{} must be a finite number (got {})", flag, value));
  }
  if (temp < 0) return Status::Error(fmt::format("--temp must be >= 0 (got {})", temp));
  if (repeat_penalty <= 0) return Status::Error(fmt::format("--repeat-penalty must be > 0 (got {})", repeat_penalty));
  if (repeat_last_n < -1) return Status::Error(fmt::format("--repeat-last-n must be >= -1 (got {})", repeat_last_n));
  if (top_p <= 0 || top_p > 1) return Status::Error(fmt::format("--top-p must be in (0, 1] (got {})", top_p));
  if (min_p < 0 || min_p >= 1) return Status::Error(fmt::format("--min-p must be in [0, 1) (got {})", min_p));
  if (top_k < 0) return Status::Error(fmt::format("--top-k must be >= 0 (got {})", top_k));
  for (const std::string& s : stop) {
    if (s.empty()) return Status::Error("--stop: a stop string has at least one byte (got \"\")");
  }
  // Each value, then each id's total as the sampler adds them up: 1e38 given four times would reach
  // +inf, and +inf then -inf a NaN logit.
  std::map<int32_t, float> total;
  for (const std::string& value : logit_bias) {
    const Result<std::pair<int32_t, float>> parsed = ParseLogitBias(value);
    if (!parsed.ok()) return parsed.status();
    float& sum = total[parsed->first];
    sum += parsed->second;
    if (std::isnan(sum) || sum == std::numeric_limits<float>::infinity()) {
      return Status::Error(
          fmt::format("--logit-bias {}: token {}'s biases add up to {}; the total must be a finite "
                      "number or -inf (a ban)",
                      value, parsed->first, sum));
    }
  }
  return Status::Ok();
}

Status GenerateFlags::CheckLogitBias(int32_t vocab_size) const {
  for (const std::string& value : logit_bias) {
    const int32_t id = ParseLogitBias(value)->first;  // Check() read every value
    if (id >= vocab_size) {
      return Status::Error(
          fmt::format("--logit-bias {}: token {} is not in the model's vocabulary of {} tokens "
                      "(ids 0 to {})",
                      value, id, vocab_size, vocab_size - 1));
    }
  }
  return Status::Ok();
}

Result<std::string> GenerateFlags::Grammar() const {
  struct Source {
    const char* flag;
    const std::string& value;
    bool file, schema;
  };
  const Source sources[] = {{"--grammar", grammar, false, false},
                            {"--grammar-file", grammar_file, true, false},
                            {"--json-schema", json_schema, false, true},
                            {"--json-schema-file", json_schema_file, true, true}};
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

void AddGenerateFlags(CLI::App* cmd, GenerateFlags* o) {
  AddModelFlag(cmd, &o->shared);
  AddRepackFlags(cmd, &o->shared);
  AddHfRepoFlag(cmd, &o->shared);
  AddTokenizerFlag(cmd, &o->shared);
  cmd->add_option("-n,--n-predict", o->n, "New tokens to generate at most (llama.cpp's -n; < 0: until an end token)")
      ->capture_default_str();
  cmd->add_option("--stop", o->stop,
                  "Text that ends a reply before it (repeatable; the first found ends it, as llama-server's stop)")
      ->type_name("TEXT")
      ->allow_extra_args(false);
  cmd->add_option("--temp", o->temp, "Temperature; 0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "Top-k (0 = off)")->capture_default_str();
  cmd->add_option("--top-p", o->top_p, "Top-p / nucleus (1 = off)")->capture_default_str();
  cmd->add_option("--min-p", o->min_p, "Min-p (0 = off)")->capture_default_str();
  cmd->add_option("--repeat-penalty", o->repeat_penalty,
                  "Divide the logit of a token in the last --repeat-last-n by this (multiply when negative); 1 = off")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", o->frequency_penalty,
                  "Subtract this times a token's count in the last --repeat-last-n from its logit; 0 = off")
      ->capture_default_str();
  cmd->add_option("--presence-penalty", o->presence_penalty,
                  "Subtract this from the logit of each token in the last --repeat-last-n; 0 = off")
      ->capture_default_str();
  cmd->add_option("--repeat-last-n", o->repeat_last_n,
                  "The penalties' window: the last N tokens held, prompt included (0 = off, -1 = all)")
      ->capture_default_str();
  cmd->add_option("-l,--logit-bias", o->logit_bias,
                  "Add BIAS to token TOKEN_ID's logit before the penalties (repeatable; as "
                  "llama.cpp: 15043+1 raises token 15043 by 1, 15043-1 lowers it, 15043-inf bans "
                  "it; TOKEN_ID:BIAS also, e.g. 15043:-2.5)")
      ->type_name("TOKEN_ID(+/-)BIAS")
      ->allow_extra_args(false);
  o->seed = AddSeedFlag(cmd, &o->shared, "Sampling seed (default, or -1: random)");
  cmd->add_option("-c,--ctx-size", o->context, "Context size (default: the model's)");
  cmd->add_flag("-q,--quiet", o->quiet, "No banner after loading and no prompt progress on stderr");
  AddKvFormatFlags(cmd, &o->shared);
  AddKvPlanFlags(cmd, &o->shared);
  AddScoreArithmeticFlag(cmd);
  AddBudgetFlags(cmd, &o->shared);
  AddThreadsFlag(cmd, &o->shared);
  AddSpeculationFlags(cmd, &o->speculation, &o->draft);
  cmd->add_option("--grammar", o->grammar, "GBNF (llama.cpp's syntax, start rule root) the output follows");
  cmd->add_option("--grammar-file", o->grammar_file, "Read the --grammar GBNF from FILE")->type_name("FILE");
  cmd->add_option("--json-schema", o->json_schema,
                  "A JSON Schema the output follows (JSON text; the subset is in docs/serving.md)");
  cmd->add_option("--json-schema-file", o->json_schema_file, "Read the --json-schema schema from FILE")
      ->type_name("FILE");
}

Result<ModelSession> LoadModelSession(const GenerateFlags& o) {
  if (Status s = o.Check(); !s.ok()) return s;
  const SharedOptions& so = o.shared;
  Result<std::unique_ptr<Model>> loaded =
      Model::Load(so.ModelPath(), so.LoadOptions());
  if (!loaded.ok()) return loaded.status();
  ModelSession ms{.model = std::move(loaded).value(), .session = nullptr};
  const ModelInfo& info = ms.model->info();
  if (Status s = o.CheckLogitBias(info.vocab_size); !s.ok()) return s;
  // One spec for all layers, or --kv-plan's (checked against the model's fingerprint: only then is
  // it computed, as it reads every weight).
  const Result<std::vector<LayerFormats>> layers =
      so.KvLayers(so.kv_plan.empty() ? ModelFingerprint{} : ms.model->fingerprint());
  if (!layers.ok()) return layers.status();
  if (o.context < 0 || o.context > info.trained_context) {
    return Status::Error(fmt::format("-c {}: the model's context is {} positions", o.context, info.trained_context));
  }
  Result<std::unique_ptr<Session>> made = ms.model->NewSession(KvOptionsOf(*layers, so, o.context));
  if (!made.ok()) return made.status();
  ms.session = std::move(made).value();
  ms.speculation = o.speculation;
  Result<std::unique_ptr<Model>> draft = LoadDraftModel(o.draft, *ms.model, so.threads, &ms.speculation);
  if (!draft.ok()) return draft.status();
  ms.draft_model = std::move(draft).value();
  return ms;
}

}  // namespace kvq::cli
