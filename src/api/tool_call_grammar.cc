// The grammars of tool calls (include/kvq/tool_calls.h's ToolCallGrammar): a forced call, and
// tool_choice auto's lazy grammar (free text until the format's opening, then only calls).
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "kvq/generator.h"
#include "kvq/tool_calls.h"

namespace kvq {
namespace {

// Ordered: the schema built for a grammar keeps "name" before the arguments.
using Json = nlohmann::ordered_json;

// The rule the schema compiler's "root" becomes inside a tool-call grammar.
constexpr std::string_view kCallRule = "tool-call-json";

// A GBNF string literal of `text`.
std::string Literal(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    out += c == '\n' ? std::string("\\n") : c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
  }
  return out + "\"";
}

// A GBNF character inside [...].
std::string ClassChar(char c) {
  if (c == '\n') return "\\n";
  if (c == '\t') return "\\t";
  if (c == '\r') return "\\r";
  if (c == ']' || c == '[' || c == '\\' || c == '^' || c == '-') return std::string("\\") + c;
  return std::string(1, c);
}

constexpr std::string_view kThinkClose = "</think>";

// The UTF-8 characters of `text`, each as its bytes (a grammar's classes hold characters, not
// bytes).
std::vector<std::string> Characters(std::string_view text) {
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const size_t length = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    const size_t n = std::min(text.size() - i, length);
    out.emplace_back(text.substr(i, n));
    i += n;
  }
  return out;
}

// A character inside [...]: ClassChar for ASCII, the character itself otherwise.
std::string ClassCharacter(const std::string& c) { return c.size() == 1 ? ClassChar(c[0]) : c; }

// Rules `name`-0 .. `name`-(m-1) matching any text that does not contain `marker` (m characters),
// started at `name`-0: the states of a Knuth-Morris-Pratt matcher of `marker`, rule i having
// matched its first i characters; the character that would complete it has no transition. Each
// rule may end (the text may stop anywhere), and each recursion is last in its alternative, so a
// long text keeps the matcher's stacks flat.
std::string NotContaining(std::string_view name, std::string_view marker_text) {
  const std::vector<std::string> marker = Characters(marker_text);
  const size_t m = marker.size();
  // next(i, c): the longest prefix of marker that is a suffix of marker[0, i) + c.
  auto next = [&](size_t i, const std::string& c) {
    std::vector<std::string> text(marker.begin(), marker.begin() + static_cast<std::ptrdiff_t>(i));
    text.push_back(c);
    for (size_t k = std::min(text.size(), m); k > 0; --k) {
      if (std::equal(marker.begin(), marker.begin() + static_cast<std::ptrdiff_t>(k),
                     text.end() - static_cast<std::ptrdiff_t>(k))) {
        return k;
      }
    }
    return size_t{0};
  };
  std::string out;
  for (size_t i = 0; i < m; ++i) {
    std::string special, alternatives;
    std::set<std::string> seen;
    for (size_t j = 0; j <= i; ++j) {  // only marker's characters can lead anywhere but state 0
      const std::string& c = marker[j];
      if (!seen.insert(c).second) continue;
      special += ClassCharacter(c);
      if (const size_t to = next(i, c); to > 0 && to < m) {
        alternatives += fmt::format(" | {} {}-{}", Literal(c), name, to);
      } else if (to == 0) {
        alternatives += fmt::format(" | {} {}-0", Literal(c), name);
      }
    }
    out += fmt::format("{}-{} ::= ( [^{}] {}-0{} )?\n", name, i, special, name, alternatives);
  }
  return out;
}

// The rule `rule` of a call whose name is outside the JSON (NamedCalls): one alternative per
// function, its name then its own arguments' grammar, appended to `gbnf` (the compiled anyOf of the
// functions' parameters, whose branch i is the rule "schema-anyOf-i").
Status AddNamedCallRule(const ToolCallFormat& format, const std::vector<std::string>& names,
                        std::string_view rule, std::string* gbnf) {
  std::string alternatives;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string arguments = fmt::format("schema-anyOf-{}", i);
    if (gbnf->find("\n" + arguments + " ::= ") == std::string::npos) {
      return Status::Error(
          fmt::format("tools: the grammar of {}'s parameters has no rule {}", names[i], arguments));
    }
    alternatives += fmt::format("{}{} {} {}", i ? " | " : "",
                                Literal(format.call_open + names[i] + format.name_end), arguments,
                                Literal(format.call_close));
  }
  *gbnf += fmt::format("{} ::= {}\n", rule, alternatives);
  return Status::Ok();
}

}  // namespace

