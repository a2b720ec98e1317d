// `kvq synth`: write a GGUF model at a real model's shape (a preset, or flags) with random
// weights, for speed work where real weights cannot be downloaded. The logic is
// synth/synth.{h,cc}; this file maps flags onto a SynthSpec, prints what will be written, and
// shows progress per layer on stderr.
#include <fmt/format.h>

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "cli/commands.h"
#include "cli/flags.h"
#include "kvq/units.h"
#include "synth/synth.h"

namespace kvq::cli {
namespace {

struct SynthOptions {
  std::string preset;
  std::string arch;
  int64_t dim = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, context = 0, vocab_size = 0;
  float rope_theta = 0.0f;
  std::string embeddings;
  std::string type = "q4_0";
  std::string vocab;
  std::string layer_output_scale;  // FROM:SCALE, empty: none
  SharedOptions shared{.threads = 0};  // -t (0: every core), --seed
  std::string out;
  bool force = false;
  // The options whose presence matters (a given value overrides the preset's).
  CLI::Option *dim_opt = nullptr, *layers_opt = nullptr, *heads_opt = nullptr,
              *kv_heads_opt = nullptr, *head_dim_opt = nullptr, *ffn_opt = nullptr, *context_opt = nullptr,
              *theta_opt = nullptr, *vocab_size_opt = nullptr, *type_opt = nullptr;
};

std::string Shape(const SynthSummary& s) {
  const SynthSpec& p = s.spec;
  std::string text = fmt::format(
      "  {} ({}), {} weights, seed {}\n"
      "  dim {}, {} layers, {} heads / {} KV heads (head_dim {}), ffn {}, context {}\n"
      "  vocab {} ({} from the vocabulary{}), {} embeddings{}\n"
      "  rope theta {}, rms eps {}",
      p.name.empty() ? "custom shape" : p.name, SynthArchName(p.arch), p.type,
      p.seed, p.dim, p.n_layers, p.n_heads, p.kv_heads(), p.head_dim(), p.hidden_dim,
      FormatCount(p.context), FormatCount(p.vocab_size), FormatCount(s.vocabulary_tokens),
      p.vocab_size > s.vocabulary_tokens
          ? fmt::format(" + {} control tokens", FormatCount(p.vocab_size - s.vocabulary_tokens))
          : "",
      p.embeddings == SynthEmbeddings::kTied ? "tied" : "separate",
      p.qkv_bias ? ", Q/K/V biases" : "", p.rope_theta, p.norm_eps);
  if (p.rope_scaling) {
    text += fmt::format(", Llama 3.1 rope scaling (factor {}, low {}, high {}, original context {})",
                        p.rope_scaling->factor, p.rope_scaling->low_freq_factor,
                        p.rope_scaling->high_freq_factor, p.rope_scaling->original_context);
  }
  if (p.layer_output_scale) {
    text += fmt::format("\n  output projections of layers {}.. scaled by {} (the --layers {} file is a draft that "
                        "agrees with it)", p.layer_output_scale->from_layer, p.layer_output_scale->scale,
                        p.layer_output_scale->from_layer);
  }
  return text;
}

// SIGINT or SIGTERM while the model is written: GgufWriter::Write's temporary file beside the
// output ("OUT.gguf.tmp-PID-N") is removed and the program exits 128 + the signal, so an
// interrupted run leaves no partial file. The handler only writes the signal's number to a pipe
// (what a handler may safely do, whichever thread the signal lands on); a thread reading the pipe
// removes the file and exits.
int g_signal_pipe[2] = {-1, -1};

void ForwardSignal(int sig) {
  const unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t n = write(g_signal_pipe[1], &byte, 1);
}

class RemoveTemporaryOnSignal {
 public:
  explicit RemoveTemporaryOnSignal(std::string out) : out_(std::move(out)) {
    if (pipe(g_signal_pipe) != 0) return;  // no pipe: signals keep their default action
    thread_ = std::thread([this] {
      unsigned char sig = 0;
      if (read(g_signal_pipe[0], &sig, 1) != 1 || sig == 0) return;  // 0: the destructor's "done"
      Remove();
      fmt::print(stderr, "\nkvq synth: interrupted (signal {}); removed the partial {}\n", sig, out_);
      std::_Exit(128 + sig);
    });
    struct sigaction sa {};
    sa.sa_handler = ForwardSignal;
    for (const int sig : {SIGINT, SIGTERM}) sigaction(sig, &sa, &previous_[sig == SIGINT ? 0 : 1]);
  }
  ~RemoveTemporaryOnSignal() {
    if (!thread_.joinable()) return;
    sigaction(SIGINT, &previous_[0], nullptr);
    sigaction(SIGTERM, &previous_[1], nullptr);
    const unsigned char done = 0;
    [[maybe_unused]] const ssize_t n = write(g_signal_pipe[1], &done, 1);
    thread_.join();
    close(g_signal_pipe[0]);
    close(g_signal_pipe[1]);
  }
  RemoveTemporaryOnSignal(const RemoveTemporaryOnSignal&) = delete;
  RemoveTemporaryOnSignal& operator=(const RemoveTemporaryOnSignal&) = delete;

