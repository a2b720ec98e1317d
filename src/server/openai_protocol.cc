// The OpenAI wire format (see openai_protocol.h): request bodies parsed and checked.
#include "server/openai_protocol.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string_view>

namespace kvq::server {
namespace {

// Ordered: tool definitions reach the template, which prints them with tojson, in the order sent.
using json = nlohmann::ordered_json;

ApiError Invalid(std::string param, std::string message) {
  return {.status = 400, .type = "invalid_request_error", .message = std::move(message), .param = std::move(param)};
}

// The JSON type of a value, as an error message names it.
const char* TypeName(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

std::optional<ApiError> WrongType(const std::string& field, const json& v, const char* expected) {
  return Invalid(field, fmt::format("'{}' must be {} (got {})", field, expected, TypeName(v)));
}

// A number field in [lo, hi] (open ends where `lo_open`/`hi_open`), or an error.
std::optional<ApiError> ReadNumber(const json& body, const char* field, double lo, double hi, bool lo_open,
                                   bool hi_open, float* out) {
  if (!body.contains(field) || body[field].is_null()) return std::nullopt;
  const json& v = body[field];
  if (!v.is_number()) return WrongType(field, v, "a number");
  const double x = v.get<double>();
  if (!std::isfinite(x) || (lo_open ? x <= lo : x < lo) || (hi_open ? x >= hi : x > hi)) {
    return Invalid(field, fmt::format("'{}' must be in {}{}, {}{} (got {})", field, lo_open ? "(" : "[", lo, hi,
                                      hi_open ? ")" : "]", x));
  }
  *out = static_cast<float>(x);
  return std::nullopt;
}

// An integer field in [lo, hi], or an error. Numbers with a fraction are not integers.
std::optional<ApiError> ReadInteger(const json& body, const char* field, int64_t lo, int64_t hi,
                                    std::optional<int64_t>* out) {
  if (!body.contains(field) || body[field].is_null()) return std::nullopt;
  const json& v = body[field];
  if (v.is_number_unsigned()) {
    const uint64_t x = v.get<uint64_t>();
    if (x > static_cast<uint64_t>(hi) || (lo > 0 && x < static_cast<uint64_t>(lo))) {
      return Invalid(field, fmt::format("'{}' must be in {}..{} (got {})", field, lo, hi, x));
    }
    *out = static_cast<int64_t>(x);
  } else if (v.is_number_integer()) {
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) return Invalid(field, fmt::format("'{}' must be in {}..{} (got {})", field, lo, hi, x));
    *out = x;
  } else if (v.is_number_float()) {
    return Invalid(field, fmt::format("'{}' must be an integer (got {})", field, v.get<double>()));
  } else {
    return WrongType(field, v, "an integer");
  }
  return std::nullopt;
}

// Text of a chat message's content: a string, null (an assistant turn with none), or an array of
// {"type": "text", "text": ...} parts joined by newlines (as vLLM joins them).
std::optional<ApiError> ReadContent(const json& content, const std::string& field, std::string* out) {
  if (content.is_null()) return std::nullopt;
  if (content.is_string()) {
    *out = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array()) return WrongType(field, content, "a string or an array of text parts");
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string where = fmt::format("{}[{}]", field, i);
    if (!part.is_object()) return WrongType(where, part, "an object");
    if (!part.contains("type") || part["type"] != "text") {
      return Invalid(where, fmt::format("'{}': only parts of type \"text\" are supported", where));
    }
    if (!part.contains("text") || !part["text"].is_string()) {
      return Invalid(where + ".text", fmt::format("'{}.text' must be a string", where));
    }
    if (i > 0) *out += "\n";
    *out += part["text"].get<std::string>();
  }
  return std::nullopt;
}

// A message's tool_calls ([{id, type: "function", function: {name, arguments}}]; arguments as
// OpenAI sends them, a string of JSON, or an object), tool_call_id and name.
std::optional<ApiError> ReadToolFields(const json& m, const std::string& where, ChatMessage* message) {
  if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
    const json& calls = m["tool_calls"];
    const std::string field = where + ".tool_calls";
    if (!calls.is_array()) return WrongType(field, calls, "an array");
    for (size_t k = 0; k < calls.size(); ++k) {
      const json& c = calls[k];
      const std::string at = fmt::format("{}[{}]", field, k);
      if (!c.is_object()) return WrongType(at, c, "an object");
      if (c.contains("type") && c["type"] != "function") {
        return Invalid(at + ".type", fmt::format("'{}.type' must be \"function\"", at));
      }
      if (!c.contains("function") || !c["function"].is_object()) {
        return Invalid(at + ".function", fmt::format("'{}.function' must be an object", at));
      }
      const json& f = c["function"];
      if (!f.contains("name") || !f["name"].is_string()) {
        return Invalid(at + ".function.name", fmt::format("'{}.function.name' must be a string", at));
      }
      ToolCall call{.id = "", .name = f["name"].get<std::string>(), .arguments = "{}"};
      if (c.contains("id") && !c["id"].is_null()) {
        if (!c["id"].is_string()) return WrongType(at + ".id", c["id"], "a string");
        call.id = c["id"].get<std::string>();
      }
      if (f.contains("arguments") && !f["arguments"].is_null()) {
        const json& a = f["arguments"];
        if (!a.is_string() && !a.is_object()) return WrongType(at + ".function.arguments", a, "a string of JSON");
        call.arguments = a.is_string() ? a.get<std::string>() : a.dump();
      }
      message->tool_calls.push_back(std::move(call));
    }
  }
  for (auto [key, out] : {std::pair{"tool_call_id", &message->tool_call_id}, std::pair{"name", &message->name}}) {
    if (!m.contains(key) || m[key].is_null()) continue;
    if (!m[key].is_string()) return WrongType(where + "." + key, m[key], "a string");
    *out = m[key].get<std::string>();
  }
  if (message->role == "tool" && message->tool_call_id.empty()) {
    return Invalid(where + ".tool_call_id", fmt::format("'{}.tool_call_id' is required in a message of role 'tool'", where));
  }
  return std::nullopt;
}

