// Tool-call formats, grammars and parsing (include/kvq/tool_calls.h).
#include "kvq/tool_calls.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "kvq/generator.h"

namespace kvq {
namespace {

// Ordered: a call's arguments keep the model's key order, and the schema built for a grammar keeps
// "name" before the arguments.
using Json = nlohmann::ordered_json;

// The table. A new family is a row here (and its template in the tests' oracle).
constexpr ToolCallFormat kFormats[] = {
    {.name = "hermes",
     .models = "Qwen 2.5, Qwen 3, Hermes (and ChatML models)",
     .detect = "<tool_call>",
     .open = "<tool_call>",
     .close = "</tool_call>",
     .arguments_key = "arguments",
     .array = false,
     .id_length = 0},
    {.name = "llama3_json",
     .models = "Llama 3.1, 3.2, 3.3",
     // Llama 3.1's template names the built-in tools' tag; 3.2's has no built-in tools, and both
     // (3.3's too) ask for calls in this one sentence.
     .detect = "<|python_tag|>\n\"parameters\": dictionary of argument name",
     .open = "",
     .close = "",
     .arguments_key = "parameters",
     .array = false,
     .id_length = 0},
    {.name = "mistral",
     .models = "Mistral Nemo, Mistral Small, Mixtral (v3 tokenizers)",
     .detect = "[TOOL_CALLS]",
     .open = "[TOOL_CALLS]",
     .close = "",
     .arguments_key = "arguments",
     .array = true,
     .id_length = 9},
};

// Llama 3.x writes a call after this tag when it calls a built-in tool, and sometimes before a
// JSON call too.
constexpr std::string_view kPythonTag = "<|python_tag|>";

// The rule the schema compiler's "root" becomes inside a tool-call grammar.
constexpr std::string_view kCallRule = "tool-call-json";

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Length of the longest suffix of `text` that is a proper prefix of `marker`.
size_t PartialMarker(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (marker.starts_with(text.substr(text.size() - n))) return n;
  }
  return 0;
}

size_t TrailingSpace(std::string_view text) {
  size_t n = 0;
  while (n < text.size() && IsSpace(text[text.size() - 1 - n])) ++n;
  return n;
}

}  // namespace

std::span<const ToolCallFormat> ToolCallFormats() { return kFormats; }

const ToolCallFormat& ToolCallFormatFor(std::string_view template_source) {
  for (const ToolCallFormat& f : kFormats) {
    std::string_view texts = f.detect;
    while (!texts.empty()) {
      const size_t end = std::min(texts.find('\n'), texts.size());
      if (template_source.find(texts.substr(0, end)) != std::string_view::npos) return f;
      texts.remove_prefix(std::min(end + 1, texts.size()));
    }
  }
  return kFormats[0];
}

const ToolCallFormat& ToolCallFormatOf(const Model& model, std::string_view template_override) {
  if (!template_override.empty()) return ToolCallFormatFor(template_override);
  if (model.chat_template_choice().chatml_fallback) return kFormats[0];
  return ToolCallFormatFor(model.info().chat_template);
}

const ToolCallFormat* FindToolCallFormat(std::string_view name) {
  for (const ToolCallFormat& f : kFormats) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

std::string NewToolCallId(const ToolCallFormat& format) {
  static constexpr std::string_view kAlphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, kAlphabet.size() - 1);
  const int n = format.id_length > 0 ? format.id_length : 24;
  std::string id = format.id_length > 0 ? "" : "call_";
  for (int i = 0; i < n; ++i) id += kAlphabet[pick(rng)];
  return id;
}

Result<std::vector<std::string>> CheckTools(const ToolOptions& options) {
  const Json tools = Json::parse(options.tools_json, nullptr, false);
  if (tools.is_discarded() || !tools.is_array()) return Status::Error("tools must be a JSON array of tool definitions");
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string where = fmt::format("tools[{}]", i);
    const Json& t = tools[i];
    if (!t.is_object()) return Status::Error(where + " must be an object");
    if (!t.contains("type") || t["type"] != "function") {
      return Status::Error(where + ".type must be \"function\" (the only kind of tool)");
    }
    if (!t.contains("function") || !t["function"].is_object()) return Status::Error(where + ".function must be an object");
    const Json& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty()) {
      return Status::Error(where + ".function.name must be a non-empty string");
    }
    const std::string name = f["name"].get<std::string>();
    if (!seen.insert(name).second) return Status::Error(fmt::format("{}.function.name '{}' is declared twice", where, name));
    if (f.contains("parameters") && !f["parameters"].is_object()) {
      return Status::Error(where + ".function.parameters must be a JSON Schema object");
    }
    names.push_back(name);
  }
  if (options.choice == ToolChoice::kFunction && !seen.contains(options.function)) {
    return Status::Error(fmt::format("tool_choice names the function '{}', which tools does not declare", options.function));
  }
  if (options.choice == ToolChoice::kRequired && names.empty()) {
    return Status::Error("tool_choice is \"required\" but tools declares no function");
  }
  return names;
}

