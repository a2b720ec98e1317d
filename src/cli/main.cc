// kvq command line: one binary, one subcommand per job (run, formats, plan, bench, eval, synth, tokenize).
#include <fmt/core.h>

#include <filesystem>

#include "cli/commands.h"
#include "kvq/kv_cache.h"
#include "kvq/units.h"

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

Status ParseBudgetFlags(const std::string& device, const std::string& host, const std::string& disk_dir,
                        KvBudgets* budgets) {
  const struct { const std::string* text; int64_t* bytes; const char* flag; } sizes[] = {
      {&device, &budgets->device_bytes, "--kv-device-budget"}, {&host, &budgets->host_bytes, "--kv-host-budget"}};
  for (const auto& s : sizes) {
    if (s.text->empty()) continue;
    const Result<int64_t> bytes = ParseByteSize(*s.text);
    if (!bytes.ok()) return Status::Error(std::string(s.flag) + ": " + bytes.status().message());
    *s.bytes = *bytes;
  }
  budgets->disk_dir = disk_dir;
  return Status::Ok();
}

int BadInput(const std::string& command, const std::string& message) {
  fmt::print(stderr, "kvq {}: error: {}\n", command, message);
  return kExitBadInput;
}
}  // namespace kvq::cli

int main(int argc, char** argv) {
  CLI::App app{"kvq: a KV-cache-first LLM inference runtime. The KV cache is the wall: kvq stores\n"
               "it in compact number formats and measures what each one saves and costs."};
  app.set_version_flag("--version", "kvq 0.1.0");
  app.require_subcommand(1);
  int exit_code = 0;
  kvq::cli::AddRunCommand(app, &exit_code);
  kvq::cli::AddFormatsCommand(app, &exit_code);
  kvq::cli::AddPlanCommand(app, &exit_code);
  kvq::cli::AddBenchCommand(app, &exit_code);
  kvq::cli::AddEvalCommand(app, &exit_code);
  kvq::cli::AddSynthCommand(app, &exit_code);
  kvq::cli::AddTokenizeCommand(app, &exit_code);
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kvq::cli::kExitBadInput;
  }
  return exit_code;
}