// tools, tool_choice ("auto", "none", "required" or {"type": "function", "function": {"name"}})
// and parallel_tool_calls, checked against each other (kvq/tool_calls.h's CheckTools).
std::optional<ApiError> ReadTools(const json& body, GenerationRequest* r) {
  auto given = [&](const char* field) { return body.contains(field) && !body[field].is_null(); };
  ToolOptions& t = r->tools;
  if (given("tools")) {
    if (!body["tools"].is_array()) return WrongType("tools", body["tools"], "an array of tool definitions");
    r->has_tools = !body["tools"].empty();
    t.tools_json = body["tools"].dump();
  }
  if (given("tool_choice")) {
    const json& c = body["tool_choice"];
    if (c == "auto") {
      t.choice = ToolChoice::kAuto;
    } else if (c == "none") {
      t.choice = ToolChoice::kNone;
    } else if (c == "required") {
      t.choice = ToolChoice::kRequired;
    } else if (c.is_object() && c.contains("function") && c["function"].is_object() && c["function"].contains("name") &&
               c["function"]["name"].is_string()) {
      t.choice = ToolChoice::kFunction;
      t.function = c["function"]["name"].get<std::string>();
    } else {
      return Invalid("tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                                    "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
  }
  if (given("parallel_tool_calls")) {
    if (!body["parallel_tool_calls"].is_boolean()) {
      return WrongType("parallel_tool_calls", body["parallel_tool_calls"], "a boolean");
    }
    t.parallel = body["parallel_tool_calls"].get<bool>();
  }
  if (!r->has_tools) {
    if (t.choice == ToolChoice::kRequired || t.choice == ToolChoice::kFunction) {
      return Invalid("tool_choice", "'tool_choice' asks for a call but 'tools' declares no function");
    }
    return std::nullopt;
  }
  if (Result<std::vector<std::string>> names = CheckTools(t); !names.ok()) {
    const bool choice = names.status().message().starts_with("tool_choice");
    return Invalid(choice ? "tool_choice" : "tools", names.status().message());
  }
  return std::nullopt;
}

std::optional<ApiError> ReadMessages(const json& body, const RequestLimits& limits, GenerationRequest* r) {
  if (!body.contains("messages")) return Invalid("messages", "'messages' is required");
  const json& messages = body["messages"];
  if (!messages.is_array()) return WrongType("messages", messages, "an array");
  if (messages.empty()) return Invalid("messages", "'messages' must hold at least one message");
  if (static_cast<int64_t>(messages.size()) > limits.max_messages) {
    return Invalid("messages", fmt::format("'messages' holds {} messages; at most {}", messages.size(),
                                           limits.max_messages));
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) return WrongType(where, m, "an object");
    if (!m.contains("role") || !m["role"].is_string()) {
      return Invalid(where + ".role", fmt::format("'{}.role' must be a string", where));
    }
    if (m.contains("function_call") && !m["function_call"].is_null()) {
      return Invalid(where + ".function_call",
                     fmt::format("'{}.function_call' (the deprecated form) is not supported; use 'tool_calls'", where));
    }
    ChatMessage message{.role = m["role"].get<std::string>(), .content = {}};
    // OpenAI's roles; anything else is a client's mistake a template would render silently.
    constexpr std::array<std::string_view, 5> kRoles = {"system", "developer", "user", "assistant", "tool"};
    if (std::find(kRoles.begin(), kRoles.end(), message.role) == kRoles.end()) {
      return Invalid(where + ".role", fmt::format("'{}.role' is '{}'; expected one of system, developer, user, "
                                                  "assistant, tool", where, message.role));
    }
    if (auto e = ReadToolFields(m, where, &message)) return e;
    // An assistant message that calls tools may leave content out (OpenAI sends null).
    if (!m.contains("content") && message.tool_calls.empty()) {
      return Invalid(where + ".content", fmt::format("'{}.content' is required", where));
    }
    if (m.contains("content")) {
      if (auto e = ReadContent(m["content"], where + ".content", &message.content)) return e;
    }
    r->messages.push_back(std::move(message));
  }
  if (body.contains("reasoning_format") && !body["reasoning_format"].is_null()) {
    const json& f = body["reasoning_format"];
    if (!f.is_string()) return WrongType("reasoning_format", f, "a string");
    Result<ReasoningFormat> format = ParseReasoningFormat(f.get<std::string>());
    if (!format.ok()) return Invalid("reasoning_format", "'reasoning_format': " + format.status().message());
    r->reasoning_format = *format;
  }
  if (body.contains("chat_template_kwargs")) {
    const json& kw = body["chat_template_kwargs"];
    if (!kw.is_object()) return WrongType("chat_template_kwargs", kw, "an object");
    if (kw.contains("enable_thinking")) {
      if (!kw["enable_thinking"].is_boolean()) {
        return WrongType("chat_template_kwargs.enable_thinking", kw["enable_thinking"], "a boolean");
      }
      r->enable_thinking = kw["enable_thinking"].get<bool>();
    }
  }
  return std::nullopt;
}

std::optional<ApiError> ReadPrompt(const json& body, GenerationRequest* r) {
  if (!body.contains("prompt")) return Invalid("prompt", "'prompt' is required");
  const json& p = body["prompt"];
  if (p.is_string()) {
    r->prompt = p.get<std::string>();
  } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
    r->prompt = p[0].get<std::string>();  // a batch of one prompt
  } else if (p.is_array()) {
    return Invalid("prompt", "'prompt' must be a string (or an array of exactly one string)");
  } else {
    return WrongType("prompt", p, "a string");
  }
  if (r->prompt.empty()) return Invalid("prompt", "'prompt' must not be empty");
  return std::nullopt;
}