 private:
  // This process's temporary files of the output: OUT.tmp-PID-*.
  void Remove() const {
    namespace fs = std::filesystem;
    const fs::path out(out_);
    const std::string prefix = fmt::format("{}.tmp-{}-", out.filename().string(), ::getpid());
    std::error_code ec;
    const fs::path dir = out.has_parent_path() ? out.parent_path() : fs::path(".");
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
      if (e.path().filename().string().rfind(prefix, 0) == 0) fs::remove(e.path(), ec);
    }
  }
  std::string out_;
  struct sigaction previous_[2] {};
  std::thread thread_;
};

int RunSynth(const SynthOptions& o) {
  auto bad = [](const std::string& m) { return BadInput("synth", m); };
  if (o.out.empty()) return bad("-o OUT.gguf is required");
  if (std::filesystem::path(o.out).extension() != ".gguf") {
    // kvq run and the other commands tell GGUF from llama2.c files by this extension.
    return bad(fmt::format("-o {}: the name must end in .gguf", o.out));
  }
  SynthSpec spec;
  if (!o.preset.empty()) {
    Result<SynthSpec> p = SynthPreset(o.preset);
    if (!p.ok()) return bad("--preset: " + p.status().message());
    spec = *p;
  } else {
    for (const auto& [opt, flag] : {std::pair{o.dim_opt, "--dim"}, std::pair{o.layers_opt, "--layers"},
                                    std::pair{o.heads_opt, "--heads"}, std::pair{o.ffn_opt, "--ffn"}}) {
      if (opt->count() == 0) {
        return bad(fmt::format("{} is needed without --preset (give --preset {}, or all of --dim, "
                               "--layers, --heads and --ffn)", flag,
                               fmt::join(SynthPresetNames(), "|")));
      }
    }
  }
  if (!o.arch.empty()) {
    Result<SynthArch> a = ParseSynthArch(o.arch);
    if (!a.ok()) return bad("--arch: " + a.status().message());
    // The architecture brings its own conventions: qwen2 has Q/K/V biases and a smaller epsilon.
    if (*a != spec.arch || o.preset.empty()) SetSynthArch(&spec, *a);
  }
  const struct { CLI::Option* opt; int64_t value; int64_t* field; } ints[] = {
      {o.dim_opt, o.dim, &spec.dim},           {o.layers_opt, o.layers, &spec.n_layers},
      {o.heads_opt, o.heads, &spec.n_heads},   {o.kv_heads_opt, o.kv_heads, &spec.n_kv_heads},
      {o.head_dim_opt, o.head_dim, &spec.head_dim_override},
      {o.ffn_opt, o.ffn, &spec.hidden_dim},    {o.context_opt, o.context, &spec.context},
      {o.vocab_size_opt, o.vocab_size, &spec.vocab_size}};
  for (const auto& i : ints) {
    if (i.opt->count() > 0) *i.field = i.value;
  }
  // A head count without a KV head count is plain multi-head attention, as in llama.cpp.
  if (o.heads_opt->count() > 0 && o.kv_heads_opt->count() == 0) spec.n_kv_heads = 0;
  if (o.theta_opt->count() > 0) spec.rope_theta = o.rope_theta;
  if (!o.embeddings.empty()) {
    if (o.embeddings != "tied" && o.embeddings != "separate") {
      return bad(fmt::format("--embeddings must be tied or separate (got '{}')", o.embeddings));
    }
    spec.embeddings = o.embeddings == "tied" ? SynthEmbeddings::kTied : SynthEmbeddings::kSeparate;
  }
  // A preset brings its own type (bonsai: q1_0); --type overrides it, and is q4_0 without a preset.
  if (o.preset.empty() || o.type_opt->count() > 0) {
    Result<std::string> type = ParseSynthType(o.type);
    if (!type.ok()) return bad("--type: " + type.status().message());
    spec.type = *type;
  }
  if (!o.layer_output_scale.empty()) {
    Result<SynthLayerOutputScale> scale = ParseSynthLayerOutputScale(o.layer_output_scale);
    if (!scale.ok()) return bad(scale.status().message());
    spec.layer_output_scale = *scale;
  }
  spec.seed = o.shared.seed;
  spec.threads = o.shared.threads > 0 ? o.shared.threads
                               : static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  if (!o.preset.empty() && (o.dim_opt->count() || o.layers_opt->count() || o.heads_opt->count() ||
                            o.kv_heads_opt->count() || o.head_dim_opt->count() || o.ffn_opt->count())) {
    spec.name += "-custom";  // the shape is no longer the preset's
  }
  if (Status s = ValidateSynthSpec(spec); !s.ok()) return bad(s.message());
  std::error_code ec;
  if (std::filesystem::exists(o.out, ec) && !o.force) {
    return bad(fmt::format("-o {}: the file exists (pass --force to overwrite it)", o.out));
  }
  const std::filesystem::path parent = std::filesystem::path(o.out).parent_path();
  if (!parent.empty() && !std::filesystem::is_directory(parent, ec)) {
    return bad(fmt::format("-o {}: the folder '{}' does not exist", o.out, parent.string()));
  }
  if (::access(parent.empty() ? "." : parent.c_str(), W_OK) != 0) {
    return bad(fmt::format("-o {}: the folder '{}' is not writable: {}", o.out,
                           parent.empty() ? "." : parent.string(), std::strerror(errno)));
  }
  const std::string vocab = o.vocab.empty() ? BundledModelFile("stories260K.gguf") : o.vocab;
  Result<SynthSummary> summary = SummarizeSynthModel(spec, vocab);
  if (!summary.ok()) return bad(summary.status().message());
  fmt::print("kvq synth: writing {}\n{}\n  vocabulary from {}\n  {} parameters, file {} ({} bytes)\n",
             o.out, Shape(*summary), vocab, FormatCount(summary->parameters),
             FormatBytesIec(summary->file_bytes), FormatCount(summary->file_bytes));
  std::fflush(stdout);

  const RemoveTemporaryOnSignal cleanup(o.out);
  const auto start = std::chrono::steady_clock::now();
  const Status written = WriteSynthModel(spec, vocab, o.out, [&](const SynthProgress& p) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (p.bytes_written < p.file_bytes) {
      fmt::print(stderr, "  layer {}/{} written ({} of {}, {:.1f} s)\n", p.layers_written, p.n_layers,
                 FormatBytesIec(p.bytes_written), FormatBytesIec(p.file_bytes), s);
    }
  });
  if (!written.ok()) {
    fmt::print(stderr, "kvq synth: error: {}\n", written.message());
    return 1;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("wrote {}: {} in {:.1f} s with {} threads\n", o.out, FormatBytesIec(summary->file_bytes),
             seconds, spec.threads);
  return 0;
}

}  // namespace