Result<std::string> ToolCallGrammar(const ToolCallFormat& format, const ToolOptions& options) {
  Result<std::vector<std::string>> names = CheckTools(options);
  if (!names.ok()) return names.status();
  if (options.choice == ToolChoice::kNone || names->empty()) return std::string();
  // One schema for a call object: {"name": one of the functions, arguments: its parameters}, as
  // anyOf over the functions, so each name is followed by its own arguments.
  const Json tools = Json::parse(options.tools_json);
  const bool named = NamedCalls(format);
  std::vector<std::string> chosen;  // the functions a call may name, in order
  Json branches = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& f = tools[i]["function"];
    const std::string name = f["name"].get<std::string>();
    if (options.choice == ToolChoice::kFunction && name != options.function) continue;
    const Json parameters = f.contains("parameters") ? f["parameters"] : Json{{"type", "object"}};
    if (Result<std::string> alone = JsonSchemaGrammar(parameters.dump()); !alone.ok()) {
      return Status::Error(fmt::format("tools[{}].function.parameters: {}", i, alone.status().message()));
    }
    chosen.push_back(name);
    if (named) {  // the name is written before the JSON: the JSON is the arguments alone
      branches.push_back(parameters);
      continue;
    }
    Json call = {{"type", "object"},
                 {"properties", {{"name", {{"const", name}}}, {format.arguments_key, parameters}}},
                 {"required", {"name", format.arguments_key}}};
    branches.push_back(std::move(call));
  }
  // Named calls: one anyOf, so that each function's arguments get a rule of their own.
  const Json schema = branches.size() == 1 && !named ? branches[0] : Json{{"anyOf", branches}};
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
  const bool many = options.choice != ToolChoice::kFunction && options.parallel;
  std::string call(kCallRule);
  if (named) {
    call = "tool-call-named";
    if (Status s = AddNamedCallRule(format, chosen, call, &gbnf); !s.ok()) return s;
  }
  std::string calls;  // the calls, as the format frames them
  if (named) {  // DeepSeek: the calls one per line, all between the format's open and close
    calls = Literal(format.open) + " " + call + (many ? " ( \"\\n\" " + call + " )*" : "") + " " +
            Literal(format.close);
  } else if (format.array) {
    calls = Literal(std::string(format.open) + "[") + " " + call + (many ? " ( \", \" " + call + " )*" : "") + " \"]\"";
  } else if (*format.open == '\0') {
    calls = call;  // llama3_json: one call, the whole reply
  } else {
    const std::string one = Literal(std::string(format.open) + "\n") + " " + call + " " + Literal(std::string("\n") + format.close);
    calls = one + (many ? " ( \"\\n\" " + one + " )*" : "");
  }
  if (options.choice != ToolChoice::kAuto) return "root ::= " + calls + "\n" + gbnf;
  // auto, lazily: free text until the format's opening, then only well-formed calls of declared
  // functions to the end. A thought before the answer (<think>...</think>) is free, calls written
  // in it included: the reply parser does not read calls there.
  std::string lazy = NotContaining("tool-free-think", kThinkClose) + NotContaining("tool-free", format.open);
  lazy += "tool-think ::= [ \\t\\n]* \"<think>\" tool-free-think-0 \"</think>\"\n";
  if (*format.open == '\0') {
    // llama3_json: a reply starting with '{' (or Llama's tag) is a call; any other is text.
    lazy += "root ::= [ \\t\\n]* ( \"<|python_tag|>\"? " + calls + " | [^{ \\t\\n<] tool-any | \"<\" tool-any )?\n";
    lazy += "tool-any ::= .*\n";
  } else {
    // Nothing after the calls: once they close the grammar is done and the reply ends (free
    // whitespace there would let a model pad to max_tokens).
    const std::string answer = "tool-free-0 ( " + calls + " )?";
    lazy += options.starts_thinking ? "root ::= tool-free-think-0 ( \"</think>\" " + answer + " )?\n"
                                    : "root ::= tool-think? " + answer + "\n";
  }
  return lazy + gbnf;
}

}  // namespace kvq
