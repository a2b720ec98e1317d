// `kvq eval`: what each KV format costs in accuracy, measured on a model (attention, fidelity).
#include "cli/commands.h"

namespace kvq::cli {

void AddEvalCommand(CLI::App& app, int* exit_code) {
  CLI::App* eval = app.add_subcommand("eval", "What each KV format costs in accuracy, measured on a model "
                                              "(attention, fidelity)");
  eval->require_subcommand(1);
  AddEvalAttentionCommand(*eval, exit_code);
  AddEvalFidelityCommand(*eval, exit_code);
}

}  // namespace kvq::cli
