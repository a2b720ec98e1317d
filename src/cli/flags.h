// The flags several kvq commands share, each declared once: its names, help, validation and the
// field of SharedOptions it fills. A bad value is refused while the command line is parsed, before
// any model is loaded, as "kvq <command>: error: <flag>: <what was wrong> (got <value>)".
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvq/format.h"
#include "kvq/kv_cache.h"
#include "kvq/model.h"
#include "kvq/speculation.h"
#include "kvq/status.h"

namespace kvq {
struct RepackOptions;  // model/load_model.h
}  // namespace kvq

namespace kvq::cli {

/// The Jinja chat template in FILE (a --chat-template flag's value), read and parsed; the error
/// names `flag`, the file and what is wrong (unreadable, empty, or the construct kvq cannot run).
Result<std::string> ReadChatTemplateFile(const std::string& flag, const std::string& path);

/// The values of the shared flags. A command embeds one, with its own defaults set by designated
/// initializers (e.g. `SharedOptions shared{.threads = 1}`), and adds the flags it takes.
struct SharedOptions {
  int32_t threads = 2;
  std::string model;      // -m; empty: the bundled stories260K
  std::string hf_repo;    // -hf user/name[:quant]; ResolveModelFlag (hub_flag.h) turns it into model
  std::string tokenizer;  // --tokenizer; empty: LoadModel's default (the GGUF's vocabulary, ...)
  std::string kv = "f16", kv_k, kv_v;  // --kv, --kv-k, --kv-v
  std::string kv_plan;                 // --kv-plan FILE (excludes --kv, --kv-k, --kv-v)
  double kv_bits = 0;                  // --kv-bits: a plan's budget, or the most a --kv-plan may hold; 0: none
  KvBudgets budgets;                   // --kv-device-budget, --kv-host-budget, --kv-disk
  std::vector<std::string> formats;    // --format lists
  std::vector<int64_t> contexts;       // --context lists
  uint64_t seed = 1;
  bool json = false;
  Repack repack = Repack::kAuto;         // --repack
  int64_t repack_memory_available = 0;   // --repack-memory SIZE; 0: MemAvailable

  /// The options every command loads its model with: --tokenizer (TokenizerPath), -t, --repack and
  /// --repack-memory (a command sets its context and KV options on the result).
  ModelOptions LoadOptions() const;
  /// --repack and --repack-memory as LoadModel (model/load_model.h) takes them (defined beside
  /// `kvq bench decode`, among the commands that see the model layer).
  RepackOptions LoaderRepack() const;

