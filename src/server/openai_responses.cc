// The OpenAI wire format's responses (see openai_protocol.h): bodies, stream chunks, errors.
#include <fmt/format.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "server/openai_protocol.h"

namespace kvq::server {
namespace {

// Ordered: objects are written in the order OpenAI documents their fields.
using json = nlohmann::ordered_json;

json UsageObject(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

// llama-server's field names; the per-token and per-second figures derived here, once. The
// speculation counts only when a draft ran, as llama-server does.
json TimingsObject(const Timings& t) {
  const int64_t steps = t.predicted_n - 1;
  json out = {{"cache_n", t.cache_n},
                 {"prompt_n", t.prompt_n},
                 {"prompt_ms", t.prompt_ms},
                 {"prompt_per_token_ms", t.prompt_n > 0 ? t.prompt_ms / static_cast<double>(t.prompt_n) : 0.0},
                 {"prompt_per_second", t.prompt_ms > 0 ? static_cast<double>(t.prompt_n) * 1e3 / t.prompt_ms : 0.0},
                 {"predicted_n", t.predicted_n},
                 {"predicted_ms", t.predicted_ms},
                 {"predicted_per_token_ms", steps > 0 ? t.predicted_ms / static_cast<double>(steps) : 0.0},
                 {"predicted_per_second", t.predicted_per_second()}};
  if (t.draft_n > 0) {
    out["draft_n"] = t.draft_n;
    out["draft_n_accepted"] = t.draft_n_accepted;
  }
  return out;
}

json Envelope(Endpoint endpoint, const ResponseMeta& meta, bool chunk) {
  const char* object = endpoint == Endpoint::kChatCompletions ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                               : "text_completion";
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model},
          {"system_fingerprint", "kvq"}};
}

// OpenAI's tool_calls: [{id, type, function: {name, arguments}}], with "index" in stream deltas.
json ToolCallsJson(std::span<const ToolCall> calls, int first_index, bool indexed) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", calls[i].id},
              {"type", "function"},
              {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (indexed) c["index"] = first_index + static_cast<int>(i);
    out.push_back(std::move(c));
  }
  return out;
}

// Invalid UTF-8 (a model can emit any bytes) is replaced, never thrown on.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

double Timings::predicted_per_second() const {
  return predicted_n > 1 && predicted_ms > 0 ? static_cast<double>(predicted_n - 1) * 1e3 / predicted_ms : 0.0;
}

Timings TimingsOf(const Usage& usage, double ttft_seconds, double total_seconds) {
  const double first_ms = (ttft_seconds > 0 ? ttft_seconds : total_seconds) * 1e3;
  return {.cache_n = usage.cached_tokens,
          .prompt_n = usage.prompt_tokens - usage.cached_tokens,
          .prompt_ms = first_ms,
          .predicted_n = usage.completion_tokens,
          .predicted_ms = std::max(0.0, total_seconds * 1e3 - first_ms),
          .draft_n = usage.drafted_tokens,
          .draft_n_accepted = usage.accepted_tokens};
}

std::string ApiError::Json() const {
  json error = {{"message", message}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)},
                {"code", code.empty() ? json(nullptr) : json(code)}};
  return Dump(json{{"error", error}});
}

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kToolCalls: return "tool_calls";
  }
  return "stop";
}

FinishReason OpenAiFinishReason(kvq::FinishReason reason) {
  return reason == kvq::FinishReason::kLength || reason == kvq::FinishReason::kContext ? FinishReason::kLength
                                                                                         : FinishReason::kStop;
}

