// `kvq chat`'s options and entry point, also run by `kvq run -cnv` / `kvq run -i`.
#pragma once

#include <string>

#include "cli/generate_flags.h"

namespace kvq::cli {

struct ChatFlags {
  GenerateFlags gen;               // also --json (gen.shared.json): one JSON object per turn
  std::string system_prompt;       // -sys / --system-prompt
  std::string chat_template_file;  // --chat-template FILE: Jinja source replacing the model's
  std::string input_file;          // -f FILE: user messages, one per line (else stdin)
  std::string tools_file;          // --tools FILE: a JSON array of OpenAI tool definitions
  std::string tool_choice = "auto";  // --tool-choice: auto, none, required, or a function's name
  std::string reasoning_format = "deepseek";  // --reasoning-format: deepseek (auto) or none
};

/// Runs the chat: interactive when the messages come from a terminal, else one message per line
/// of -f FILE or stdin. `command` names the command in messages ("chat", "run"). Returns the
/// process exit code.
int RunChat(const ChatFlags& o, const std::string& command);

}  // namespace kvq::cli
