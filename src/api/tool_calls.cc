// Tool-call formats and parsing (include/kvq/tool_calls.h); their grammars: tool_call_grammar.cc.
#include "kvq/tool_calls.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

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

size_t LeadingSpace(std::string_view text) {
  size_t n = 0;
  while (n < text.size() && IsSpace(text[n])) ++n;
  return n;
}

// The start of a call written name first: `{"name": "f", "arguments": ` up to the arguments'
// opening '{' (whitespace anywhere JSON allows it; the arguments key may be either family's).
struct CallHeader {
  enum Match { kNeedMore, kNo, kYes } match = kNeedMore;
  size_t arguments_at = 0;  // offset of the arguments' '{'
  std::string name;
};

CallHeader MatchCallHeader(std::string_view s, const ToolCallFormat& format) {
  size_t i = 0;
  auto space = [&] { i += LeadingSpace(s.substr(i)); };
  auto expect = [&](char c) {
    space();
    if (i >= s.size()) return CallHeader::kNeedMore;
    if (s[i] != c) return CallHeader::kNo;
    ++i;
    return CallHeader::kYes;
  };
  auto string = [&](std::string* out) {
    space();
    if (i >= s.size()) return CallHeader::kNeedMore;
    if (s[i] != '"') return CallHeader::kNo;
    size_t j = i + 1;
    for (bool escaped = false; j < s.size(); ++j) {
      if (escaped) {
        escaped = false;
      } else if (s[j] == '\\') {
        escaped = true;
      } else if (s[j] == '"') {
        break;
      }
    }
    if (j >= s.size()) return CallHeader::kNeedMore;
    const Json v = Json::parse(s.substr(i, j + 1 - i), nullptr, false);
    if (v.is_discarded() || !v.is_string()) return CallHeader::kNo;
    *out = v.get<std::string>();
    i = j + 1;
    return CallHeader::kYes;
  };
  CallHeader h;
  std::string key, arguments_key;
  for (auto step : std::initializer_list<std::function<CallHeader::Match()>>{
           [&] { return expect('{'); },
           [&] { return string(&key); },
           [&] { return key == "name" ? CallHeader::kYes : CallHeader::kNo; },
           [&] { return expect(':'); },
           [&] { return string(&h.name); },
           [&] { return h.name.empty() ? CallHeader::kNo : CallHeader::kYes; },
           [&] { return expect(','); },
           [&] { return string(&arguments_key); },
           [&] {
             return arguments_key == format.arguments_key || arguments_key == "arguments" ||
                            arguments_key == "parameters"
                        ? CallHeader::kYes
                        : CallHeader::kNo;
           },
           [&] { return expect(':'); },
           [&] {
             space();
             return i >= s.size() ? CallHeader::kNeedMore : s[i] == '{' ? CallHeader::kYes : CallHeader::kNo;
           }}) {
    h.match = step();
    if (h.match != CallHeader::kYes) return h;
  }
  h.arguments_at = i;
  return h;
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
     .why = "DeepSeek V2.5/V3 write each call as <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME, then the "
            "arguments in a ```json block, then <｜tool▁call▁end｜> (the name outside the JSON), which kvq's "
            "call grammar and parser do not read yet; and their template renders an earlier call only for a "
            "message whose content is null and whose arguments are a string"},
};

}  // namespace

Status CheckToolCallTemplate(const Model& model, std::string_view template_override) {
  const std::string_view source = !template_override.empty()                    ? template_override
                                  : model.chat_template_choice().chatml_fallback ? std::string_view()
                                                                                 : model.info().chat_template;
  for (const UnsupportedToolFormat& f : kUnsupported) {
    if (source.find(f.detect) != std::string_view::npos) {
      return Status::Error(fmt::format("the chat template writes tool calls in the '{}' format (it holds {}), "
                                       "which kvq does not support: {}", f.name, f.detect, f.why));
    }
  }
  return Status::Ok();
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
  for (const ToolCall& c : calls) {
    out->chunks.push_back({.index = calls_++, .id = c.id, .name = c.name, .arguments = c.arguments});
  }
  out->calls.insert(out->calls.end(), calls.begin(), calls.end());
  return true;
}

