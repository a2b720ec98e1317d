// The OpenAI wire format kvq serve speaks: request bodies of POST /v1/completions and
// /v1/chat/completions parsed and checked into a GenerationRequest, and the JSON of responses,
// stream chunks and errors. Pure functions of their inputs (no model, no sockets), so every rule
// is unit-tested and fuzzed on its own.
//
// Field names and defaults follow OpenAI's API reference; kvq adds top_k and min_p (as llama.cpp's
// server does) and chat_template_kwargs.enable_thinking (Qwen 3's switch, as vLLM takes it).
// Tool calls: `tools`, `tool_choice` and `parallel_tool_calls`, and messages carrying `tool_calls`
// or of role "tool", checked here and rendered through the model's template (kvq/tool_calls.h).
// Sampling beyond OpenAI's: penalties (frequency_penalty, presence_penalty, and llama.cpp's
// repeat_penalty and repeat_last_n), logit_bias, logprobs, n. Anything that would change the output
// and that kvq does not do (functions, echo, best_of, suffix, llama.cpp's other samplers) is refused with a 400 naming the field rather than ignored. Constrained output:
// llama.cpp's `grammar` (GBNF) and `json_schema`, and OpenAI's `response_format` (json_object,
// json_schema), at most one of them, become the request's grammar.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvq/generator.h"
#include "kvq/sampling.h"
#include "kvq/speculation.h"
#include "kvq/chat.h"
#include "kvq/reasoning.h"
#include "kvq/tool_calls.h"

namespace kvq::server {

enum class Endpoint { kCompletions, kChatCompletions };

/// An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with its HTTP status.
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";  ///< OpenAI's error types
  std::string message;
  std::string param;  ///< the field at fault, or ""
  std::string code;   ///< machine-readable ("model_not_found", "context_length_exceeded"...), or ""
  std::string Json() const;
};

/// What limits the parser enforces (the server's flags).
struct RequestLimits {
  int32_t max_tokens_limit = 4096;  ///< the most max_tokens a request may ask for
  int32_t max_stop_strings = 4;     ///< OpenAI's limit
  int32_t max_stop_bytes = 256;     ///< per stop string
  int32_t max_messages = 4096;
};

/// A checked request, ready to render and tokenize.
struct GenerationRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                  ///< as sent ("" when absent)
  std::string prompt;                 ///< completions: the text to continue
  std::vector<ChatMessage> messages;  ///< chat: the conversation
  std::optional<bool> enable_thinking;  ///< chat_template_kwargs.enable_thinking
  /// New tokens at most; unset: until an end token or the context ends (capped by the limit).
  std::optional<int32_t> max_tokens;
  std::vector<std::string> stop;      ///< generation ends before any of these texts
  bool stream = false;
  bool include_usage = false;         ///< stream_options.include_usage: a final usage-only chunk
  bool ignore_eos = false;            ///< kvq's (and llama.cpp's) extension: run to max_tokens
  SamplerOptions sampling;            ///< temperature 0: greedy
  std::string grammar;                ///< GBNF the reply follows (checked); "" none
  bool seed_given = false;            ///< sampling.seed came from the request
  /// chat: `logprobs`; completions: `logprobs` given (an integer, the alternatives per token).
  bool logprobs = false;
  int32_t top_logprobs = 0;           ///< alternatives per token (chat: top_logprobs; completions: logprobs)
  /// Choices (`n`, 1..16): choice i samples with seed + i from a session forked after the prompt.
  int32_t n = 1;
  /// chat: `tools` given (even with tool_choice "none": the template still shows them).
  bool has_tools = false;
  ToolOptions tools;                  ///< tools_json, tool_choice, parallel_tool_calls (checked)
  /// Speculative decoding asked for by the request (unset: the server's default). `spec`
  /// ("none", "ngram", "suffix"): the draft source; llama-server's fields: `speculative.n_max`
  /// (drafted tokens per step at most, 0..64; 0 turns speculation off), `speculative.n_min`
  /// (shorter drafts are not run, 0..n_max) and `speculative.p_min` (suffix drafts' least
  /// probability, (0, 1]).
  std::optional<DraftSource> spec;
  std::optional<int32_t> spec_n_max, spec_n_min;
  std::optional<float> spec_p_min;
  /// chat: llama-server's `reasoning_format` ("none", "deepseek", "auto"); unset: the server's.
  std::optional<ReasoningFormat> reasoning_format;
};

/// Parses and checks a request body. Errors: malformed JSON, a field of the wrong type or out of
/// range, a missing prompt or messages, an unsupported feature — each a 400 naming the field.
std::variant<GenerationRequest, ApiError> ParseGenerationRequest(Endpoint endpoint, std::string_view body,
                                                                 const RequestLimits& limits);