Result<std::string> ToolCallGrammar(const ToolCallFormat& format, const ToolOptions& options) {
  Result<std::vector<std::string>> names = CheckTools(options);
  if (!names.ok()) return names.status();
  if (options.choice == ToolChoice::kAuto || options.choice == ToolChoice::kNone) return std::string();
  // One schema for a call object: {"name": one of the functions, arguments: its parameters}, as
  // anyOf over the functions, so each name is followed by its own arguments.
  const Json tools = Json::parse(options.tools_json);
  Json branches = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& f = tools[i]["function"];
    const std::string name = f["name"].get<std::string>();
    if (options.choice == ToolChoice::kFunction && name != options.function) continue;
    const Json parameters = f.contains("parameters") ? f["parameters"] : Json{{"type", "object"}};
    if (Result<std::string> alone = JsonSchemaGrammar(parameters.dump()); !alone.ok()) {
      return Status::Error(fmt::format("tools[{}].function.parameters: {}", i, alone.status().message()));
    }
    Json call = {{"type", "object"},
                 {"properties", {{"name", {{"const", name}}}, {format.arguments_key, parameters}}},
                 {"required", {"name", format.arguments_key}}};
    branches.push_back(std::move(call));
  }
  const Json schema = branches.size() == 1 ? branches[0] : Json{{"anyOf", branches}};
  Result<std::string> compiled = JsonSchemaGrammar(schema.dump());
  if (!compiled.ok()) return Status::Error("tools: " + compiled.status().message());
  std::string gbnf = std::move(compiled).value();
  // The compiler's start rule becomes the call's rule; the new root writes the format around it.
  if (gbnf.find(std::string(kCallRule) + " ::=") != std::string::npos) {
    return Status::Error(fmt::format("tools: a parameters schema yields a rule named '{}'", kCallRule));
  }
  const size_t root = gbnf.rfind("root ::= ", 0) == 0 ? 0 : gbnf.find("\nroot ::= ");
  if (root == std::string::npos) return Status::Error("tools: the schema's grammar has no root rule");
  gbnf.replace(root == 0 ? 0 : root + 1, 4, kCallRule);
  const bool many = options.choice == ToolChoice::kRequired && options.parallel;
  auto literal = [](std::string_view text) {
    std::string out = "\"";
    for (char c : text) out += c == '\n' ? std::string("\\n") : c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
    return out + "\"";
  };
  const std::string call(kCallRule);
  std::string top;
  if (format.array) {
    top = literal(std::string(format.open) + "[") + " " + call + (many ? " ( \", \" " + call + " )*" : "") + " \"]\"";
  } else if (*format.open == '\0') {
    top = call;  // llama3_json: one call, the whole reply
  } else {
    const std::string one = literal(std::string(format.open) + "\n") + " " + call + " " + literal(std::string("\n") + format.close);
    top = one + (many ? " ( \"\\n\" " + one + " )*" : "");
  }
  return "root ::= " + top + "\n" + gbnf;
}

ToolCallParser::ToolCallParser(const ToolCallFormat& format) : format_(&format) {}

ToolCallParser::Delta ToolCallParser::Add(std::string_view text) {
  buffer_ += text;
  Delta d;
  Drain(false, &d);
  return d;
}

ToolCallParser::Delta ToolCallParser::Finish() {
  Delta d;
  Drain(true, &d);
  return d;
}