  /// -m, or the bundled stories260K.bin.
  std::string ModelPath() const;
  /// --tokenizer; with neither -m nor --tokenizer the bundled tok512.bin; else "" (LoadModel's
  /// default: the GGUF's vocabulary, or tok512.bin beside a llama2.c checkpoint).
  std::string TokenizerPath() const;
  /// The K and V specs of --kv / --kv-k / --kv-v; the error names the flag.
  Result<LayerFormats> KvLayer() const;
  /// "f16", "int4+rot", or "int8/int4" when K and V differ (canonical spec text); with --kv-plan,
  /// "plan FILE".
  std::string KvFormatName() const;
  /// The cache's specs per layer: --kv-plan's layers (read and checked against the model's
  /// fingerprint, kvq::Model::fingerprint(), and against --kv-bits when given), else KvLayer()
  /// for every layer (one entry). Errors name the flag and the file.
  Result<std::vector<LayerFormats>> KvLayers(const ModelFingerprint& fingerprint) const;
  /// The specs of the --format list, in the order given; the error names the flag.
  Result<std::vector<KvSpec>> FormatList() const;
  /// FormatList for a command that takes formats without transforms; a spec with one is an error.
  Result<std::vector<const FormatDesc*>> PlainFormatList() const;
};

/// A validator: an integer in lo..hi. Says "must be in lo..hi (got x)", or "expected an integer".
CLI::Validator IntInRange(int64_t lo, int64_t hi);
/// A transform: a byte size as ParseByteSize reads it ("512MiB", "1.2GB") becomes its byte count,
/// so the option binds to an int64_t; a bad size says what ParseByteSize says.
CLI::Validator ByteSize();
/// A validator: a KV spec, FORMAT[+TRANSFORM...] (ParseKvSpec's error lists what is known).
CLI::Validator KvFormatName();
/// A validator for a file the command will write: its folder exists and is writable, so a bad
/// path is refused before any work, not after it ("the folder 'd' does not exist").
CLI::Validator OutputFilePath();

/// -t,--threads into o->threads: 1..1024 (the default shown is the value there now).
CLI::Option* AddThreadsFlag(CLI::App* cmd, SharedOptions* o, const std::string& help = "Threads");
/// -t,--threads where 0, the default, means every core (kvq synth): 0..1024.
CLI::Option* AddThreadsOrAllCoresFlag(CLI::App* cmd, SharedOptions* o, const std::string& help);
/// -m,--model into o->model (help: a GGUF or llama2.c model, default the bundled stories260K).
CLI::Option* AddModelFlag(CLI::App* cmd, SharedOptions* o, const std::string& help = "");
/// --tokenizer into o->tokenizer.
CLI::Option* AddTokenizerFlag(CLI::App* cmd, SharedOptions* o);
/// --kv, --kv-k and --kv-v (format names, checked against the registry).
void AddKvFormatFlags(CLI::App* cmd, SharedOptions* o);
/// --kv-plan FILE (a plan file from `kvq plan --auto`; excludes --kv, --kv-k and --kv-v, so add
/// it after AddKvFormatFlags) and --kv-bits B, the most bits per number the plan may hold.
void AddKvPlanFlags(CLI::App* cmd, SharedOptions* o);
/// --kv-bits B into o->kv_bits (a positive number of bits per number), with the command's help.
CLI::Option* AddKvBitsFlag(CLI::App* cmd, SharedOptions* o, const std::string& help);
/// --kv-device-budget, --kv-host-budget (byte sizes) and --kv-disk into o->budgets; help_prefix
/// goes in front of each help text ("Plan tiers: " in kvq plan).
void AddBudgetFlags(CLI::App* cmd, SharedOptions* o, const std::string& help_prefix = "");
/// A comma-separated list of KV format names (names: "--format", or with aliases) into
/// o->formats, each checked against the registry; a non-empty default is shown.
CLI::Option* AddFormatListFlag(CLI::App* cmd, SharedOptions* o, const std::string& names,
                               const std::string& help);
/// A comma-separated list of context lengths, each in min..max, into o->contexts; a non-empty
/// default is shown.
CLI::Option* AddContextListFlag(CLI::App* cmd, SharedOptions* o, const std::string& names,
                                const std::string& help, int64_t min, int64_t max);
/// --repack auto|all|none and --repack-memory SIZE into o->repack and o->repack_memory_available:
/// which weight matrices are repacked at load (kvq::Repack); every command that loads a model takes them.
/// Returns both options.
std::vector<CLI::Option*> AddRepackFlags(CLI::App* cmd, SharedOptions* o);
/// --seed into o->seed (any 64-bit unsigned integer). kvq run's default is a random seed, so the
/// callers that have a fixed default show it (->capture_default_str()).
CLI::Option* AddSeedFlag(CLI::App* cmd, SharedOptions* o, const std::string& help);
/// --json into o->json.
CLI::Option* AddJsonFlag(CLI::App* cmd, SharedOptions* o,
                         const std::string& help = "Print JSON instead of a table");
/// --head-dim into *head_dim: numbers per head row, 1..kMaxHeadDim.
CLI::Option* AddHeadDimFlag(CLI::App* cmd, int64_t* head_dim);
/// A byte-size flag (e.g. --weight-bytes 566MB) into *bytes; 0 stays when it is not given (a
/// byte size is never 0).
CLI::Option* AddByteSizeFlag(CLI::App* cmd, const std::string& names, int64_t* bytes,
                             const std::string& help);

/// --score-arithmetic int|f32: how scores against int8/int4 keys are computed (kvq/format.h
/// ScoreArithmetic; default int). Process-wide: applied with SetScoreArithmetic as it is parsed.
CLI::Option* AddScoreArithmeticFlag(CLI::App* cmd);
/// The draft model flags: --draft-model FILE (-md, as llama.cpp spells it) and --draft-kv SPEC.
struct DraftModelFlags {
  std::string path;         // --draft-model; empty: none
  std::string kv = "f16";   // --draft-kv: the draft session's K and V spec
};
/// --draft-model/-md FILE and --draft-kv SPEC into `draft`.
void AddDraftModelFlags(CLI::App* cmd, DraftModelFlags* draft);
/// --spec none|ngram|suffix|draft, --draft-max N, --draft-ngram N, --draft-p-min P, --spec-ungated
/// and the draft model flags: speculative decoding (kvq/speculation.h) into `spec` and `draft`.
void AddSpeculationFlags(CLI::App* cmd, SpeculationOptions* spec, DraftModelFlags* draft);
/// Loads --draft-model for `target` when `spec` asks for one (or --draft-model is given with no
/// other --spec: it means --spec draft), checks its vocabulary against the target's and points
/// spec->draft_model at it (null when no draft model is used). Errors name the flag or the files.
Result<std::unique_ptr<Model>> LoadDraftModel(const DraftModelFlags& draft, const Model& target, int32_t threads,
                                              SpeculationOptions* spec);

/// "int (AVX-512 VNNI)" / "f32": the choice in force and, for int, the integer path here (defined
/// beside `kvq bench attention`: it reads the formats layer's integer path).
std::string ScoreArithmeticLabel();

}  // namespace kvq::cli
