// What `kvq run` and `kvq chat` share: their generation flags (model, sampling, context, KV cache),
// declared once here, the model and session those flags describe, and the Ctrl-C handling that
// stops a reply without ending the program.
#pragma once

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include "cli/flags.h"
#include "kvq/model.h"
#include "kvq/session.h"

namespace kvq::cli {

struct GenerateFlags {
  SharedOptions shared;  // -m, --tokenizer, --kv*, budgets, --seed, -t, --json
  int32_t n = 256;       // -n: new tokens at most (per reply in kvq chat); < 0: until an end token
  float temp = 0.8f;
  int32_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;     // --repeat-penalty (1 = off)
  float frequency_penalty = 0.0f;  // --frequency-penalty
  float presence_penalty = 0.0f;   // --presence-penalty
  int32_t repeat_last_n = 64;      // --repeat-last-n: the penalties' window (0 off, -1 all)
  std::vector<std::string> logit_bias;  // -l/--logit-bias (repeatable): ID(+/-)BIAS or ID:BIAS
  int64_t context = 0;              // -c; 0: the model's
  bool quiet = false;               // -q: no banner, no prompt progress
  SpeculationOptions speculation;   // --spec, --draft-max, --draft-ngram, --spec-ungated
  DraftModelFlags draft;            // --draft-model, --draft-kv
  std::string grammar, grammar_file, json_schema, json_schema_file;  // at most one given
  std::vector<std::string> stop;    // --stop (repeatable): the reply ends before the first of these
  const CLI::Option* seed = nullptr;  // --seed, to tell a given seed from the default

  /// The sampling flags as the API takes them; without --seed, a random seed. After Check().
  SamplerOptions Sampling() const;
  /// The sampling flags' ranges; the error names the flag ("--top-p must be in (0, 1] (got 2)").
  Status Check() const;
  /// --logit-bias's ids against the loaded model's vocabulary; the error names the flag, the value
  /// and the vocabulary size.
  Status CheckLogitBias(int32_t vocab_size) const;
  /// The GBNF that --grammar, --grammar-file, --json-schema or --json-schema-file give ("" for
  /// none), checked; errors name the flag.
  Result<std::string> Grammar() const;
};

/// -m, -hf, --tokenizer, -n, --stop, --temp, --top-k, --top-p, --min-p, --seed, -c, the KV flags
/// (--kv*, --kv-plan, --kv-bits, --score-arithmetic, the budgets), -t, the penalty and --logit-bias
/// flags, the speculative-decoding flags and the grammar flags. A command calls ResolveModelFlag
/// (cli/hub_flag.h) before it loads -hf's model.
void AddGenerateFlags(CLI::App* cmd, GenerateFlags* o);

/// A loaded model and one session of it with the flags' KV cache and context.
struct ModelSession {
  std::unique_ptr<Model> model;
  std::unique_ptr<Session> session;
  std::unique_ptr<Model> draft_model;  // --draft-model; null without
  SpeculationOptions speculation;      // the flags' options, draft_model pointing at draft_model
};
/// Loads -m (and --draft-model) and makes the session; the error names the file or flag at fault.
Result<ModelSession> LoadModelSession(const GenerateFlags& o);

/// Set by the first Ctrl-C while an InterruptScope is alive (a session's abort callback reads it:
/// the prompt stops within a block, generation before the next token); a second Ctrl-C, while
/// the first is being honoured, exits at once.
extern std::atomic<bool> g_interrupted;

/// Installs the Ctrl-C handler above for its lifetime and clears g_interrupted; the previous
/// handler is restored after (so Ctrl-C at kvq chat's input prompt still ends the program).
class InterruptScope {
 public:
  InterruptScope();
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

 private:
  struct sigaction previous_ {};
};

}  // namespace kvq::cli
