// ChatTemplate (chat_template.h): the boundary between kvq's Status world and the interpreter,
// which throws jinja::Error internally; nothing is thrown past this file.
#include "jinja/chat_template.h"

#include <fmt/format.h>

#include <new>
#include <nlohmann/json.hpp>

#include "jinja/jinja_eval.h"
#include "jinja/jinja_lexer.h"
#include "jinja/jinja_parser.h"

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

// JSON (tool definitions, call arguments) as template values: objects keep their key order, as
// Python's json.loads does, since templates print them with tojson.
using OrderedJson = nlohmann::ordered_json;
constexpr int kMaxJsonDepth = 64;  // below jinja_value.h's nesting limit

jinja::Value FromJson(const OrderedJson& j, int depth) {
  if (depth > kMaxJsonDepth) throw jinja::Error(fmt::format("JSON nested deeper than {} levels", kMaxJsonDepth));
  switch (j.type()) {
    case OrderedJson::value_t::null: return jinja::Value::None();
    case OrderedJson::value_t::boolean: return jinja::Value::Bool(j.get<bool>());
    case OrderedJson::value_t::number_integer: return jinja::Value::Int(j.get<int64_t>());
    case OrderedJson::value_t::number_unsigned:
      if (j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return jinja::Value::Float(j.get<double>());
      return jinja::Value::Int(static_cast<int64_t>(j.get<uint64_t>()));
    case OrderedJson::value_t::number_float: return jinja::Value::Float(j.get<double>());
    case OrderedJson::value_t::string: return jinja::Value::String(j.get<std::string>());
    case OrderedJson::value_t::array: {
      std::vector<jinja::Value> items;
      for (const OrderedJson& item : j) items.push_back(FromJson(item, depth + 1));
      return jinja::Value::List(std::move(items));
    }
    case OrderedJson::value_t::object: {
      jinja::Dict d;
      for (const auto& [key, value] : j.items()) d.Set(key, FromJson(value, depth + 1));
      return jinja::Value::Dict(std::move(d));
    }
    default: throw jinja::Error("JSON holds a binary value");
  }
}

// A call's arguments: a dict when they are a JSON object, else the text as given.
jinja::Value Arguments(const std::string& text) {
  OrderedJson parsed = OrderedJson::parse(text, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object()) return jinja::Value::String(text);
  return FromJson(parsed, 1);
}

jinja::Value MessageValue(const ChatMessage& m, bool calls_as_text) {
  jinja::Dict d;
  d.Set("role", jinja::Value::String(m.role));
  const bool no_content = calls_as_text && m.content.empty() && !m.tool_calls.empty();
  d.Set("content", no_content ? jinja::Value::None() : jinja::Value::String(m.content));
  if (!m.tool_calls.empty()) {
    std::vector<jinja::Value> calls;
    for (const ToolCall& c : m.tool_calls) {
      jinja::Dict function;
      function.Set("name", jinja::Value::String(c.name));
      function.Set("arguments",
                   calls_as_text ? jinja::Value::String(c.arguments) : Arguments(c.arguments));
      jinja::Dict call;
      call.Set("id", jinja::Value::String(c.id));
      call.Set("type", jinja::Value::String("function"));
      call.Set("function", jinja::Value::Dict(std::move(function)));
      calls.push_back(jinja::Value::Dict(std::move(call)));
    }
    d.Set("tool_calls", jinja::Value::List(std::move(calls)));
  }
  if (!m.tool_call_id.empty()) d.Set("tool_call_id", jinja::Value::String(m.tool_call_id));
  if (!m.name.empty()) d.Set("name", jinja::Value::String(m.name));
  return jinja::Value::Dict(std::move(d));
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
    for (const ChatMessage& m : messages) list.push_back(MessageValue(m, options.calls_as_text));
    jinja::Dict variables;
    variables.Set("messages", jinja::Value::List(std::move(list)));
    variables.Set("add_generation_prompt", jinja::Value::Bool(options.add_generation_prompt));
    variables.Set("bos_token", jinja::Value::String(options.bos_token));
    variables.Set("eos_token", jinja::Value::String(options.eos_token));
    if (options.tools_json.empty()) {
      variables.Set("tools", jinja::Value::None());
    } else {
      OrderedJson tools = OrderedJson::parse(options.tools_json, nullptr, false);
      if (tools.is_discarded() || !tools.is_array()) {
        return Status::Error("chat template: tools must be a JSON array of tool definitions");
      }
      variables.Set("tools", FromJson(tools, 1));
    }
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
