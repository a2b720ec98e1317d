// The kvq subcommands. Each registers its flags on the CLI11 app and runs when selected, setting
// the process exit code (0 ok, 1 runtime failure, 2 bad input).
#pragma once

#include <CLI/CLI.hpp>

namespace kvq::cli {

inline constexpr int kExitBadInput = 2;

void AddFormatsCommand(CLI::App& app, int* exit_code);
void AddPlanCommand(CLI::App& app, int* exit_code);
void AddBenchCommand(CLI::App& app, int* exit_code);
void AddRunCommand(CLI::App& app, int* exit_code);

/// Prints "kvq <command>: error: <message>" to stderr and returns kExitBadInput.
int BadInput(const std::string& command, const std::string& message);

}  // namespace kvq::cli