void AddSynthCommand(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "synth", "Write a GGUF model at a real model's shape with random weights (for speed work)");
  auto o = std::make_shared<SynthOptions>();
  cmd->add_option("--preset", o->preset,
                  fmt::format("A published shape: {}", fmt::join(SynthPresetNames(), ", ")))
      ->type_name("NAME");
  cmd->add_option("--arch", o->arch,
                  fmt::format("One of {} (mistral is written as llama, as llama.cpp does; the hybrids take "
                              "their other sizes from the preset, or the defaults of Qwen3.5's Gated "
                              "DeltaNet); default llama or the preset's",
                              SynthArchNameList()))
      ->type_name("NAME");
  o->dim_opt = cmd->add_option("--dim", o->dim, "Embedding width");
  o->layers_opt = cmd->add_option("--layers", o->layers, "Transformer blocks");
  o->heads_opt = cmd->add_option("--heads", o->heads, "Attention heads (head_dim = dim / heads unless --head-dim)");
  o->kv_heads_opt = cmd->add_option("--kv-heads", o->kv_heads, "KV heads (default: --heads)");
  o->head_dim_opt = cmd->add_option("--head-dim", o->head_dim,
                                    "Numbers per head (default: dim / heads; written as attention.key_length)");
  o->ffn_opt = cmd->add_option("--ffn", o->ffn, "Feed-forward width");
  o->context_opt = cmd->add_option("--context", o->context, "Context length (default 4096)");
  o->theta_opt = cmd->add_option("--rope-theta", o->rope_theta, "RoPE base (default 10000)");
  o->vocab_size_opt = cmd->add_option(
      "--vocab-size", o->vocab_size,
      "Vocabulary size (default: the vocabulary's; larger pads it with control tokens)");
  cmd->add_option("--embeddings", o->embeddings,
                  "tied | separate output.weight (default: the preset's, else separate)")
      ->type_name("tied|separate");
  o->type_opt = cmd->add_option("--type", o->type,
                                fmt::format("Matrix type, one of {}, or a llama.cpp mix ({}; docs/weight-types.md); "
                                            "default q4_0 or the preset's", SynthTypeNameList(), TypeMixNameList()))
                    ->type_name("NAME");
  cmd->add_option("--vocab", o->vocab,
                  "GGUF file whose tokenizer.* metadata is copied, or a Hugging Face tokenizer.json "
                  "(byte-level BPE) written as llama.cpp's converter would (default: the bundled "
                  "stories260K.gguf, 512 tokens)")
      ->type_name("FILE");
  cmd->add_option("--layer-output-scale", o->layer_output_scale,
                  "Multiply the output projections (attn_output, ffn_down; a hybrid's ssm_out and expert down "
                  "projections) of layers FROM.. by SCALE >= 0, so they add SCALE x their usual contribution: "
                  "the same seed's --layers FROM file is then a draft model that agrees with this one (always, "
                  "bit for bit, at SCALE 0), at this file's speed")
      ->type_name("FROM:SCALE");
  AddSeedFlag(cmd, &o->shared, "Seed: the same seed writes the same bytes")->capture_default_str();
  AddThreadsOrAllCoresFlag(cmd, &o->shared, "Threads (default: all cores; never changes the bytes)");
  cmd->add_option("-o,--output", o->out, "Output .gguf file")->check(OutputFilePath())->type_name("FILE");
  cmd->add_flag("--force", o->force, "Overwrite an existing output file");
  cmd->callback([o, exit_code] { *exit_code = RunSynth(*o); });
}

}  // namespace kvq::cli