bool ToolCallParser::ParseCalls(std::string_view text, Delta* out) {
  const Json parsed = Json::parse(text, nullptr, false);
  if (parsed.is_discarded()) return false;
  std::vector<Json> objects;
  if (format_->array) {
    if (!parsed.is_array() || parsed.empty()) return false;
    objects.assign(parsed.begin(), parsed.end());
  } else {
    objects.push_back(parsed);
  }
  std::vector<ToolCall> calls;
  for (const Json& o : objects) {
    if (!o.is_object() || !o.contains("name") || !o["name"].is_string() || o["name"].get<std::string>().empty()) {
      return false;
    }
    // Models of a family do not all use its key: accept either.
    const Json* arguments = nullptr;
    for (const char* key : {format_->arguments_key, "arguments", "parameters"}) {
      if (o.contains(key)) {
        arguments = &o[key];
        break;
      }
    }
    ToolCall call{.id = NewToolCallId(*format_), .name = o["name"].get<std::string>(), .arguments = "{}"};
    if (arguments != nullptr) call.arguments = arguments->is_string() ? arguments->get<std::string>() : arguments->dump();
    calls.push_back(std::move(call));
  }
  calls_ += static_cast<int>(calls.size());
  out->calls.insert(out->calls.end(), calls.begin(), calls.end());
  return true;
}

void ToolCallParser::Drain(bool final, Delta* out) {
  const std::string_view open = format_->open, close = format_->close;
  // Content is released as soon as it cannot begin a call; whitespace just before a call or at
  // the end of a reply that called (the separator models put around calls) is not content.
  auto release = [&](size_t n, bool drop_trailing_space) {
    std::string_view text(buffer_.data(), n);
    const size_t space = TrailingSpace(text);
    if (drop_trailing_space) text.remove_suffix(space);
    out->content += text;
    buffer_.erase(0, n);
  };
  for (;;) {
    if (!in_call_) {
      if (open.empty()) {  // llama3_json: the reply is a call when it starts with one
        if (!decided_) {
          const size_t first = buffer_.find_first_not_of(" \n\t\r");
          if (first == std::string::npos && !final) return;
          const std::string_view rest = first == std::string::npos ? "" : std::string_view(buffer_).substr(first);
          if (!final && kPythonTag.starts_with(rest) && rest.size() < kPythonTag.size()) return;
          decided_ = true;
          if (rest.starts_with(kPythonTag) || rest.starts_with("{")) {
            in_call_ = true;
            continue;
          }
        }
        release(buffer_.size(), false);
        return;
      }
      const size_t at = buffer_.find(open);
      if (at != std::string::npos) {
        release(at, true);
        in_call_ = true;
        continue;
      }
      if (final) {
        release(buffer_.size(), calls_ > 0 && TrailingSpace(buffer_) == buffer_.size());
        return;
      }
      // Hold a possible start of `open`, and trailing whitespace (it may precede a call).
      const size_t partial = PartialMarker(buffer_, open);
      const size_t hold = partial + TrailingSpace(std::string_view(buffer_).substr(0, buffer_.size() - partial));
      if (buffer_.size() > hold) {
        out->content += buffer_.substr(0, buffer_.size() - hold);
        buffer_.erase(0, buffer_.size() - hold);
      }
      return;
    }
    if (!close.empty()) {  // one call between `open` and `close`
      const size_t at = buffer_.find(close, open.size());
      if (at == std::string::npos) {
        if (final) {  // never closed: what was written is content
          out->content += buffer_;
          buffer_.clear();
          in_call_ = false;
        }
        return;
      }
      const size_t end = at + close.size();
      if (!ParseCalls(std::string_view(buffer_).substr(open.size(), at - open.size()), out)) {
        out->content += buffer_.substr(0, end);
      }
      buffer_.erase(0, end);
      in_call_ = false;
      continue;
    }
    if (!final) return;  // the calls run to the end of the reply
    std::string_view body(buffer_);
    body.remove_prefix(std::min(body.size(), open.size()));
    while (!body.empty() && IsSpace(body.front())) body.remove_prefix(1);
    if (open.empty() && body.starts_with(kPythonTag)) body.remove_prefix(kPythonTag.size());
    if (!ParseCalls(body, out)) out->content += buffer_;
    buffer_.clear();
    in_call_ = false;
    return;
  }
}

ToolCallParser::Delta ParseToolCalls(const ToolCallFormat& format, std::string_view text) {
  ToolCallParser parser(format);
  ToolCallParser::Delta all = parser.Add(text);
  ToolCallParser::Delta end = parser.Finish();
  all.content += end.content;
  all.calls.insert(all.calls.end(), end.calls.begin(), end.calls.end());
  return all;
}

}  // namespace kvq
