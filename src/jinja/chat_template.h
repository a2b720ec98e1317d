// Chat templates: the Jinja template a model ships (GGUF `tokenizer.chat_template`, or
// tokenizer_config.json's `chat_template`) that turns a conversation into the prompt text the
// model was trained on. kvq renders them itself, with a Jinja interpreter (src/jinja/jinja_*.cc)
// that does what transformers' apply_chat_template does: jinja2 with trim_blocks and
// lstrip_blocks, Python semantics for values, the variables below. Tested byte for byte against
// @huggingface/jinja (transformers.js) on the real templates of Llama 2, Llama 3.1, Qwen 2.5,
// Qwen 3, Gemma 3 and Mistral Nemo (tests/jinja/chat_template_oracle_test.cc), and against jinja2's
// output on hand-written templates (tests/jinja/chat_template_test.cc).
//
// Where @huggingface/jinja and jinja2 differ (JavaScript's loose == and object identity,
// `{{ none }}` printing "" and `{{ true }}` "true", str.strip/lstrip/rstrip ignoring their
// argument, selectattr dropping items that lack the attribute, a `set` in a loop body lasting
// into the next iteration), kvq does what jinja2 does. Deliberate differences from jinja2: an
// attribute or item of an undefined value is undefined (jinja2 raises; @huggingface/jinja agrees
// with kvq), integers are 64-bit (overflow is an error), case mapping (upper, lower, title,
// capitalize) is ASCII-only, tuples are lists (`(1, 2)` prints as [1, 2]), and printf-style `%`
// formatting, macros and the other constructs jinja_parser.h lists are refused.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "kvq/chat.h"  // ChatMessage
#include "kvq/status.h"

namespace kvq {

namespace jinja {
struct Program;
}

/// The limits of one render, so that a hostile template fails cleanly instead of running away. The
/// defaults are far above what any real template needs for a conversation of a few megabytes,
/// and bound a render to about a second and a few hundred MiB.
struct ChatRenderLimits {
  /// Expression evaluations, loop iterations and 64-byte blocks scanned, in all.
  int64_t max_steps = 10'000'000;
  /// Bytes of strings (text + 64 each) and list slots (24 bytes each) created, in all.
  size_t max_created_bytes = size_t{256} << 20;
  /// The rendered text.
  size_t max_output_bytes = size_t{16} << 20;
};

/// The variables a template is rendered with, besides `messages` (a list of {role, content}
/// dicts, with tool_calls [{id, type: "function", function: {name, arguments}}], tool_call_id and
/// name where a message has them). `documents` is always none.
struct ChatRenderOptions {
  /// Ends the prompt with the header of the assistant's turn, so the model writes the reply.
  bool add_generation_prompt = true;
  /// The vocabulary's BOS and EOS texts ("" when it has none), as `bos_token` and `eos_token`.
  std::string bos_token, eos_token;
  /// Qwen 3's switch, as `enable_thinking`; unset: the variable is undefined and the template
  /// decides (Qwen 3 then thinks).
  std::optional<bool> enable_thinking;
  /// What `strftime_now(format)` formats (UTC); unset: the system clock at the render. Llama 3.x's
  /// templates print the date with it, so a fixed time makes a render reproducible.
  std::optional<std::chrono::sys_seconds> now;
  /// `tools`: JSON text of an array (OpenAI tool definitions), converted to lists and dicts; empty:
  /// none. A call's arguments reach the template as a dict when they parse as a JSON object (as
  /// transformers documents them; Llama 3.1's template applies tojson to them), else as the string.
  std::string tools_json;
  /// An assistant message with calls and no content has content none, and each call's arguments
  /// are their JSON text, not a dict: DeepSeek V3's template renders an earlier call only so (it
  /// tests `content is none` and concatenates the arguments; ToolCallFormat::calls_as_text).
  bool calls_as_text = false;
  ChatRenderLimits limits;
};

/// A parsed chat template; cheap to copy (the parsed form is shared and immutable) and safe to
/// render from several threads at once.
///
/// Limits, because templates come from downloaded files and Parse and Render must fail cleanly,
/// never crash or run away, on any template: the source is at most kMaxSourceBytes; tags,
/// brackets and unary operators nest at most 64 levels and an expression tree is at most 128
/// operations tall (jinja_parser.h), which bounds the interpreter's recursion; lists, dicts and
/// namespaces nest at most 100 levels (jinja_value.h); work, memory and output are bounded per
/// render by ChatRenderOptions::limits. Past any of them Parse or Render returns an error.
class ChatTemplate {
 public:
  static constexpr size_t kMaxSourceBytes = size_t{1} << 20;

  /// Parses a template. A syntax error, or a construct kvq does not implement (macro, call blocks,
  /// include/import, an unknown filter or test...), is an error naming it and its line:column:
  /// "chat template 3:14: unsupported construct 'macro'".
  static Result<ChatTemplate> Parse(std::string_view source);

  /// The fallback for a model without a template: ChatML, as transformers' old default template
  /// writes it: "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then
  /// "<|im_start|>assistant\n" when add_generation_prompt.
  static ChatTemplate ChatMl();

  /// The prompt text for `messages`. A template's raise_exception("...") (a conversation it
  /// refuses, e.g. roles that do not alternate) is an error whose message is exactly that text;
  /// any other failure is "chat template LINE:COLUMN: what".
  Result<std::string> Render(std::span<const ChatMessage> messages,
                             const ChatRenderOptions& options) const;

  /// The template's text, as given to Parse.
  const std::string& source() const { return source_; }

 private:
  ChatTemplate(std::string source, std::shared_ptr<const jinja::Program> program);

  std::string source_;
  std::shared_ptr<const jinja::Program> program_;
};

}  // namespace kvq
