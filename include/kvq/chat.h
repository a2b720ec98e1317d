// kvq's public C++ API: the types of a chat — a conversation's messages and the options that turn
// it into the prompt text a model was trained on (Model::ApplyChatTemplate in kvq/model.h renders
// them with the model's own Jinja chat template, or ChatML when it has none).
//
//   std::vector<kvq::ChatMessage> chat = {{"system", "Be brief."}, {"user", "Hi"}};
//   kvq::Result<std::string> prompt = model->ApplyChatTemplate(chat, {.add_generation_prompt = true});
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace kvq {

/// A function call an assistant message makes (OpenAI's `tool_calls[i]`, of type "function").
struct ToolCall {
  std::string id;         ///< the call's id, which the `tool` message answering it repeats
  std::string name;       ///< the function's name
  std::string arguments;  ///< JSON text, normally an object (templates get it parsed when it parses)
};

/// One message of a conversation, as the OpenAI chat API and the templates see it.
struct ChatMessage {
  std::string role;     ///< "system", "user", "assistant", "tool" (templates decide what they accept)
  std::string content;  ///< UTF-8 text ("" for an assistant message that only calls tools)
  /// An assistant message's function calls; templates see `message.tool_calls` only when non-empty
  /// (Mistral's tests `is defined`).
  std::vector<ToolCall> tool_calls = {};
  /// A `tool` message: the id of the call it answers (`message.tool_call_id`, defined when non-empty).
  std::string tool_call_id = {};
  /// A `tool` message: the function's name (`message.name`, defined when non-empty).
  std::string name = {};
};

/// How Model::ApplyChatTemplate renders a conversation.
struct ChatTemplateOptions {
  /// Ends the prompt with the header of the assistant's turn, so the model writes the reply.
  bool add_generation_prompt = true;
  /// Qwen 3's switch, as the template's `enable_thinking`; unset: the variable is undefined and
  /// the template decides (Qwen 3 then thinks).
  std::optional<bool> enable_thinking;
  /// Jinja source to render with instead of the model's template (e.g. a --chat-template file);
  /// empty: the model's template, or ChatML when it has none kvq can run. Parsed on each call.
  std::string template_override;
  /// What the template's `strftime_now(format)` formats (UTC); unset: the clock at the render.
  /// Llama 3.x's templates print the date with it, so a fixed time makes a render reproducible.
  std::optional<std::chrono::sys_seconds> now;
  /// The tools the model may call, as the template's `tools`: JSON text of an array of OpenAI tool
  /// definitions ({"type": "function", "function": {"name", "description", "parameters"}}); empty:
  /// none (the template sees `tools` as none).
  std::string tools_json;
};

/// Which template Model::ApplyChatTemplate renders with when no override is given.
struct ChatTemplateChoice {
  /// True when the model has no template kvq can run (none in the file, or one that fails to
  /// parse) and ChatML is used instead: "<|im_start|>{role}\n{content}<|im_end|>\n" per message,
  /// then "<|im_start|>assistant\n" when add_generation_prompt.
  bool chatml_fallback = false;
  /// Says which, for a log line: "the model's tokenizer.chat_template", "ChatML (the model file
  /// has no tokenizer.chat_template)", or "ChatML (the model's template is not supported: ...)".
  std::string origin;
};

}  // namespace kvq
