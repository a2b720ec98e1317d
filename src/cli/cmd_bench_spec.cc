// `kvq bench spec`: what speculative decoding buys, per draft source, KV format and context depth.
// For each depth and format one session prefills the prompt once (the text cycled to the depth);
// each arm is a Fork of it that generates greedily with its draft source (Session::Generate, the
// loop `kvq run --spec` runs), arms interleaved round by round; a draft model reads the prompt once
// too (Session::PrefillDraft), and the forks carry its session. Every arm must produce the tokens
// of the arm without speculation — the bench checks that and fails if not — so the rows compare
// the same output made in fewer or more passes.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/json_output.h"
#include "kvq/model.h"
#include "kvq/session.h"
#include "kvq/speculation.h"

namespace kvq::cli {
namespace {

// The default text: code with repeated spans that vary a little (a file of near-identical
// functions), where drafts from the text itself should be kept often.
std::string DefaultText() {
  std::string text;
  for (int i = 0; i < 4; ++i) {
    text += fmt::format("int scale_{0}(int x) {{\n  int y = x * {0};\n  if (y > {1}) return {1};\n  return y;\n}}\n\n",
                        i + 2, 100 * (i + 1));
  }
  return text;
}

struct BenchSpecOptions {
  SharedOptions shared{.formats = {"f16", "int8", "int4"}, .contexts = {0}};
  std::vector<std::string> sources;  // --spec; empty: every draft source
  std::string text_file;             // --text; empty: DefaultText()
  int32_t tokens = 128;
  int32_t reps = 3;
  SpeculationOptions spec;  // --draft-max, --draft-ngram, --draft-p-min, --spec-ungated
  DraftModelFlags draft;    // --draft-model, --draft-kv
  bool pass_times = false;  // --pass-times: time verify passes of 1..draft-max+1 tokens instead
};

struct Arm {  // one (context, format, source) row, summed over the reps
  int64_t context = 0, positions = 0;
  std::string format;
  DraftSource source = DraftSource::kNone;
  std::vector<double> tokens_per_second;  // [reps]
  SpeculationStats stats;
  int64_t generated = 0;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// What the gate weighs a draft against: the seconds of a verify pass of b tokens (logits for every
// position, as Generate asks) on `session`, for b = 1..passes.size(), median of `reps`, each pass
// truncated away again so every one starts at the same depth. The sizes run interleaved per rep.
Status TimeVerifyPasses(Session& session, std::span<const int32_t> text, int32_t reps,
                        std::vector<double>* milliseconds /* [b − 1] median ms of a pass of b tokens */) {
  const int32_t most = static_cast<int32_t>(milliseconds->size());
  std::vector<std::vector<double>> each(most);  // [b − 1][rep]
  std::vector<int32_t> rows(most);              // logits_at: every position of the pass
  for (int32_t i = 0; i < most; ++i) rows[i] = i;
  const int64_t before = session.positions();
  for (int32_t rep = 0; rep < reps + 1; ++rep) {  // round 0 warms the caches and is not counted
    for (int32_t b = 1; b <= most; ++b) {
      std::vector<int32_t> pass(b);
      for (int32_t i = 0; i < b; ++i) pass[i] = text[(before + i) % text.size()];
      const auto start = std::chrono::steady_clock::now();
      if (Status st = session.Prefill(pass, std::span<const int32_t>(rows).first(b)); !st.ok()) return st;
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      if (rep > 0) each[b - 1].push_back(ms);
      if (Status st = session.Truncate(before); !st.ok()) return st;
    }
  }
  for (int32_t b = 1; b <= most; ++b) (*milliseconds)[b - 1] = Median(each[b - 1]);
  return Status::Ok();
}

int RunBenchSpec(const BenchSpecOptions& o) {
  auto bad = [](const std::string& m) { return BadInput("bench spec", m); };
  if (o.tokens < 1 || o.tokens > 100000) return bad(fmt::format("--tokens must be in 1..100000 (got {})", o.tokens));
  if (o.reps < 1 || o.reps > 100) return bad(fmt::format("--reps must be in 1..100 (got {})", o.reps));
  std::vector<DraftSource> sources;
  for (const std::string& name : o.sources) {
    Result<DraftSource> s = ParseDraftSource(name);
    if (!s.ok()) return bad("--spec: " + s.status().message());
    if (std::find(sources.begin(), sources.end(), *s) == sources.end()) sources.push_back(*s);
  }
  if (sources.empty()) {
    sources.assign(DraftSources().begin(), DraftSources().end());
    // Every source by default; a draft model's only when one is given.
    if (o.draft.path.empty()) std::erase(sources, DraftSource::kModel);
  }
  const bool with_model = std::find(sources.begin(), sources.end(), DraftSource::kModel) != sources.end();
  if (with_model && o.draft.path.empty()) return bad("--spec draft needs a draft model: --draft-model FILE");
  if (!with_model && !o.draft.path.empty()) return bad("--draft-model is given but --spec does not list draft");
  // The reference arm (no speculation) runs first in each round; its tokens are what every arm must give.
  std::erase(sources, DraftSource::kNone);
  sources.insert(sources.begin(), DraftSource::kNone);
  std::string text = DefaultText();
  if (!o.text_file.empty()) {
    std::ifstream in(o.text_file, std::ios::binary);
    if (!in) return bad(fmt::format("--text {}: cannot read the file", o.text_file));
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const Result<std::vector<KvSpec>> formats = o.shared.FormatList();
  if (!formats.ok()) return bad(formats.status().message());
  if (formats->empty()) return bad("--format: give at least one format");

  Result<std::unique_ptr<Model>> loaded =
      Model::Load(o.shared.ModelPath(), o.shared.LoadOptions());
  if (!loaded.ok()) return bad(loaded.status().message());
  const Model& model = **loaded;
  SpeculationOptions spec = o.spec;
  std::unique_ptr<Model> draft_model;
  if (with_model) {
    spec.source = DraftSource::kModel;
    Result<std::unique_ptr<Model>> draft = LoadDraftModel(o.draft, model, o.shared.threads, &spec);
    if (!draft.ok()) return bad(draft.status().message());
    draft_model = std::move(draft).value();
  }
  const std::vector<int32_t> text_ids = model.Tokenize(text);
  if (text_ids.size() < 2) return bad("--text: the text is shorter than two tokens");
  const int64_t context = model.info().context;
  for (const int64_t n : o.shared.contexts) {
    const int64_t positions = std::max<int64_t>(n, static_cast<int64_t>(text_ids.size()));
    if (n < 0 || positions + o.tokens + o.spec.max_draft > context) {
      return bad(fmt::format("--context {}: a prompt of {} positions, {} generated tokens and a draft of {} do not "
                             "fit the model's context of {}", n, positions, o.tokens, o.spec.max_draft, context));
    }
  }

  std::vector<Arm> arms;
  for (const int64_t n : o.shared.contexts) {
    // The prompt: the text's tokens cycled to the depth (the text once at depth 0).
    const int64_t positions = std::max<int64_t>(n, static_cast<int64_t>(text_ids.size()));
    std::vector<int32_t> prompt(positions);
    for (int64_t i = 0; i < positions; ++i) prompt[i] = text_ids[i % text_ids.size()];
    for (const KvSpec& f : *formats) {
      const std::string spec_name = KvSpecName(f);
      Result<std::unique_ptr<Session>> base = model.NewSession({.key_format = spec_name, .value_format = spec_name});
      if (!base.ok()) return bad(fmt::format("--format {}: {}", spec_name, base.status().message()));
      fmt::print(stderr, "bench spec: context {}, {}: prefilling {} positions\n", n, spec_name, positions - 1);
      // In pieces of kPieceTokens (a multiple of kPrefillBlock, so the blocks are the ones a single
      // Prefill runs), a line after each: a 32K prefill takes minutes on a small machine.
      constexpr int64_t kPieceTokens = 64 * kPrefillBlock;
      const auto prefill_start = std::chrono::steady_clock::now();
      for (int64_t at = 0; at < positions - 1; at += kPieceTokens) {
        const int64_t piece = std::min(kPieceTokens, positions - 1 - at);
        if (Status s = (*base)->Prefill(std::span<const int32_t>(prompt).subspan(at, piece)); !s.ok()) {
          return bad(s.message());
        }
        if (piece < positions - 1) {
          const double seconds =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - prefill_start).count();
          fmt::print(stderr, "bench spec: context {}, {}: {} of {} positions prefilled ({:.0f} s)\n", n, spec_name,
                     at + piece, positions - 1, seconds);
        }
      }
      if (with_model && !o.pass_times) {
        // The draft model reads the prompt once here; every arm's Fork carries its session, so
        // no repetition runs the prompt through the draft model again.
        fmt::print(stderr, "bench spec: context {}, {}: the draft model reads the {} positions\n", n, spec_name,
                   positions - 1);
        const auto draft_start = std::chrono::steady_clock::now();
        if (Status s = (*base)->PrefillDraft(spec); !s.ok()) return bad(s.message());
        fmt::print(stderr, "bench spec: context {}, {}: the draft model read them in {:.0f} s\n", n, spec_name,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - draft_start).count());
      }
      if (o.pass_times) {
        std::vector<double> ms(o.spec.max_draft + 1);  // [b − 1]
        if (Status st = TimeVerifyPasses(**base, text_ids, o.reps, &ms); !st.ok()) return bad(st.message());
        fmt::print("verify pass: context {}, {} ({} threads, median of {})\n{:>7} {:>10} {:>12}\n", n, spec_name,
                   model.info().threads, o.reps, "tokens", "ms", "ms / ms(1)");
        for (size_t b = 1; b <= ms.size(); ++b) {
          fmt::print("{:>7} {:>10.2f} {:>12.3f}\n", b, ms[b - 1], ms[0] > 0 ? ms[b - 1] / ms[0] : 0.0);
        }
        continue;
      }
      const size_t first = arms.size();
      for (const DraftSource s : sources) {
        arms.push_back({.context = n, .positions = positions, .format = spec_name, .source = s});
      }
      for (int32_t rep = 0; rep < o.reps; ++rep) {
        std::vector<int32_t> reference;
        for (size_t a = first; a < arms.size(); ++a) {
          Arm& arm = arms[a];
          Result<std::unique_ptr<Session>> fork = (*base)->Fork();
          if (!fork.ok()) return bad(fork.status().message());
          GenerateRequest request{.max_tokens = o.tokens, .sampling = {.temperature = 0}, .ignore_eos = true};
          request.speculation = spec;
          request.speculation.source = arm.source;
          Result<Completion> c = (*fork)->Generate(prompt, request);
          if (!c.ok()) return bad(c.status().message());
          if (arm.source == DraftSource::kNone) {
            reference = c->tokens;
          } else if (c->tokens != reference) {
            fmt::print(stderr, "bench spec: context {}, {}: {} drafts gave other tokens than decoding without "
                               "speculation (a bug: they must be the same)\n", n, spec_name,
                       DraftSourceName(arm.source));
            return 1;
          }
          const int64_t made = static_cast<int64_t>(c->tokens.size());
          arm.tokens_per_second.push_back(c->decode_seconds > 0 ? made / c->decode_seconds : 0);
          arm.generated += made;
          arm.stats.passes += c->speculation.passes;
          arm.stats.drafted += c->speculation.drafted;
          arm.stats.accepted += c->speculation.accepted;
          arm.stats.gated += c->speculation.gated;
        }
      }
    }
  }