std::optional<ApiError> ReadStop(const json& body, const RequestLimits& limits, GenerationRequest* r) {
  if (!body.contains("stop") || body["stop"].is_null()) return std::nullopt;
  const json& stop = body["stop"];
  std::vector<json> items;
  if (stop.is_string()) {
    items.push_back(stop);
  } else if (stop.is_array()) {
    items.assign(stop.begin(), stop.end());
  } else {
    return WrongType("stop", stop, "a string or an array of strings");
  }
  if (static_cast<int64_t>(items.size()) > limits.max_stop_strings) {
    return Invalid("stop", fmt::format("'stop' holds {} strings; at most {}", items.size(), limits.max_stop_strings));
  }
  for (const json& s : items) {
    if (!s.is_string()) return WrongType("stop", s, "a string");
    std::string text = s.get<std::string>();
    if (text.empty()) return Invalid("stop", "'stop' strings must not be empty");
    if (static_cast<int64_t>(text.size()) > limits.max_stop_bytes) {
      return Invalid("stop", fmt::format("a 'stop' string is {} bytes; at most {}", text.size(), limits.max_stop_bytes));
    }
    r->stop.push_back(std::move(text));
  }
  return std::nullopt;
}

// Fields kvq does not implement but that change the output: refused unless at their no-op value.
// OpenAI's, then llama.cpp's server's sampler fields (with the value that leaves its chain as is).
std::optional<ApiError> RefuseUnsupported(const json& body) {
  for (const char* field : {"functions", "function_call", "suffix"}) {
    if (body.contains(field) && !body[field].is_null() && !(body[field].is_object() && body[field].empty()) &&
        !(body[field].is_array() && body[field].empty()) && !(body[field] == "none") && !(body[field] == "")) {
      return Invalid(field, fmt::format("'{}' is not supported by kvq serve", field));
    }
  }
  for (const char* field : {"echo"}) {
    if (body.contains(field) && !body[field].is_null() && body[field] != false && body[field] != 0) {
      return Invalid(field, fmt::format("'{}' is not supported by kvq serve", field));
    }
  }
  if (body.contains("best_of") && !body["best_of"].is_null() && body["best_of"] != 1) {
    return Invalid("best_of", "'best_of' must be 1: kvq serve does not rank candidates (use 'n')");
  }
  static const std::pair<const char*, double> kLlamaNoOps[] = {
      {"typical_p", 1},       {"tfs_z", 1},          {"mirostat", 0},        {"dry_multiplier", 0},
      {"xtc_probability", 0}, {"top_n_sigma", -1},   {"dynatemp_range", 0},  {"n_probs", 0},
      {"penalty_last_n_dry", 0},
  };
  for (const auto& [field, no_op] : kLlamaNoOps) {
    if (body.contains(field) && !body[field].is_null() && !(body[field].is_number() && body[field].get<double>() == no_op)) {
      return Invalid(field, fmt::format("'{}' is not supported by kvq serve (only {})", field, no_op));
    }
  }
  for (const char* field : {"samplers", "dry_sequence_breakers", "lora", "image_data"}) {
    if (body.contains(field) && !body[field].is_null()) {
      return Invalid(field, fmt::format("'{}' is not supported by kvq serve", field));
    }
  }
  return std::nullopt;
}

