// Finding tool calls in replies (include/kvq/tool_calls.h's parsers); the formats' table:
// tool_call_formats.cc; their grammars: tool_call_grammar.cc.
#include "kvq/tool_calls.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>

namespace kvq {
namespace {

// Ordered: a call's arguments keep the model's key order.
using Json = nlohmann::ordered_json;

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

// The start of a call whose name is outside the JSON (NamedCalls): `call_open` NAME `name_end`, up
// to the arguments' first byte; the name runs to name_end's first byte.
CallHeader MatchNamedHeader(std::string_view s, const ToolCallFormat& format) {
  constexpr size_t kMaxName = 256;  // longer, it is not a function's name
  CallHeader h;
  const std::string_view open = format.call_open, end = format.name_end;
  const size_t at = LeadingSpace(s);
  const std::string_view rest = s.substr(at);
  if (rest.size() < open.size() || !rest.starts_with(open)) {
    h.match = rest.size() < open.size() && open.starts_with(rest) ? CallHeader::kNeedMore
                                                                  : CallHeader::kNo;
    return h;
  }
  const std::string_view after = rest.substr(open.size());
  const size_t name_size = after.find(end[0]);
  if (name_size == std::string_view::npos) {
    h.match = after.size() > kMaxName ? CallHeader::kNo : CallHeader::kNeedMore;
    return h;
  }
  const std::string_view tail = after.substr(name_size);
  if (tail.size() < end.size()) {
    h.match = end.starts_with(tail) ? CallHeader::kNeedMore : CallHeader::kNo;
    return h;
  }
  if (!tail.starts_with(end) || name_size == 0 || name_size > kMaxName) {
    h.match = CallHeader::kNo;
    return h;
  }
  h.name = std::string(after.substr(0, name_size));
  h.arguments_at = at + open.size() + name_size + end.size();
  h.match = CallHeader::kYes;
  return h;
}

CallHeader MatchCallHeader(std::string_view s, const ToolCallFormat& format) {
  if (NamedCalls(format)) return MatchNamedHeader(s, format);
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

ToolCallParser::ToolCallParser(const ToolCallFormat& format)
    : format_(&format), preserved_(PreservedTokens(format)) {}

void ToolCallParser::AddContent(std::string_view text, Delta* out) const {
  for (;;) {
    size_t at = std::string_view::npos, size = 0;
    for (const std::string& p : preserved_) {
      if (const size_t i = text.find(p); i < at) {
        at = i;
        size = p.size();
      }
    }
    if (at == std::string_view::npos) break;
    out->content += text.substr(0, at);
    text.remove_prefix(at + size);
  }
  out->content += text;
}

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
  // A named call (DeepSeek) is only ever read as it streams: its header matched or it is not one.
  if (NamedCalls(*format_)) return false;
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
        if (NamedCalls(*format_)) {
          const int state = NamedTail(final);
          if (state < 0) return false;
          if (state == 0) return true;
          part_ = Part::kHeader;
          continue;
        }
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
            AddContent(region_, out);  // never closed: what was written is content
            return true;
          }
          const size_t end = at + close.size();
          if (!ParseCalls(std::string_view(region_).substr(body, at - body), out)) {
            AddContent(std::string_view(region_).substr(0, end), out);
          }
          buffer_ = region_.substr(end);
          return true;
        }
        if (!final) return false;  // the calls run to the end of the reply
        std::string_view text(region_);
        text.remove_prefix(body);
        text.remove_prefix(LeadingSpace(text));
        if (open.empty() && text.starts_with(kPythonTag)) text.remove_prefix(kPythonTag.size());
        if (!ParseCalls(text, out)) AddContent(region_, out);
        return true;
      }
    }
  }
}

int ToolCallParser::NamedTail(bool final) {
  // call_close begins with the line break before the ```; whitespace is free around the framing.
  std::string_view call_close = format_->call_close;
  call_close.remove_prefix(LeadingSpace(call_close));
  const std::string_view call_open = format_->call_open, close = format_->close;
  const size_t at = LeadingSpace(buffer_);
  const std::string_view rest = std::string_view(buffer_).substr(at);
  if (!closed_brace_) {  // here: the call's closing
    if (rest.starts_with(call_close)) {
      buffer_.erase(0, at + call_close.size());
      closed_brace_ = true;
      return NamedTail(final);
    }
    if (call_close.starts_with(rest) && !final) return -1;
    if (final && call_close.starts_with(rest)) buffer_.clear();
    return 0;
  }
  if (rest.starts_with(close)) {
    buffer_.erase(0, at + close.size());
    return 0;
  }
  if (rest.starts_with(call_open)) return 1;
  if ((close.starts_with(rest) || call_open.starts_with(rest)) && !final) return -1;
  if (final && (rest.empty() || close.starts_with(rest))) buffer_.clear();
  return 0;
}

void ToolCallParser::Drain(bool final, Delta* out) {
  const std::string_view open = format_->open;
  // Content is released as soon as it cannot begin a call; whitespace just before a call or at
  // the end of a reply that called (the separator models put around calls) is not content.
  auto release = [&](size_t n, bool drop_trailing_space) {
    std::string_view text(buffer_.data(), n);
    if (drop_trailing_space) text.remove_suffix(TrailingSpace(text));
    AddContent(text, out);
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
    size_t partial = open.empty() ? 0 : PartialMarker(buffer_, open);
    for (const std::string& p : preserved_) partial = std::max(partial, PartialMarker(buffer_, p));
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
