// The shared flags of the kvq commands (flags.h): one declaration, one validator and one error
// message per flag, used by every command that takes it.
#include "cli/flags.h"

#include <fmt/core.h>

#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <charconv>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "kvq/model.h"
#include "kvq/units.h"
#include "plan/kv_plan.h"

namespace kvq::cli {

std::string SharedOptions::ModelPath() const {
  return model.empty() ? BundledModelFile("stories260K.bin") : model;
}

std::string SharedOptions::TokenizerPath() const {
  return tokenizer.empty() && model.empty() ? BundledModelFile("tok512.bin") : tokenizer;
}

ModelOptions SharedOptions::LoadOptions() const {
  return {.tokenizer_path = TokenizerPath(), .threads = threads, .repack = repack,
          .repack_memory_available = repack_memory_available};
}

Result<LayerFormats> SharedOptions::KvLayer() const {
  const Result<KvSpec> k = ParseKvSpec(kv_k.empty() ? kv : kv_k);
  if (!k.ok()) return Status::Error((kv_k.empty() ? "--kv: " : "--kv-k: ") + k.status().message());
  const Result<KvSpec> v = ParseKvSpec(kv_v.empty() ? kv : kv_v);
  if (!v.ok()) return Status::Error((kv_v.empty() ? "--kv: " : "--kv-v: ") + v.status().message());
  // "prerope" is a key transform: --kv gives it to K alone; --kv-v refuses it.
  KvSpec value = *v;
  if (value.transforms.pre_rope) {
    if (!kv_v.empty()) {
      return Status::Error(fmt::format("--kv-v {}: prerope is a key transform (RoPE rotates keys, "
                                       "never values); give it with --kv-k or --kv", kv_v));
    }
    value.transforms.pre_rope = false;
  }
  return LayerFormats::Of(*k, value);
}

std::string SharedOptions::KvFormatName() const {
  if (!kv_plan.empty()) return "plan " + kv_plan;
  const Result<LayerFormats> layer = KvLayer();
  if (layer.ok()) return LayerFormatsName(*layer);
  const std::string& k = kv_k.empty() ? kv : kv_k;
  const std::string& v = kv_v.empty() ? kv : kv_v;
  return k == v ? k : k + "/" + v;
}

Result<std::vector<LayerFormats>> SharedOptions::KvLayers(const ModelFingerprint& fingerprint) const {
  if (kv_plan.empty()) {
    if (kv_bits > 0) return Status::Error("--kv-bits: needs --kv-plan (the plan whose bits it bounds)");
    Result<LayerFormats> layer = KvLayer();
    if (!layer.ok()) return layer.status();
    return std::vector<LayerFormats>{*layer};
  }
  Result<KvPlan> plan = ReadKvPlan(kv_plan, fingerprint);
  if (!plan.ok()) return Status::Error("--kv-plan " + plan.status().message());
  if (kv_bits > 0) {
    if (Status s = CheckKvPlanBits(*plan, kv_bits); !s.ok()) {
      return Status::Error(fmt::format("--kv-plan {}: {} (--kv-bits {:g})", kv_plan, s.message(), kv_bits));
    }
  }
  return std::move(plan.value().layers);
}

Result<std::vector<KvSpec>> SharedOptions::FormatList() const {
  std::vector<KvSpec> list;
  for (const std::string& name : formats) {
    const Result<KvSpec> f = ParseKvSpec(name);
    if (!f.ok()) return Status::Error("--format: " + f.status().message());
    list.push_back(*f);
  }
  return list;
}

Result<std::vector<const FormatDesc*>> SharedOptions::PlainFormatList() const {
  Result<std::vector<KvSpec>> specs = FormatList();
  if (!specs.ok()) return specs.status();
  std::vector<const FormatDesc*> list;
  for (const KvSpec& s : *specs) {
    if (s.transforms.any()) {
      return Status::Error(fmt::format("--format {}: this command measures formats without "
                                       "transforms; give {}", KvSpecName(s), s.format->name));
    }
    list.push_back(s.format);
  }
  return list;
}

CLI::Validator IntInRange(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        int64_t n = 0;
        const char* end = text.data() + text.size();
        const auto [at, ec] = std::from_chars(text.data(), end, n);
        if (ec == std::errc::result_out_of_range ||
            (ec == std::errc() && at == end && (n < lo || n > hi))) {
          return hi == INT64_MAX ? fmt::format("must be at least {} (got {})", lo, text)
                                 : fmt::format("must be in {}..{} (got {})", lo, hi, text);
        }
        if (ec != std::errc() || at != end)
          return fmt::format("expected an integer (got '{}')", text);
        return "";
      },
      hi == INT64_MAX ? fmt::format(">= {}", lo) : fmt::format("{}..{}", lo, hi));
}

