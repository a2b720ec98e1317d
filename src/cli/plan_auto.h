// `kvq plan --auto`: KV specs per layer and per K/V chosen from a model's measured fidelity under
// a budget (measure/kv_plan_auto.h), printed and written as a plan file for --kv-plan. Its flags live
// on `kvq plan`; cmd_plan.cc declares the command.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "cli/flags.h"

namespace kvq::cli {

struct AutoPlanOptions {
  bool enabled = false;              // --auto
  std::string text;                  // -f (default: the bundled evaluation text)
  int64_t context = 0;               // -c: positions to evaluate (0: the whole text, up to the model's)
  int64_t bytes_per_token = 0;       // --bytes-per-token (the other budget is SharedOptions::kv_bits)
  std::string output;                // -o: the plan file
  std::vector<std::string> candidates;  // --candidates (default: DefaultKvPlanCandidates)
};

/// --auto, -m, --tokenizer, -f, -c, --kv-bits, --bytes-per-token, -o, --candidates, -t on `cmd`
/// (`kvq plan`, whose --json is shared); returns --auto, which the shape flags exclude.
CLI::Option* AddAutoPlanFlags(CLI::App* cmd, SharedOptions* shared, AutoPlanOptions* o);

/// Runs `kvq plan --auto`; returns the exit code.
int RunAutoPlan(const SharedOptions& shared, const AutoPlanOptions& o);

}  // namespace kvq::cli