// Penalties (OpenAI's frequency/presence, llama.cpp's repeat_penalty and repeat_last_n),
// logit_bias ({"id": bias} as OpenAI sends it, or llama.cpp's [[id, bias], ...]; ids are checked
// against the vocabulary by the server), logprobs/top_logprobs and n.
std::optional<ApiError> ReadSamplingExtras(Endpoint endpoint, const json& body, GenerationRequest* r) {
  SamplerOptions& s = r->sampling;
  if (auto e = ReadNumber(body, "frequency_penalty", -2, 2, false, false, &s.frequency_penalty)) return e;
  if (auto e = ReadNumber(body, "presence_penalty", -2, 2, false, false, &s.presence_penalty)) return e;
  if (auto e = ReadNumber(body, "repeat_penalty", 0, 100, true, false, &s.repeat_penalty)) return e;
  std::optional<int64_t> last_n, n;
  if (auto e = ReadInteger(body, "repeat_last_n", -1, std::numeric_limits<int32_t>::max(), &last_n)) return e;
  if (last_n) s.repeat_last_n = static_cast<int32_t>(*last_n);
  if (body.contains("logit_bias") && !body["logit_bias"].is_null()) {
    const json& b = body["logit_bias"];
    auto add = [&](const json& id, const json& bias, const std::string& where) -> std::optional<ApiError> {
      int64_t token = -1;
      if (id.is_number_integer()) {
        token = id.get<int64_t>();
      } else if (id.is_string()) {
        const std::string text = id.get<std::string>();
        char* end = nullptr;
        token = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || *end != '\0') token = -1;
      }
      if (token < 0 || token > std::numeric_limits<int32_t>::max()) {
        return Invalid("logit_bias", fmt::format("'{}': a key must be a token id (got {})", where, id.dump()));
      }
      if (bias.is_boolean()) {
        return Invalid("logit_bias", fmt::format("'{}': a boolean (llama.cpp's ban) is not supported; use -100", where));
      }
      if (!bias.is_number() || !std::isfinite(bias.get<double>()) || bias.get<double>() < -100 || bias.get<double>() > 100) {
        return Invalid("logit_bias", fmt::format("'{}' must be a number in [-100, 100] (got {})", where, bias.dump()));
      }
      s.logit_bias.emplace_back(static_cast<int32_t>(token), bias.get<float>());
      return std::nullopt;
    };
    if (b.is_object()) {
      for (const auto& [key, value] : b.items()) {
        if (auto e = add(json(key), value, "logit_bias." + key)) return e;
      }
    } else if (b.is_array()) {
      for (size_t i = 0; i < b.size(); ++i) {
        const std::string where = fmt::format("logit_bias[{}]", i);
        if (!b[i].is_array() || b[i].size() != 2) return Invalid("logit_bias", fmt::format("'{}' must be [token id, bias]", where));
        if (auto e = add(b[i][0], b[i][1], where)) return e;
      }
    } else {
      return WrongType("logit_bias", b, "an object mapping token ids to biases");
    }
  }
  if (endpoint == Endpoint::kChatCompletions) {
    if (body.contains("logprobs") && !body["logprobs"].is_null()) {
      if (!body["logprobs"].is_boolean()) return WrongType("logprobs", body["logprobs"], "a boolean");
      r->logprobs = body["logprobs"].get<bool>();
    }
    std::optional<int64_t> top;
    if (auto e = ReadInteger(body, "top_logprobs", 0, 20, &top)) return e;
    if (top && !r->logprobs) return Invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r->top_logprobs = static_cast<int32_t>(top.value_or(0));
  } else {
    std::optional<int64_t> top;
    if (auto e = ReadInteger(body, "logprobs", 0, 5, &top)) return e;
    r->logprobs = top.has_value();
    r->top_logprobs = static_cast<int32_t>(top.value_or(0));
  }
  if (auto e = ReadInteger(body, "n", 1, 16, &n)) return e;
  if (n) r->n = static_cast<int32_t>(*n);
  return std::nullopt;
}