CLI::Validator ByteSize() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const Result<int64_t> bytes = ParseByteSize(text);
        if (!bytes.ok()) return bytes.status().message();
        text = std::to_string(*bytes);
        return "";
      },
      "");
}

CLI::Validator OutputFilePath() {
  return CLI::Validator(
      [](std::string& path) -> std::string {
        if (path.empty()) return "";
        std::error_code ec;
        if (std::filesystem::is_directory(path, ec)) return fmt::format("'{}' is a folder; give a file name", path);
        const std::filesystem::path parent = std::filesystem::path(path).parent_path();
        if (!parent.empty() && !std::filesystem::is_directory(parent, ec)) {
          return fmt::format("the folder '{}' does not exist", parent.string());
        }
        if (::access(parent.empty() ? "." : parent.c_str(), W_OK) != 0) {
          return fmt::format("the folder '{}' is not writable", parent.empty() ? "." : parent.string());
        }
        return "";
      },
      "");
}

CLI::Validator KvFormatName() {
  return CLI::Validator(
      [](std::string& name) -> std::string {
        const Result<KvSpec> f = ParseKvSpec(name);
        return f.ok() ? "" : f.status().message();
      },
      "");
}

namespace {
constexpr int64_t kMaxThreads = 1024;
}  // namespace

CLI::Option* AddThreadsFlag(CLI::App* cmd, SharedOptions* o, const std::string& help) {
  return cmd->add_option("-t,--threads", o->threads, help)
      ->check(IntInRange(1, kMaxThreads))
      ->capture_default_str();
}

CLI::Option* AddThreadsOrAllCoresFlag(CLI::App* cmd, SharedOptions* o, const std::string& help) {
  return cmd->add_option("-t,--threads", o->threads, help)->check(IntInRange(0, kMaxThreads));
}

CLI::Option* AddModelFlag(CLI::App* cmd, SharedOptions* o, const std::string& help) {
  return cmd->add_option("-m,--model", o->model,
                         help.empty() ? "GGUF (.gguf) or llama2.c checkpoint (.bin); default: the "
                                        "bundled stories260K (models/stories260K)"
                                      : help)
      ->type_name("FILE");
}

CLI::Option* AddTokenizerFlag(CLI::App* cmd, SharedOptions* o) {
  return cmd->add_option(
      "--tokenizer", o->tokenizer,
      "llama2.c tokenizer file (default: the GGUF's vocabulary, or tok512.bin beside a .bin)")
      ->type_name("FILE");
}

std::vector<CLI::Option*> AddRepackFlags(CLI::App* cmd, SharedOptions* o) {
  CLI::Option* repack = cmd->add_option_function<std::string>(
         "--repack", [o](const std::string& v) { o->repack = *ParseRepack(v); },
         "Weights repacked at load for the fast kernels (the file is unchanged). auto: the dense matrices, "
         "and a mixture-of-experts model's experts only when their copy fits in available memory "
         "(MemAvailable less 1 GiB + 10% headroom; else they stay mapped from the file, resident only when a "
         "token routes to them, and one line says so); all: the experts too, whatever the memory (every "
         "expert resident); none: nothing (the slower row kernels)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            const Result<Repack> r = ParseRepack(v);
            return r.ok() ? "" : r.status().message();
          },
          "auto|all|none"))
      ->type_name("MODE")
      ->default_str("auto");
  return {repack, AddByteSizeFlag(cmd, "--repack-memory", &o->repack_memory_available,
                                  "--repack auto: the memory to count as available instead of /proc/meminfo's "
                                  "MemAvailable (e.g. 12GiB)")};
}

