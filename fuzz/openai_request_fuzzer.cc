// Fuzz target: kvq serve's request handling below the HTTP library — a body parsed for both
// endpoints (ParseGenerationRequest), an accepted chat request rendered through the ChatML
// fallback template, and the response, stream-chunk and error JSON built from what was parsed.
// Properties: a refusal is a 400 with a message, and its error body parses as JSON in OpenAI's
// shape; an accepted request is within the limits (max_tokens, temperature, top_p, min_p, stop
// strings); every response body parses as JSON and carries the text it was given.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "jinja/chat_template.h"
#include "server/openai_protocol.h"

namespace kvq::fuzz {
namespace {

using nlohmann::json;
using server::ApiError;
using server::Endpoint;
using server::GenerationRequest;

const server::RequestLimits kLimits{.max_tokens_limit = 4096};

json MustParse(const std::string& text, const char* what) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) Fail("openai_request", std::string(what) + " is not valid JSON: " + text.substr(0, 200));
  return j;
}

void CheckAccepted(const GenerationRequest& r) {
  if (r.max_tokens && (*r.max_tokens < 1 || *r.max_tokens > kLimits.max_tokens_limit)) {
    Fail("openai_request", "accepted max_tokens out of range");
  }
  const SamplerOptions& s = r.sampling;
  if (!(s.temperature >= 0 && s.temperature <= 2) || !(s.top_p > 0 && s.top_p <= 1) ||
      !(s.min_p >= 0 && s.min_p < 1) || s.top_k < 0) {
    Fail("openai_request", "accepted sampling parameters out of range");
  }
  if (static_cast<int32_t>(r.stop.size()) > kLimits.max_stop_strings) Fail("openai_request", "too many stop strings");
  for (const std::string& stop : r.stop) {
    if (stop.empty()) Fail("openai_request", "an empty stop string was accepted");
  }
  std::string text = r.prompt;
  if (r.endpoint == Endpoint::kChatCompletions) {
    if (r.messages.empty()) Fail("openai_request", "a chat request without messages was accepted");
    Result<std::string> rendered = ChatTemplate::ChatMl().Render(r.messages, {.add_generation_prompt = true});
    if (!rendered.ok()) Fail("openai_request", "ChatML refused messages: " + rendered.status().message());
    text = *rendered;
  } else if (r.prompt.empty()) {
    Fail("openai_request", "an empty prompt was accepted");
  }
  // The responses carry any bytes the model writes: here, the request's own text.
  const server::ResponseMeta meta{.id = "x", .created = 1, .model = r.model};
  const server::Usage usage{.prompt_tokens = 1, .completion_tokens = 2, .cached_tokens = 0};
  const json whole = MustParse(CompletionJson(r.endpoint, meta, text, server::FinishReason::kStop, usage), "a response");
  if (whole["choices"].size() != 1) Fail("openai_request", "a response without one choice");
  const server::ChunkDelta delta{.text = text, .reasoning = text, .calls = {}, .logprobs = {}};
  (void)MustParse(StreamChunkJson(r.endpoint, meta, delta, true, std::nullopt, nullptr), "a stream chunk");
  (void)MustParse(StreamChunkJson(r.endpoint, meta, delta, false, server::FinishReason::kLength, &usage), "a last chunk");
  (void)MustParse(UsageChunkJson(r.endpoint, meta, usage), "a usage chunk");
}

}  // namespace

int FuzzOpenAiRequest(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChatCompletions}) {
    std::variant<GenerationRequest, ApiError> r = ParseGenerationRequest(endpoint, body, kLimits);
    if (const ApiError* e = std::get_if<ApiError>(&r)) {
      if (e->status != 400 || e->message.empty()) Fail("openai_request", "a refusal that is not a 400 with a message");
      const json j = MustParse(e->Json(), "an error body");
      if (!j.contains("error") || !j["error"].contains("message")) Fail("openai_request", "an error not in OpenAI's shape");
      continue;
    }
    CheckAccepted(std::get<GenerationRequest>(r));
  }
  return 0;
}

}  // namespace kvq::fuzz

KVQ_FUZZ_TARGET(FuzzOpenAiRequest)