// grammar (GBNF), json_schema (a schema) or response_format ({"type": "text" | "json_object" |
// "json_schema", "json_schema": {"schema": ...}}): at most one, turned into r->grammar and checked,
// so that a bad one is a 400 naming its field.
// `spec` and llama-server's `speculative.n_max`, `.n_min`, `.p_min` (keys with a dot in them).
std::optional<ApiError> ReadSpeculation(const json& body, GenerationRequest* r) {
  if (body.contains("spec") && !body["spec"].is_null()) {
    const json& v = body["spec"];
    if (!v.is_string()) return WrongType("spec", v, "a string");
    Result<DraftSource> source = ParseDraftSource(v.get<std::string>());
    if (!source.ok()) return Invalid("spec", "'spec': " + source.status().message());
    r->spec = *source;
  }
  std::optional<int64_t> n_max, n_min;
  if (auto e = ReadInteger(body, "speculative.n_max", 0, 64, &n_max)) return e;
  if (auto e = ReadInteger(body, "speculative.n_min", 0, 64, &n_min)) return e;
  if (n_max && n_min && *n_min > *n_max) {
    return Invalid("speculative.n_min", fmt::format("'speculative.n_min' ({}) must be at most 'speculative.n_max' ({})",
                                                    *n_min, *n_max));
  }
  if (n_max) r->spec_n_max = static_cast<int32_t>(*n_max);
  if (n_min) r->spec_n_min = static_cast<int32_t>(*n_min);
  float p_min = 0;
  if (auto e = ReadNumber(body, "speculative.p_min", 0, 1, true, false, &p_min)) return e;
  if (body.contains("speculative.p_min") && !body["speculative.p_min"].is_null()) r->spec_p_min = p_min;
  return std::nullopt;
}