void AddKvFormatFlags(CLI::App* cmd, SharedOptions* o) {
  cmd->add_option("--kv", o->kv,
                  "KV cache spec for K and V: FORMAT[+rot][+sinkN][+resN][+prerope] (see kvq formats; "
                  "prerope goes to K only)")
      ->check(KvFormatName())
      ->type_name("SPEC")
      ->capture_default_str();
  cmd->add_option("--kv-k", o->kv_k, "KV spec for keys (overrides --kv)")->check(KvFormatName())->type_name("SPEC");
  cmd->add_option("--kv-v", o->kv_v, "KV spec for values (overrides --kv)")
      ->check(KvFormatName())
      ->type_name("SPEC");
}

void AddKvPlanFlags(CLI::App* cmd, SharedOptions* o) {
  CLI::Option* plan = cmd->add_option("--kv-plan", o->kv_plan,
                                      "KV specs per layer from a plan file (kvq plan --auto -o FILE); "
                                      "refused for another model")
                          ->type_name("FILE");
  for (const char* name : {"--kv", "--kv-k", "--kv-v"}) {
    if (CLI::Option* kv = cmd->get_option_no_throw(name); kv != nullptr) plan->excludes(kv);
  }
  AddKvBitsFlag(cmd, o, "Refuse a --kv-plan holding more than B bits per number (recounted at the plan's length)");
}

CLI::Option* AddKvBitsFlag(CLI::App* cmd, SharedOptions* o, const std::string& help) {
  return cmd->add_option("--kv-bits", o->kv_bits, help)
      ->type_name("B")
      ->check(CLI::PositiveNumber);
}

void AddBudgetFlags(CLI::App* cmd, SharedOptions* o, const std::string& help_prefix) {
  auto help = [&](std::string text) {
    if (!help_prefix.empty()) text[0] = static_cast<char>(std::tolower(text[0]));
    return help_prefix + text;
  };
  AddByteSizeFlag(cmd, "--kv-device-budget", &o->budgets.device_bytes,
                  help("Device working-set budget (e.g. 256MiB)"));
  AddByteSizeFlag(cmd, "--kv-host-budget", &o->budgets.host_bytes,
                  help("Host RAM budget for the KV master copy"));
  cmd->add_option("--kv-disk", o->budgets.disk_dir,
                  help("Keep the KV master copy in a file in DIR"))
      ->type_name("DIR");
}

CLI::Option* AddFormatListFlag(CLI::App* cmd, SharedOptions* o, const std::string& names,
                               const std::string& help) {
  CLI::Option* opt =
      cmd->add_option(names, o->formats, help)->delimiter(',')->check(KvFormatName())->type_name("SPEC,...");
  if (!o->formats.empty()) opt->capture_default_str();
  return opt;
}

CLI::Option* AddContextListFlag(CLI::App* cmd, SharedOptions* o, const std::string& names,
                                const std::string& help, int64_t min, int64_t max) {
  CLI::Option* opt =
      cmd->add_option(names, o->contexts, help)->delimiter(',')->check(IntInRange(min, max));
  if (!o->contexts.empty()) opt->capture_default_str();
  return opt;
}

CLI::Option* AddSeedFlag(CLI::App* cmd, SharedOptions* o, const std::string& help) {
  return cmd->add_option("-s,--seed", o->seed, help);  // -s: llama.cpp's short name
}

CLI::Option* AddJsonFlag(CLI::App* cmd, SharedOptions* o, const std::string& help) {
  return cmd->add_flag("--json", o->json, help);
}

CLI::Option* AddHeadDimFlag(CLI::App* cmd, int64_t* head_dim) {
  CLI::Option* opt = cmd->add_option("--head-dim", *head_dim, "Numbers per head row")
                         ->check(IntInRange(1, kMaxHeadDim));
  if (*head_dim != 0) opt->capture_default_str();
  return opt;
}

CLI::Option* AddByteSizeFlag(CLI::App* cmd, const std::string& names, int64_t* bytes,
                             const std::string& help) {
  return cmd->add_option(names, *bytes, help)->transform(ByteSize())->type_name("SIZE");
}