bool ToolCallParser::DrainCall(bool final, Delta* out) {
  const std::string_view open = format_->open, close = format_->close;
  for (;;) {
    switch (part_) {
      case Part::kArrayOpen: {
        const size_t at = LeadingSpace(buffer_);
        if (at == buffer_.size() && !final) return false;
        if (at == buffer_.size() || buffer_[at] != '[') {
          part_ = Part::kWhole;
          continue;
        }
        region_ += buffer_.substr(0, at + 1);
        buffer_.erase(0, at + 1);
        part_ = Part::kHeader;
        continue;
      }
      case Part::kHeader: {
        if (open.empty()) {  // llama3_json: the tag some replies put before the call is framing
          const size_t at = LeadingSpace(buffer_);
          if (std::string_view(buffer_).substr(at).starts_with(kPythonTag)) {
            region_ += buffer_.substr(0, at + kPythonTag.size());
            buffer_.erase(0, at + kPythonTag.size());
          }
        }
        const CallHeader h = MatchCallHeader(buffer_, *format_);
        if (h.match == CallHeader::kNeedMore && !final) return false;
        if (h.match != CallHeader::kYes) {
          part_ = Part::kWhole;
          continue;
        }
        // Committed: the call's id and name go out now, its arguments as they come.
        current_ = ToolCall{.id = NewToolCallId(*format_), .name = h.name, .arguments = ""};
        out->chunks.push_back({.index = calls_++, .id = current_.id, .name = current_.name, .arguments = ""});
        buffer_.erase(0, h.arguments_at);
        region_.clear();
        depth_ = 0;
        in_string_ = escape_ = false;
        part_ = Part::kArguments;
        continue;
      }
      case Part::kArguments: {
        size_t n = 0;
        bool done = false;
        while (n < buffer_.size() && !done) {
          const char c = buffer_[n++];
          if (in_string_) {
            if (escape_) {
              escape_ = false;
            } else if (c == '\\') {
              escape_ = true;
            } else if (c == '"') {
              in_string_ = false;
            }
          } else if (c == '"') {
            in_string_ = true;
          } else if (c == '{' || c == '[') {
            ++depth_;
          } else if ((c == '}' || c == ']') && --depth_ == 0) {
            done = true;
          }
        }
        if (n > 0) {
          current_.arguments += buffer_.substr(0, n);
          // The call's first chunk holds no arguments, as OpenAI's first delta of a call.
          if (out->chunks.empty() || out->chunks.back().index != calls_ - 1 || !out->chunks.back().id.empty()) {
            out->chunks.push_back({.index = calls_ - 1});
          }
          out->chunks.back().arguments += buffer_.substr(0, n);
          buffer_.erase(0, n);
        }
        if (!done && !final) return false;
        out->calls.push_back(current_);  // cut short at the end: the arguments written so far
        if (!done) return true;
        part_ = Part::kTail;
        closed_brace_ = false;
        streamed_any_ = true;
        continue;
      }
      case Part::kTail: {  // the call's '}', then the framing; anything else ends the region
        const size_t at = LeadingSpace(buffer_);
        if (at == buffer_.size()) {
          if (!final) return false;
          buffer_.clear();
          return true;
        }
        const std::string_view rest = std::string_view(buffer_).substr(at);
        if (!closed_brace_) {
          if (rest[0] != '}') return true;
          closed_brace_ = true;
          buffer_.erase(0, at + 1);
          continue;
        }
        if (format_->array) {
          if (rest[0] == ',' || rest[0] == ']') {
            part_ = rest[0] == ',' ? Part::kHeader : part_;
            buffer_.erase(0, at + 1);
            if (part_ == Part::kHeader) continue;
          }
          return true;
        }
        if (!close.empty()) {
          if (rest.starts_with(close)) {
            buffer_.erase(0, at + close.size());
            return true;
          }
          if (close.starts_with(rest)) {  // the closing tag, begun
            if (!final) return false;
            buffer_.clear();
          }
        }
        return true;
      }
      case Part::kWhole: {  // held until the region ends, then parsed whole
        region_ += buffer_;
        buffer_.clear();
        const size_t body = !open.empty() && region_.starts_with(open) ? open.size() : 0;
        if (!close.empty()) {
          const size_t at = region_.find(close, body);
          if (at == std::string::npos) {
            if (!final) return false;
            out->content += region_;  // never closed: what was written is content
            return true;
          }
          const size_t end = at + close.size();
          if (!ParseCalls(std::string_view(region_).substr(body, at - body), out)) out->content += region_.substr(0, end);
          buffer_ = region_.substr(end);
          return true;
        }
        if (!final) return false;  // the calls run to the end of the reply
        std::string_view text(region_);
        text.remove_prefix(body);
        text.remove_prefix(LeadingSpace(text));
        if (open.empty() && text.starts_with(kPythonTag)) text.remove_prefix(kPythonTag.size());
        if (!ParseCalls(text, out)) out->content += region_;
        return true;
      }
    }
  }
}

