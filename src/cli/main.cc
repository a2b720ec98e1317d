// kvq command line: one binary, one subcommand per job (run, chat, formats, plan, bench, eval, synth,
// tokenize, serve, pull, list).
#include <fmt/core.h>

#include <cstring>
#include <filesystem>
#include <string_view>
#include <vector>

#include "cli/commands.h"
#include "kvq/model.h"

#ifndef KVQ_MODELS_DIR
#define KVQ_MODELS_DIR "models"
#endif

namespace kvq::cli {
std::string BundledModelFile(const std::string& file) {
  for (const std::string& dir : {std::string(KVQ_MODELS_DIR), std::string("models")}) {
    const std::string p = dir + "/stories260K/" + file;
    if (std::filesystem::exists(p)) return p;
  }
  return std::string(KVQ_MODELS_DIR) + "/stories260K/" + file;
}

int BadInput(const std::string& command, const std::string& message) {
  fmt::print(stderr, "kvq {}: error: {}\n", command, message);
  return kExitBadInput;
}
// llama.cpp's flags of several letters after one dash, accepted as llama.cpp users type them.
// CLI11 takes one letter after a single dash (it would read "-cnv" as "-c nv"), so they are
// rewritten to their long names before parsing. An argument right after a flag that takes text
// (-p, -sys) is that text, not a flag.
struct LlamaCppFlag {
  std::string_view llama_cpp;
  const char* kvq;
};
constexpr LlamaCppFlag kLlamaCppFlags[] = {
    {"-cnv", "--conversation"}, {"-sys", "--system-prompt"}, {"-hf", "--hf-repo"}, {"-np", "--parallel"},
    {"-md", "--draft-model"}};

std::vector<const char*> RewriteLlamaCppFlags(int argc, char** argv) {
  std::vector<const char*> args(argv, argv + argc);
  for (int i = 2; i < argc; ++i) {
    const std::string_view previous = args[i - 1];
    if (previous == "-p" || previous == "--prompt" || previous == "--system-prompt") continue;
    for (const LlamaCppFlag& f : kLlamaCppFlags) {
      if (args[i] == f.llama_cpp) args[i] = f.kvq;
    }
  }
  return args;
}
}  // namespace kvq::cli

int main(int argc, char** argv) {
  CLI::App app{"kvq: a KV-cache-first LLM inference runtime. The KV cache is the wall: kvq stores\n"
               "it in compact number formats and measures what each one saves and costs."};
  app.set_version_flag("--version", std::string("kvq ") + kvq::Version());
  app.require_subcommand(1);
  // Parse errors (a flag's validator among them) read like the commands' own: the command path,
  // then what was wrong, e.g. "kvq run: error: --threads: must be in 1..1024 (got 0)".
  app.failure_message([](const CLI::App* top, const CLI::Error& e) {
    std::string path = "kvq";
    for (const CLI::App* a = top; !a->get_subcommands().empty();) {
      a = a->get_subcommands().front();
      path += " " + a->get_name();
    }
    return fmt::format("{}: error: {}\nRun `{} --help` for more information.\n", path, e.what(), path);
  });
  int exit_code = 0;
  kvq::cli::AddRunCommand(app, &exit_code);
  kvq::cli::AddChatCommand(app, &exit_code);
  kvq::cli::AddFormatsCommand(app, &exit_code);
  kvq::cli::AddPlanCommand(app, &exit_code);
  kvq::cli::AddBenchCommand(app, &exit_code);
  kvq::cli::AddEvalCommand(app, &exit_code);
  kvq::cli::AddSynthCommand(app, &exit_code);
  kvq::cli::AddTokenizeCommand(app, &exit_code);
  kvq::cli::AddServeCommand(app, &exit_code);
  kvq::cli::AddPullCommand(app, &exit_code);
  std::string known;
  bool found = false;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    known += (known.empty() ? "" : ", ") + sub->get_name();
    found = found || (argc > 1 && sub->get_name() == argv[1]);
  }
  if (argc > 1 && argv[1][0] != '-' && !found) {
    fmt::print(stderr, "kvq: error: unknown command '{}' (commands: {}; see kvq --help)\n", argv[1],
               known);
    return kvq::cli::kExitBadInput;
  }
  std::vector<const char*> args = kvq::cli::RewriteLlamaCppFlags(argc, argv);
  try {
    app.parse(argc, args.data());
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kvq::cli::kExitBadInput;
  }
  return exit_code;
}