std::optional<ApiError> ReadGrammar(const json& body, GenerationRequest* r) {
  auto given = [&](const char* field) { return body.contains(field) && !body[field].is_null(); };
  int count = 0;
  for (const char* field : {"grammar", "json_schema", "response_format"}) count += given(field) ? 1 : 0;
  if (count > 1) {
    return Invalid("grammar", "give at most one of 'grammar', 'json_schema' and 'response_format'");
  }
  std::string field;
  auto from_schema = [&](const json& schema, const std::string& where) -> std::optional<ApiError> {
    if (!schema.is_object() && !schema.is_boolean()) return WrongType(where, schema, "a JSON Schema (an object)");
    Result<std::string> gbnf = JsonSchemaGrammar(schema.dump());
    if (!gbnf.ok()) return Invalid(where, fmt::format("'{}': {}", where, gbnf.status().message()));
    r->grammar = std::move(gbnf).value();
    return std::nullopt;
  };
  if (given("grammar")) {
    field = "grammar";
    if (!body["grammar"].is_string()) return WrongType("grammar", body["grammar"], "a string (GBNF)");
    r->grammar = body["grammar"].get<std::string>();
  } else if (given("json_schema")) {
    field = "json_schema";
    if (auto e = from_schema(body["json_schema"], "json_schema")) return e;
  } else if (given("response_format")) {
    field = "response_format";
    const json& rf = body["response_format"];
    if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string()) {
      return WrongType("response_format", rf, "an object with a 'type' string");
    }
    const std::string type = rf["type"].get<std::string>();
    if (type == "text") return std::nullopt;
    if (type == "json_object") {
      r->grammar = JsonObjectGrammar();
    } else if (type == "json_schema") {
      if (!rf.contains("json_schema") || !rf["json_schema"].is_object() || !rf["json_schema"].contains("schema")) {
        return Invalid("response_format", "'response_format' of type 'json_schema' needs 'json_schema': {\"schema\": {...}}");
      }
      if (auto e = from_schema(rf["json_schema"]["schema"], "response_format.json_schema.schema")) return e;
    } else {
      return Invalid("response_format",
                     fmt::format("'response_format.type' is '{}'; expected 'text', 'json_object' or 'json_schema'", type));
    }
  }
  if (!r->grammar.empty()) {
    if (Status s = Generator::Check({.grammar = r->grammar}); !s.ok()) {
      return Invalid(field, fmt::format("'{}': {}", field, s.message()));
    }
  }
  return std::nullopt;
}

