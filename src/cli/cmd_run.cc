// `kvq run`: generate text with a model through the kvq cache, as a client of the public API
// (kvq::Model, Session::Generate). With no -m it runs the bundled stories260K (llama2.c files
// under models/). The prompt is -p TEXT, -f FILE, or stdin (-p -, or piped with no -p); -cnv and
// -i (as llama.cpp users type them) run `kvq chat` instead.
#include <fmt/core.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/cmd_chat.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/generate_flags.h"
#include "cli/hub_flag.h"
#include "cli/json_output.h"
#include "cli/run_report.h"
#include "kvq/kv_memory.h"
#include "kvq/model.h"
#include "kvq/session.h"
#include "kvq/units.h"

namespace kvq::cli {
namespace {

struct RunOptions {
  GenerateFlags gen;         // -m, sampling, -c, the KV flags, -t (shared with kvq chat)
  std::string prompt;        // -p; "-": stdin
  std::string prompt_file;   // -f
  std::string prompt_cache;  // --prompt-cache
  bool conversation = false; // -cnv / --conversation or -i / --interactive: run kvq chat
  std::string system_prompt; // -sys / --system-prompt, with -cnv
  std::string chat_template_file;
};

// Whether stdin is a pipe or a file (not a terminal, nor /dev/null or another device): then a
// run without -p reads its prompt there, as `echo text | kvq run` means.
bool StdinIsPipeOrFile() {
  struct stat st {};
  return fstat(STDIN_FILENO, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISREG(st.st_mode));
}

// The prompt: -f FILE, -p TEXT, -p - (stdin), or piped stdin when neither is given.
Result<std::string> PromptText(const RunOptions& o) {
  if (!o.prompt_file.empty()) {
    std::ifstream in(o.prompt_file, std::ios::binary);
    if (!in) return Status::Error(fmt::format("-f {}: cannot read the file", o.prompt_file));
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  if (o.prompt == "-" || (o.prompt.empty() && StdinIsPipeOrFile())) {
    std::stringstream text;
    text << std::cin.rdbuf();
    return text.str();
  }
  return o.prompt;
}

// Why the reply ended, for the last line of a run.
std::string StopText(FinishReason finish, int32_t max_tokens, int64_t context) {
  switch (finish) {
    case FinishReason::kStop: return "finish: stop (an end token or a stop string)";
    case FinishReason::kLength: return fmt::format("finish: length (-n {} tokens generated)", max_tokens);
    case FinishReason::kContext: return fmt::format("finish: context (all {} positions are full)", context);
    case FinishReason::kCancelled: return "finish: cancelled (Ctrl-C); the stats above are those so far";
  }
  return "";
}

int RunGenerate(const RunOptions& o, const std::string& prompt) {
  auto bad = [](const std::string& m) { return BadInput("run", m); };
  const SharedOptions& so = o.gen.shared;
  const std::string model_path = so.ModelPath();
  const Result<std::string> grammar = o.gen.Grammar();
  if (!grammar.ok()) return bad(grammar.status().message());
  Result<ModelSession> loaded = LoadModelSession(o.gen);
  if (!loaded.ok()) return bad(loaded.status().message());
  const Model& model = *loaded->model;
  const ModelInfo& info = model.info();
  Session& session = *loaded->session;
  if (!o.gen.quiet) fmt::print(stderr, "{}", ModelBanner("run", model, session, so.KvFormatName()));

  const std::vector<int32_t> prompt_ids = model.Tokenize(prompt);
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
  // The prompt is echoed once it has run: a long one's progress bar is drawn (and erased) first,
  // and a prompt the session refuses is never echoed.
  PromptProgress progress("run", isatty(STDERR_FILENO) != 0);
  bool echoed = false;
  const GenerateRequest request{
      .max_tokens = o.gen.n,
      .sampling = o.gen.Sampling(),
      .stop = o.gen.stop,
      .grammar = *grammar,
      .save_prefix = o.prompt_cache,
      .speculation = loaded->speculation,
      .on_prompt_progress = [&](int64_t held, int64_t total) {
        if (!o.gen.quiet) progress.Update(held, total);
        if (held < total) return;
        progress.Finish();
        if (!so.json && !echoed) fmt::print("{}", prompt);
        echoed = true;
      }};
  auto stream = [&](int32_t, const std::string& text) {
    if (!so.json) {
      fmt::print("{}", text);
      std::fflush(stdout);
    }
    return true;
  };
  session.SetAbortCallback([] { return g_interrupted.load(); });
  const InterruptScope interrupt_scope;
  Result<Completion> c = session.Generate(prompt_ids, request, stream);
  progress.Finish();
  if (!c.ok()) {
    fmt::print(stderr, "\nkvq run: error: {}\n", c.status().message());
    return 1;
  }
  // Tokens generated: every kept one, the last included (sampled but not run when -n, a stop
  // string or a full context ended the reply), so -n 10 says 10.
  const int64_t n_decoded = static_cast<int64_t>(c->tokens.size());
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
    nlohmann::json out = {{"prompt", prompt}, {"completion", c->text}, {"tokens", tokens},
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
      loaded->speculation.source == DraftSource::kNone
          ? ""
          : fmt::format(" in {} passes ({} drafted, {} kept)", spec.passes, spec.drafted, spec.accepted);
  // Prompt speed over the tokens computed: with a prompt cache, only those after the reused ones.
  const std::string reused = c->n_reused > 0 ? fmt::format(" ({} reused, {} computed)", c->n_reused, n_prompt_run) : "";
  fmt::print(stderr, "kvq run: prompt {} tokens{}{} at {:.1f} tok/s, decode {} tokens{} at {:.1f} tok/s; KV cache "
             "{} bytes ({}) in {}{}\nkvq run: {}\n", c->n_prompt, reused, prompt_cut, prompt_tps, n_decoded, drafts,
             decode_tps, FormatCount(kv_bytes), FormatBytesIec(kv_bytes), format_name, vs_f16,
             StopText(c->finish, o.gen.n, session.context()));
  return 0;
}

}  // namespace

void AddRunCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text with a model (default: the bundled stories260K)");
  AddGenerateFlags(cmd, &o->gen);
  cmd->add_option("-p,--prompt", o->prompt, "Prompt text; - reads stdin (as does a piped stdin without -p)");
  cmd->add_option("-f,--file", o->prompt_file, "Read the prompt from FILE")->type_name("FILE");
  cmd->add_option("--prompt-cache", o->prompt_cache,
                  "Save the cache after the prompt to FILE; reuse it when a later prompt starts with it")
      ->check(OutputFilePath())->type_name("FILE");
  CLI::Option* cnv = cmd->add_flag("-i,--interactive,--conversation", o->conversation,
                                   "Chat instead (kvq chat; also -cnv): the prompt (-p, -f) is the system message");
  CLI::Option* sys = cmd->add_option("--system-prompt", o->system_prompt, "With -cnv: the system message (also -sys)");
  CLI::Option* tpl = cmd->add_option("--chat-template", o->chat_template_file,
                                     "With -cnv: a Jinja chat template FILE instead of the model's")
                         ->type_name("FILE");
  sys->needs(cnv);
  tpl->needs(cnv);
  AddJsonFlag(cmd, &o->gen.shared, "Print one JSON document instead of streaming text (with -cnv: one per turn)");
  cmd->callback([o, exit_code] {
    if (*exit_code = ResolveModelFlag("run", &o->gen.shared); *exit_code != 0) return;
    if (!o->prompt_file.empty() && !o->prompt.empty()) {
      *exit_code = BadInput("run", "-p and -f both give the prompt; give one");
      return;
    }
    if (o->conversation) {
      if (!o->prompt_cache.empty()) {
        *exit_code = BadInput("run", "--prompt-cache does not apply to -cnv (the chat keeps its cache; /save FILE)");
        return;
      }
      // llama.cpp's conversation mode: -p (or -f) is the system message; the turns come from stdin.
      ChatFlags chat{.gen = o->gen, .system_prompt = o->system_prompt, .chat_template_file = o->chat_template_file,
                     .input_file = ""};
      if (chat.system_prompt.empty()) {
        if (!o->prompt_file.empty()) {
          Result<std::string> text = PromptText(*o);
          if (!text.ok()) {
            *exit_code = BadInput("run", text.status().message());
            return;
          }
          chat.system_prompt = *text;
        } else if (o->prompt != "-") {
          chat.system_prompt = o->prompt;
        }
      }
      *exit_code = RunChat(chat, "run");
      return;
    }
    Result<std::string> prompt = PromptText(*o);
    *exit_code = prompt.ok() ? RunGenerate(*o, *prompt) : BadInput("run", prompt.status().message());
  });
}

}  // namespace kvq::cli
