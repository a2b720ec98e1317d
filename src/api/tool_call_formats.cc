// The tool-call formats (include/kvq/tool_calls.h): the table, which template uses which, and the
// tools a request declares. Parsing replies: tool_calls.cc; the grammars: tool_call_grammar.cc.
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "kvq/tool_calls.h"

namespace kvq {
namespace {

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
     .id_length = 0,
     // A control token in Llama 3.x's vocabulary: some replies put it before the JSON call.
     .preserved = "<|python_tag|>"},
    {.name = "mistral",
     .models = "Mistral Nemo, Mistral Small, Mixtral (v3 tokenizers)",
     .detect = "[TOOL_CALLS]",
     .open = "[TOOL_CALLS]",
     .close = "",
     .arguments_key = "arguments",
     .array = true,
     .id_length = 9,
     // A control token in Mistral's v3 vocabularies (Nemo's added token 9, "special": true).
     .preserved = "[TOOL_CALLS]"},
    {.name = "deepseek_v3",
     .models = "DeepSeek V3, DeepSeek R1",
     // Their template writes an earlier call's type, then the separator, then the name (V3.1's
     // writes the name first, and is refused: kUnsupported).
     .detect = "'<｜tool▁sep｜>' + tool['function']['name']",
     .open = "<｜tool▁calls▁begin｜>",
     .close = "<｜tool▁calls▁end｜>",
     .arguments_key = "arguments",
     .array = false,
     .id_length = 0,
     .call_open = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>",
     .name_end = "\n```json\n",
     .call_close = "\n```<｜tool▁call▁end｜>",
     // Control tokens as llama.cpp's converter and kvq's tokenizer.json reader make them (added
     // tokens that look special: `<｜...｜>`), though tokenizer.json marks them "special": false.
     .preserved = "<｜tool▁calls▁begin｜>\n<｜tool▁call▁begin｜>\n<｜tool▁sep｜>\n<｜tool▁call▁end｜>\n<｜tool▁calls▁end｜>",
     .calls_as_text = true},
};

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

namespace {

// Formats kvq recognises in a template but cannot force or parse: tools are refused for them
// rather than asked of the model in a format it was not trained on (the fallback's).
struct UnsupportedToolFormat {
  const char* name;
  const char* detect;  // text of the template that uses it
  const char* why;
};
constexpr UnsupportedToolFormat kUnsupported[] = {
    {.name = "deepseek",
     .detect = "<｜tool▁calls▁begin｜>",
     .why = "this DeepSeek template is not V3's or R1's (whose calls are <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME "
            "and a ```json block, the deepseek_v3 format); V3.1 writes NAME<｜tool▁sep｜>{json} without the block, "
            "which kvq's call grammar and parser do not read yet"},
};

}  // namespace

Status CheckToolCallTemplate(const Model& model, std::string_view template_override) {
  const std::string_view source = !template_override.empty()                    ? template_override
                                  : model.chat_template_choice().chatml_fallback ? std::string_view()
                                                                                 : model.info().chat_template;
  // A template in a supported format (other than the fallback) is fine whatever else it holds.
  if (&ToolCallFormatFor(source) != &kFormats[0]) return Status::Ok();
  for (const UnsupportedToolFormat& f : kUnsupported) {
    if (source.find(f.detect) != std::string_view::npos) {
      return Status::Error(fmt::format("the chat template writes tool calls in the '{}' format (it holds {}), "
                                       "which kvq does not support: {}", f.name, f.detect, f.why));
    }
  }
  return Status::Ok();
}

std::vector<std::string> PreservedTokens(const ToolCallFormat& format) {
  std::vector<std::string> texts;
  std::string_view rest = format.preserved;
  while (!rest.empty()) {
    const size_t end = std::min(rest.find('\n'), rest.size());
    if (end > 0) texts.emplace_back(rest.substr(0, end));
    rest.remove_prefix(std::min(end + 1, rest.size()));
  }
  return texts;
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

}  // namespace kvq