std::optional<ApiError> Parse(Endpoint endpoint, const json& body, const RequestLimits& limits, GenerationRequest* r) {
  r->endpoint = endpoint;
  if (body.contains("model") && !body["model"].is_null()) {
    if (!body["model"].is_string()) return WrongType("model", body["model"], "a string");
    r->model = body["model"].get<std::string>();
  }
  if (auto e = RefuseUnsupported(body)) return e;
  if (auto e = endpoint == Endpoint::kChatCompletions ? ReadMessages(body, limits, r) : ReadPrompt(body, r)) return e;
  if (endpoint == Endpoint::kChatCompletions) {
    if (auto e = ReadTools(body, r)) return e;
  } else {
    for (const char* field : {"tools", "tool_choice", "parallel_tool_calls"}) {
      if (body.contains(field) && !body[field].is_null()) {
        return Invalid(field, fmt::format("'{}' belongs to /v1/chat/completions", field));
      }
    }
  }
  std::optional<int64_t> max_tokens;
  // max_completion_tokens is the chat endpoint's newer name for max_tokens.
  // n_predict is llama.cpp's name for it (-1 there: no limit, as leaving it out is here).
  if (body.contains("n_predict") && body["n_predict"] == -1) {
    // the default
  } else if (auto e = ReadInteger(body, "n_predict", 1, limits.max_tokens_limit, &max_tokens)) {
    return e;
  }
  for (const char* field : {"max_tokens", "max_completion_tokens"}) {
    if (auto e = ReadInteger(body, field, 1, limits.max_tokens_limit, &max_tokens)) {
      if (e->message.find("must be in") != std::string::npos) {
        e->message += fmt::format(" (this server's --max-tokens limit is {})", limits.max_tokens_limit);
      }
      return e;
    }
  }
  if (max_tokens) r->max_tokens = static_cast<int32_t>(*max_tokens);
  if (auto e = ReadStop(body, limits, r)) return e;
  if (auto e = ReadGrammar(body, r)) return e;
  if (!r->grammar.empty() && r->has_tools &&
      (r->tools.choice == ToolChoice::kRequired || r->tools.choice == ToolChoice::kFunction)) {
    return Invalid("tool_choice", "a forced tool call has its own grammar: give 'tool_choice' \"required\" or a "
                                  "function, or a grammar/json_schema/response_format, not both");
  }
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean()) return WrongType("stream", body["stream"], "a boolean");
    r->stream = body["stream"].get<bool>();
  }
  if (auto e = ReadSpeculation(body, r)) return e;
  if (body.contains("ignore_eos") && !body["ignore_eos"].is_null()) {
    if (!body["ignore_eos"].is_boolean()) return WrongType("ignore_eos", body["ignore_eos"], "a boolean");
    r->ignore_eos = body["ignore_eos"].get<bool>();
  }
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const json& so = body["stream_options"];
    if (!so.is_object()) return WrongType("stream_options", so, "an object");
    if (so.contains("include_usage")) {
      if (!so["include_usage"].is_boolean()) {
        return WrongType("stream_options.include_usage", so["include_usage"], "a boolean");
      }
      r->include_usage = so["include_usage"].get<bool>();
    }
  }
  SamplerOptions& s = r->sampling;
  if (auto e = ReadNumber(body, "temperature", 0, 2, false, false, &s.temperature)) return e;
  if (auto e = ReadNumber(body, "top_p", 0, 1, true, false, &s.top_p)) return e;
  if (auto e = ReadNumber(body, "min_p", 0, 1, false, true, &s.min_p)) return e;
  std::optional<int64_t> top_k, seed;
  if (auto e = ReadInteger(body, "top_k", 0, std::numeric_limits<int32_t>::max(), &top_k)) return e;
  if (top_k) s.top_k = static_cast<int32_t>(*top_k);
  if (auto e = ReadSamplingExtras(endpoint, body, r)) return e;
  if (auto e = ReadInteger(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                           &seed)) {
    return e;
  }
  // -1 is llama.cpp's server's "random" (its default), as `kvq run --seed -1` is: the same request
  // then means the same thing on both. Every other integer is a seed of those 64 bits.
  if (seed && *seed != -1) {
    s.seed = static_cast<uint64_t>(*seed);
    r->seed_given = true;
  } else {
    static thread_local std::mt19937_64 fresh{std::random_device{}()};
    s.seed = fresh();
  }
  return std::nullopt;
}

}  // namespace

std::variant<GenerationRequest, ApiError> ParseGenerationRequest(Endpoint endpoint, std::string_view body,
                                                                 const RequestLimits& limits) {
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return Invalid("", "the request body is not valid JSON");
  if (!parsed.is_object()) return Invalid("", fmt::format("the request body must be a JSON object (got {})", TypeName(parsed)));
  GenerationRequest r;
  if (std::optional<ApiError> e = Parse(endpoint, parsed, limits, &r)) return *e;
  return r;
}

}  // namespace kvq::server