  if (o.pass_times) return 0;
  auto speedup = [&](const Arm& a) {
    for (const Arm& r : arms) {
      if (r.context == a.context && r.format == a.format && r.source == DraftSource::kNone) {
        const double base = Median(r.tokens_per_second);
        return base > 0 ? Median(a.tokens_per_second) / base : 0.0;
      }
    }
    return 0.0;
  };
  auto ratio = [](int64_t a, int64_t b) { return b > 0 ? static_cast<double>(a) / static_cast<double>(b) : 0.0; };
  const std::string text_name = o.text_file.empty() ? "built-in code with repeated spans" : o.text_file;
  if (o.shared.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (const Arm& a : arms) {
      rows.push_back({{"context", a.context}, {"prompt_positions", a.positions}, {"format", a.format},
                      {"source", DraftSourceName(a.source)}, {"tokens_per_second", Median(a.tokens_per_second)},
                      {"tokens_per_second_each", a.tokens_per_second}, {"speedup", speedup(a)},
                      {"generated_tokens", a.generated}, {"passes", a.stats.passes},
                      {"tokens_per_pass", ratio(a.generated, a.stats.passes)}, {"drafted_tokens", a.stats.drafted},
                      {"accepted_tokens", a.stats.accepted}, {"acceptance", ratio(a.stats.accepted, a.stats.drafted)},
                      {"gated_passes", a.stats.gated}});
    }
    PrintJson({{"model", o.shared.ModelPath()}, {"text", text_name}, {"tokens", o.tokens}, {"reps", o.reps},
               {"threads", model.info().threads}, {"max_draft", o.spec.max_draft}, {"ungated", o.spec.ungated},
               {"same_tokens_as_without_speculation", true}, {"results", rows}});
    return 0;
  }
  fmt::print("spec: {} ({} threads), text: {}, {} greedy tokens per arm, {} rounds with arms interleaved, "
             "drafts up to {}{}\n", o.shared.ModelPath(), model.info().threads, text_name, o.tokens, o.reps,
             o.spec.max_draft, o.spec.ungated ? " (ungated)" : " (gated)");
  fmt::print("every arm gave the tokens of decoding without speculation\n\n");
  fmt::print("{:>8} {:<10} {:<7} {:>8} {:>8} {:>10} {:>10} {:>11} {:>7}\n", "context", "format", "drafts", "tok/s",
             "speedup", "tok/pass", "acceptance", "drafted", "gated");
  for (const Arm& a : arms) {
    fmt::print("{:>8} {:<10} {:<7} {:>8.2f} {:>7.3f}x {:>10.2f} {:>9.1f}% {:>11} {:>7}\n", a.context, a.format,
               DraftSourceName(a.source), Median(a.tokens_per_second), speedup(a), ratio(a.generated, a.stats.passes),
               100 * ratio(a.stats.accepted, a.stats.drafted), a.stats.drafted, a.stats.gated);
  }
  return 0;
}

}  // namespace

void AddBenchSpecCommand(CLI::App& bench, int* exit_code) {
  auto o = std::make_shared<BenchSpecOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "spec", "Speculative decoding: tok/s, tokens per pass and acceptance per draft source, KV format and context");
  AddModelFlag(cmd, &o->shared);
  AddRepackFlags(cmd, &o->shared);
  AddFormatListFlag(cmd, &o->shared, "--format,--formats", "KV formats, comma-separated");
  AddContextListFlag(cmd, &o->shared, "--context,--contexts",
                     "Prompt positions before decoding, comma-separated (the text cycled to each; at least the text)",
                     0, INT64_MAX);
  std::vector<std::string> names;
  for (const DraftSource s : DraftSources()) names.push_back(DraftSourceName(s));
  cmd->add_option("--spec", o->sources, "Draft sources to compare, comma-separated (default: all; none always runs)")
      ->delimiter(',')
      ->check(CLI::IsMember(names));
  cmd->add_option("--text", o->text_file, "Text FILE the prompt is made of (default: built-in code with repeated spans)")
      ->type_name("FILE");
  cmd->add_option("--tokens", o->tokens, "Greedy tokens each arm generates")->capture_default_str();
  cmd->add_option("--reps", o->reps, "Rounds; each arm's median tok/s is reported")->capture_default_str();
  cmd->add_option("--draft-max", o->spec.max_draft, "Drafted tokens per pass at most")->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--draft-ngram", o->spec.max_ngram, "Longest n-gram (or suffix) a draft matches")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  cmd->add_option("--draft-p-min", o->spec.min_draft_probability,
                  "Suffix drafts' least continuation probability; a draft model's least top-token probability")
      ->check(CLI::Range(1e-6, 1.0))
      ->capture_default_str();
  cmd->add_flag("--spec-ungated", o->spec.ungated, "Run every draft at --draft-max (no gate)");
  cmd->add_flag("--pass-times", o->pass_times,
                "Instead: time a verify pass of 1..draft-max+1 tokens at each context and format (--reps each)");
  AddDraftModelFlags(cmd, &o->draft);
  AddThreadsFlag(cmd, &o->shared);
  AddJsonFlag(cmd, &o->shared);
  cmd->callback([o, exit_code] { *exit_code = RunBenchSpec(*o); });
}

}  // namespace kvq::cli