json LogprobsJson(Endpoint endpoint, std::span<const LogprobEntry> entries, size_t text_offset) {
  auto bytes = [](const std::string& t) {
    json b = json::array();
    for (unsigned char c : t) b.push_back(c);
    return b;
  };
  if (endpoint == Endpoint::kChatCompletions) {
    json content = json::array();
    for (const LogprobEntry& e : entries) {
      json top = json::array();
      for (const auto& [t, lp] : e.top) top.push_back({{"token", t}, {"logprob", lp}, {"bytes", bytes(t)}});
      content.push_back({{"token", e.token}, {"logprob", e.logprob}, {"bytes", bytes(e.token)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const LogprobEntry& e : entries) {
    tokens.push_back(e.token);
    lps.push_back(e.logprob);
    json top = json::object();
    for (const auto& [t, lp] : e.top) {
      if (!top.contains(t)) top[t] = lp;  // an object: two tokens of one text keep the likelier
    }
    tops.push_back(top);
    offsets.push_back(text_offset);
    text_offset += e.token.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

std::string CompletionJson(Endpoint endpoint, const ResponseMeta& meta, std::span<const ChoiceResult> choices,
                           const Usage& usage, bool with_logprobs, const Timings* timings) {
  json r = Envelope(endpoint, meta, false);
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    json choice = {{"index", i}, {"finish_reason", FinishReasonName(c.finish)}};
    if (endpoint == Endpoint::kChatCompletions) {
      choice["message"] = {{"role", "assistant"},
                           {"content", c.calls.empty() || !c.text.empty() ? json(c.text) : json(nullptr)}};
      if (!c.reasoning.empty()) choice["message"]["reasoning_content"] = c.reasoning;
      if (!c.calls.empty()) choice["message"]["tool_calls"] = ToolCallsJson(c.calls, 0, false);
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = with_logprobs ? LogprobsJson(endpoint, c.logprobs, 0) : json(nullptr);
    list.push_back(std::move(choice));
  }
  r["choices"] = std::move(list);
  r["usage"] = UsageObject(usage);
  if (timings != nullptr) r["timings"] = TimingsObject(*timings);
  return Dump(r);
}

std::string CompletionJson(Endpoint endpoint, const ResponseMeta& meta, const std::string& text, FinishReason finish,
                           const Usage& usage, std::span<const ToolCall> calls) {
  const ChoiceResult choice{.text = text, .finish = finish, .calls = {calls.begin(), calls.end()}, .logprobs = {}};
  return CompletionJson(endpoint, meta, std::span<const ChoiceResult>(&choice, 1), usage, false);
}

std::string StreamChunkJson(Endpoint endpoint, const ResponseMeta& meta, const ChunkDelta& delta, bool role_chunk,
                            std::optional<FinishReason> finish, const Usage* usage, bool with_logprobs,
                            size_t text_offset, const Timings* timings, int choice_index) {
  json r = Envelope(endpoint, meta, true);
  json choice = {{"index", choice_index}, {"finish_reason", finish ? json(FinishReasonName(*finish)) : json(nullptr)}};
  if (endpoint == Endpoint::kChatCompletions) {
    json d = json::object();
    if (role_chunk) d["role"] = "assistant";
    if (!delta.text.empty() || role_chunk) d["content"] = delta.text;
    if (!delta.reasoning.empty()) d["reasoning_content"] = delta.reasoning;
    if (!delta.calls.empty()) {
      json calls = json::array();
      for (const ToolCallChunk& c : delta.calls) {
        json entry = {{"index", c.index}};
        if (!c.id.empty()) {  // the call's first entry
          entry["id"] = c.id;
          entry["type"] = "function";
          entry["function"] = {{"name", c.name}, {"arguments", c.arguments}};
        } else {
          entry["function"] = {{"arguments", c.arguments}};
        }
        calls.push_back(std::move(entry));
      }
      d["tool_calls"] = std::move(calls);
    }
    choice["delta"] = d;
    if (with_logprobs && !delta.logprobs.empty()) choice["logprobs"] = LogprobsJson(endpoint, delta.logprobs, text_offset);
  } else {
    choice["text"] = delta.text;
    choice["logprobs"] = with_logprobs ? LogprobsJson(endpoint, delta.logprobs, text_offset) : json(nullptr);
  }
  r["choices"] = json::array({choice});
  if (usage != nullptr) r["usage"] = UsageObject(*usage);
  if (timings != nullptr) r["timings"] = TimingsObject(*timings);
  return Dump(r);
}

std::string UsageChunkJson(Endpoint endpoint, const ResponseMeta& meta, const Usage& usage) {
  json r = Envelope(endpoint, meta, true);
  r["choices"] = json::array();
  r["usage"] = UsageObject(usage);
  return Dump(r);
}

std::string SseEvent(std::string_view json_text) { return fmt::format("data: {}\n\n", json_text); }

std::string ModelsJson(const std::string& id, int64_t created) {
  json model = {{"id", id}, {"object", "model"}, {"created", created}, {"owned_by", "kvq"}};
  return Dump(json{{"object", "list"}, {"data", json::array({model})}});
}

}  // namespace kvq::server