/// OpenAI's finish_reason: "stop", "length", or "tool_calls" (a chat reply that called tools).
enum class FinishReason { kStop, kLength, kToolCalls };
const char* FinishReasonName(FinishReason reason);
/// kvq's reason as OpenAI names it: a full context is "length" (OpenAI has no "context"), a
/// cancelled request "stop" (its client has gone: nobody reads it).
FinishReason OpenAiFinishReason(kvq::FinishReason reason);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  ///< prompt tokens whose prefill a cached prefix skipped
  /// Speculation (kvq run --json's names): drafted tokens run, and of those, kept. Not in OpenAI's
  /// usage object: the response's timings carry them as llama-server's draft_n, draft_n_accepted.
  int64_t drafted_tokens = 0;
  int64_t accepted_tokens = 0;
};

/// llama-server's `timings` object of a finished response (what its web UI shows per reply), on
/// the HTTP side's clock: prompt_ms runs from the request's submission to its first generated text
/// (waiting for a session included), predicted_ms from then to the end. Rates are over intervals:
/// predicted_n tokens are predicted_n - 1 steps after the first.
struct Timings {
  int64_t cache_n = 0;      ///< prompt tokens a cached prefix supplied (not prefilled)
  int64_t prompt_n = 0;     ///< prompt tokens prefilled
  double prompt_ms = 0;
  int64_t predicted_n = 0;  ///< tokens generated
  double predicted_ms = 0;
  /// Speculation: drafted tokens run and, of those, kept (Usage::drafted_tokens,
  /// accepted_tokens); written, as llama-server writes them, only when draft_n > 0.
  int64_t draft_n = 0;
  int64_t draft_n_accepted = 0;
  /// (predicted_n - 1) / predicted_ms in tokens per second; 0 with fewer than two tokens.
  double predicted_per_second() const;
};
/// A finished response's timings from its usage, its seconds from submission to the first text
/// (0: none came) and its seconds in all.
Timings TimingsOf(const Usage& usage, double ttft_seconds, double total_seconds);

/// Identity of one response: its id ("cmpl-…" / "chatcmpl-…"), creation time and model id.
struct ResponseMeta {
  std::string id;
  int64_t created = 0;  ///< Unix seconds
  std::string model;
};

/// One sampled token's logprob and the most likely alternatives, with their texts (logprobs).
struct LogprobEntry {
  std::string token;   ///< the token's text
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;  ///< (text, logprob), most likely first
};

/// One choice of a response.
struct ChoiceResult {
  std::string text;
  std::string reasoning;  ///< chat: the message's reasoning_content (written when non-empty)
  FinishReason finish = FinishReason::kStop;
  std::vector<ToolCall> calls;
  std::vector<LogprobEntry> logprobs;
};

/// The whole (non-streamed) response body. `calls`: the chat reply's tool calls (its message's
/// `tool_calls`; its content is then null when `text` is empty).
std::string CompletionJson(Endpoint endpoint, const ResponseMeta& meta, const std::string& text,
                           FinishReason finish, const Usage& usage, std::span<const ToolCall> calls = {});
/// The whole response of several choices (n), `logprobs` shown when `with_logprobs`.
/// `timings` given: written beside `usage`, as llama-server does.
std::string CompletionJson(Endpoint endpoint, const ResponseMeta& meta, std::span<const ChoiceResult> choices,
                           const Usage& usage, bool with_logprobs, const Timings* timings = nullptr);
/// A choice's `logprobs` object in the endpoint's shape (chat: {"content": [...]}; completions:
/// tokens, token_logprobs, top_logprobs, text_offset).
nlohmann::ordered_json LogprobsJson(Endpoint endpoint, std::span<const LogprobEntry> entries, size_t text_offset);
/// What one stream chunk of a choice carries.
struct ChunkDelta {
  std::string text;
  std::string reasoning;                    ///< chat: delta.reasoning_content (written when non-empty)
  std::vector<ToolCallChunk> calls;         ///< chat: delta.tool_calls entries, by their call index
  std::vector<LogprobEntry> logprobs;
};
/// One stream chunk's JSON (without the "data: " framing), of choice `choice_index`. `role_chunk`:
/// chat's first chunk, whose delta carries the role. `finish` set: the choice's last chunk, with
/// its reason (and `usage`, `timings` when given). A tool call's first entry carries its id,
/// type and name with `arguments` "", as OpenAI streams it; later entries of the call carry
/// only their index and more of its arguments.
std::string StreamChunkJson(Endpoint endpoint, const ResponseMeta& meta, const ChunkDelta& delta, bool role_chunk,
                            std::optional<FinishReason> finish, const Usage* usage, bool with_logprobs = false,
                            size_t text_offset = 0, const Timings* timings = nullptr, int choice_index = 0);
/// The usage-only chunk of stream_options.include_usage (choices empty).
std::string UsageChunkJson(Endpoint endpoint, const ResponseMeta& meta, const Usage& usage);
/// "data: <json>\n\n"
std::string SseEvent(std::string_view json);

/// GET /v1/models: one model, `id`, owned by "kvq".
std::string ModelsJson(const std::string& id, int64_t created);

}  // namespace kvq::server