CLI::Option* AddScoreArithmeticFlag(CLI::App* cmd) {
  return cmd
      ->add_option_function<std::string>(
          "--score-arithmetic",
          [](const std::string& v) {
            SetScoreArithmetic(v == "f32" ? ScoreArithmetic::kF32 : ScoreArithmetic::kInteger);
          },
          "Scores against int8/int4 keys: int (query quantised to int8 per head, integer dot "
          "products) or f32 (dequantised keys, f32 FMAs)")
      ->check(CLI::IsMember({"int", "f32"}))
      ->default_str("int");
}

void AddDraftModelFlags(CLI::App* cmd, DraftModelFlags* draft) {
  cmd->add_option("--draft-model", draft->path,
                  "(also -md) Draft model FILE for --spec draft: a smaller model with the same vocabulary that "
                  "drafts greedily (given alone, it means --spec draft)")
      ->type_name("FILE");
  cmd->add_option("--draft-kv", draft->kv, "KV spec of the draft model's cache (K and V)")
      ->check(KvFormatName())
      ->type_name("SPEC")
      ->capture_default_str();
}

Result<std::unique_ptr<Model>> LoadDraftModel(const DraftModelFlags& draft, const Model& target, int32_t threads,
                                              SpeculationOptions* spec) {
  spec->draft_model = nullptr;
  if (!draft.path.empty() && spec->source == DraftSource::kNone) spec->source = DraftSource::kModel;
  if (spec->source != DraftSource::kModel) {
    if (!draft.path.empty()) {
      return Status::Error(fmt::format("--draft-model {}: drafts come from --spec {}, not a draft model (drop one of "
                                       "the two, or give --spec draft)", draft.path, DraftSourceName(spec->source)));
    }
    return std::unique_ptr<Model>();
  }
  if (draft.path.empty()) return Status::Error("--spec draft needs a draft model: --draft-model FILE");
  Result<std::unique_ptr<Model>> loaded = Model::Load(draft.path, {.threads = threads});
  if (!loaded.ok()) return Status::Error("--draft-model: " + loaded.status().message());
  if (Status st = CheckDraftVocabulary(target, **loaded); !st.ok()) return Status::Error("--draft-model: " + st.message());
  spec->draft_model = loaded->get();
  spec->draft_kv.key_format = draft.kv;
  spec->draft_kv.value_format = draft.kv;
  return loaded;
}

void AddSpeculationFlags(CLI::App* cmd, SpeculationOptions* spec, DraftModelFlags* draft) {
  std::vector<std::string> sources;
  for (const DraftSource s : DraftSources()) sources.push_back(DraftSourceName(s));
  cmd->add_option_function<std::string>(
         "--spec", [spec](const std::string& v) { spec->source = *ParseDraftSource(v); },
         "Speculative decoding: draft tokens cheaply and check them in one pass; the output is the same, "
         "token for token. ngram: what followed the text's last n-gram earlier (prompt lookup); suffix: "
         "the most frequent continuation of the text's longest suffix seen before, while it stays likely; "
         "draft: a smaller model's greedy continuation (--draft-model)")
      ->check(CLI::IsMember(sources))
      ->default_str("none");
  cmd->add_option("--draft-max", spec->max_draft, "Drafted tokens per pass at most")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--draft-ngram", spec->max_ngram, "Longest n-gram (or suffix) a draft matches (tries longer first)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  cmd->add_option("--draft-p-min", spec->min_draft_probability,
                  "Suffix drafts go on while their tokens' product of observed continuation shares stays at least "
                  "this; a draft model's while its most likely token's probability does")
      ->check(CLI::Range(1e-6, 1.0))
      ->capture_default_str();
  cmd->add_flag("--spec-ungated", spec->ungated,
                "Run every draft at --draft-max (no gate choosing the length from measured acceptance and pass times)");
  AddDraftModelFlags(cmd, draft);
}

Result<std::string> ReadChatTemplateFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(fmt::format("{} {}: cannot read the file", flag, path));
  std::stringstream source;
  source << in.rdbuf();
  if (source.str().empty()) return Status::Error(fmt::format("{} {}: the file is empty", flag, path));
  if (Status s = Model::CheckChatTemplate(source.str()); !s.ok()) {
    return Status::Error(fmt::format("{} {}: {}", flag, path, s.message()));
  }
  return source.str();
}

}  // namespace kvq::cli
