// ChatTemplate (chat_template.h): the boundary between kvq's Status world and the interpreter,
// which throws jinja::Error internally; nothing is thrown past this file.
#include "text/chat_template.h"

#include <fmt/format.h>

#include <new>

#include "text/jinja_eval.h"
#include "text/jinja_lexer.h"
#include "text/jinja_parser.h"

namespace kvq {
namespace {

constexpr std::string_view kChatMl =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' "
    "}}{% endif %}";

Status TemplateError(const jinja::Error& error, std::string_view normalized) {
  if (error.raised()) return Status::Error(error.message());
  if (!error.has_offset()) return Status::Error("chat template: " + error.message());
  return Status::Error(fmt::format("chat template {}: {}",
                                   jinja::LineColumn(normalized, error.offset()), error.message()));
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source, std::shared_ptr<const jinja::Program> program)
    : source_(std::move(source)), program_(std::move(program)) {}

Result<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  if (source.size() > kMaxSourceBytes) {
    return Status::Error(fmt::format("chat template: {} bytes, more than the {} kvq reads",
                                     source.size(), kMaxSourceBytes));
  }
  auto program = std::make_shared<jinja::Program>();
  program->normalized = jinja::NormalizeTemplateSource(source);
  try {
    program->body = jinja::Parse(program->normalized);
  } catch (const jinja::Error& error) {
    return TemplateError(error, program->normalized);
  } catch (const std::bad_alloc&) {
    return Status::Error("chat template: out of memory while parsing");
  }
  return ChatTemplate(std::string(source), std::move(program));
}

ChatTemplate ChatTemplate::ChatMl() {
  Result<ChatTemplate> t = Parse(kChatMl);
  return std::move(t).value();  // a constant that parses (chat_template_test checks it)
}

Result<std::string> ChatTemplate::Render(std::span<const ChatMessage> messages,
                                         const ChatRenderOptions& options) const {
  try {
    std::vector<jinja::Value> list;
    list.reserve(messages.size());
    for (const ChatMessage& m : messages) {
      jinja::Dict d;
      d.Set("role", jinja::Value::String(m.role));
      d.Set("content", jinja::Value::String(m.content));
      list.push_back(jinja::Value::Dict(std::move(d)));
    }
    jinja::Dict variables;
    variables.Set("messages", jinja::Value::List(std::move(list)));
    variables.Set("add_generation_prompt", jinja::Value::Bool(options.add_generation_prompt));
    variables.Set("bos_token", jinja::Value::String(options.bos_token));
    variables.Set("eos_token", jinja::Value::String(options.eos_token));
    variables.Set("tools", jinja::Value::None());
    variables.Set("documents", jinja::Value::None());
    if (options.enable_thinking)
      variables.Set("enable_thinking", jinja::Value::Bool(*options.enable_thinking));
    const std::chrono::sys_seconds now =
        options.now ? *options.now
                    : std::chrono::floor<std::chrono::seconds>(std::chrono::system_clock::now());
    const jinja::Limits limits{.max_steps = options.limits.max_steps,
                               .max_created_bytes = options.limits.max_created_bytes,
                               .max_output_bytes = options.limits.max_output_bytes};
    return jinja::Render(*program_, variables, now, limits);
  } catch (const jinja::Error& error) {
    return TemplateError(error, program_->normalized);
  } catch (const std::bad_alloc&) {
    return Status::Error("chat template: out of memory while rendering");
  }
}

}  // namespace kvq
