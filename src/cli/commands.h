// The kvq subcommands. Each registers its flags on the CLI11 app and runs when selected, setting
// the process exit code (0 ok, 1 runtime failure, 2 bad input).
#pragma once

#include <CLI/CLI.hpp>

#include "kvq/status.h"

namespace kvq::cli {

inline constexpr int kExitBadInput = 2;

void AddFormatsCommand(CLI::App& app, int* exit_code);
void AddPlanCommand(CLI::App& app, int* exit_code);
void AddBenchCommand(CLI::App& app, int* exit_code);
void AddRunCommand(CLI::App& app, int* exit_code);
void AddChatCommand(CLI::App& app, int* exit_code);
void AddTokenizeCommand(CLI::App& app, int* exit_code);
void AddSynthCommand(CLI::App& app, int* exit_code);
void AddEvalCommand(CLI::App& app, int* exit_code);
void AddServeCommand(CLI::App& app, int* exit_code);
/// `kvq pull` and `kvq list` (cmd_pull.cc).
void AddPullCommand(CLI::App& app, int* exit_code);

/// Subcommands of `kvq bench` (cmd_bench.cc registers attention and stream itself).
void AddBenchMatvecCommand(CLI::App& bench, int* exit_code);
void AddBenchDecodeCommand(CLI::App& bench, int* exit_code);
void AddBenchPrefillCommand(CLI::App& bench, int* exit_code);
void AddBenchRooflineCommand(CLI::App& bench, int* exit_code);
void AddBenchContextCommand(CLI::App& bench, int* exit_code);
void AddBenchServeCommand(CLI::App& bench, int* exit_code);
void AddBenchBatchCommand(CLI::App& bench, int* exit_code);
void AddBenchGrammarCommand(CLI::App& bench, int* exit_code);
void AddBenchSpecCommand(CLI::App& bench, int* exit_code);
/// Subcommands of `kvq eval` (cmd_eval.cc creates the group).
void AddEvalAttentionCommand(CLI::App& eval, int* exit_code);
void AddEvalFidelityCommand(CLI::App& eval, int* exit_code);

/// A file of the bundled model (stories260K.bin, tok512.bin, stories260K.gguf): under the source
/// tree's models/ (when run from a build folder) or ./models. Commands use it when -m is not given.
std::string BundledModelFile(const std::string& file);

/// Prints "kvq <command>: error: <message>" to stderr and returns kExitBadInput.
int BadInput(const std::string& command, const std::string& message);

}  // namespace kvq::cli