void ToolCallParser::Drain(bool final, Delta* out) {
  const std::string_view open = format_->open;
  // Content is released as soon as it cannot begin a call; whitespace just before a call or at
  // the end of a reply that called (the separator models put around calls) is not content.
  auto release = [&](size_t n, bool drop_trailing_space) {
    std::string_view text(buffer_.data(), n);
    if (drop_trailing_space) text.remove_suffix(TrailingSpace(text));
    out->content += text;
    buffer_.erase(0, n);
  };
  for (;;) {
    if (in_call_) {
      if (!DrainCall(final, out)) return;
      in_call_ = false;
      region_.clear();
      continue;
    }
    if (open.empty() && !decided_) {  // llama3_json: the reply is a call when it starts with one
      const size_t first = buffer_.find_first_not_of(" \n\t\r");
      if (first == std::string::npos && !final) return;
      const std::string_view rest = first == std::string::npos ? "" : std::string_view(buffer_).substr(first);
      if (!final && kPythonTag.starts_with(rest) && rest.size() < kPythonTag.size()) return;
      decided_ = true;
      if (rest.starts_with(kPythonTag) || rest.starts_with("{")) {
        in_call_ = true;
        part_ = Part::kHeader;
        continue;
      }
    }
    const size_t at = open.empty() ? std::string::npos : buffer_.find(open);
    if (at != std::string::npos) {
      release(at, true);
      region_ = std::string(open);
      buffer_.erase(0, open.size());
      in_call_ = true;
      part_ = format_->array ? Part::kArrayOpen : Part::kHeader;
      continue;
    }
    if (final) {
      release(buffer_.size(), calls_ > 0 && TrailingSpace(buffer_) == buffer_.size());
      return;
    }
    // Hold a possible start of `open`, and trailing whitespace (it may precede a call, or end a
    // reply that called).
    const size_t partial = open.empty() ? 0 : PartialMarker(buffer_, open);
    const size_t hold = partial + TrailingSpace(std::string_view(buffer_).substr(0, buffer_.size() - partial));
    if (buffer_.size() > hold) release(buffer_.size() - hold, false);
    return;
  }
}

ToolCallParser::Delta ParseToolCalls(const ToolCallFormat& format, std::string_view text) {
  ToolCallParser parser(format);
  ToolCallParser::Delta all = parser.Add(text);
  ToolCallParser::Delta end = parser.Finish();
  all.content += end.content;
  all.calls.insert(all.calls.end(), end.calls.begin(), end.calls.end());
  all.chunks.insert(all.chunks.end(), end.chunks.begin(), end.chunks.end());
  return all;
}

ReplyParser::ReplyParser(ReasoningFormat reasoning, bool starts_thinking, const ToolCallFormat* calls)
    : reasoning_(reasoning, starts_thinking) {
  if (calls != nullptr) calls_.emplace(*calls);
}

ReplyParser::Delta ReplyParser::Split(ReasoningParser::Delta r, bool final) {
  Delta d{.reasoning = std::move(r.reasoning), .content = std::move(r.content), .calls = {}, .chunks = {}};
  if (!calls_) return d;
  ToolCallParser::Delta c = calls_->Add(d.content);
  if (final) {
    ToolCallParser::Delta end = calls_->Finish();
    c.content += end.content;
    c.calls.insert(c.calls.end(), end.calls.begin(), end.calls.end());
    c.chunks.insert(c.chunks.end(), end.chunks.begin(), end.chunks.end());
  }
  d.content = std::move(c.content);
  d.calls = std::move(c.calls);
  d.chunks = std::move(c.chunks);
  return d;
}

ReplyParser::Delta ReplyParser::Add(std::string_view text) { return Split(reasoning_.Add(text), false); }

ReplyParser::Delta ReplyParser::Finish() { return Split(reasoning_.Finish(), true); }

ReplyParser::Delta SplitReply(ReasoningFormat reasoning, bool starts_thinking, const ToolCallFormat* calls,
                              std::string_view text) {
  ReplyParser parser(reasoning, starts_thinking, calls);
  ReplyParser::Delta all = parser.Add(text);
  ReplyParser::Delta end = parser.Finish();
  all.reasoning += end.reasoning;
  all.content += end.content;
  all.calls.insert(all.calls.end(), end.calls.begin(), end.calls.end());
  all.chunks.insert(all.chunks.end(), end.chunks.begin(), end.chunks.end());
  return all;
}

}  // namespace kvq
