// A client of kvq serve for measurements and tests (kvq bench serve, tests/server/): one streamed
// completion request over HTTP on its own connection, timed — time to the first text and to the
// end — with the text, usage and any error it got back.
#pragma once

#include <cstdint>
#include <string>

namespace kvq::server {

struct StreamRequest {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string api_key;      ///< "" sends no Authorization header
  std::string prompt;
  int32_t max_tokens = 64;
  float temperature = 0;    ///< greedy by default: outputs are comparable
  bool ignore_eos = false;
  double timeout_seconds = 600;
};

struct StreamResult {
  int status = 0;               ///< HTTP status; 0: no response (connection failed)
  std::string error;            ///< "" when the stream ended with [DONE] and no error event
  std::string text;             ///< the streamed text, joined
  std::string finish_reason;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;    ///< usage.prompt_tokens_details.cached_tokens
  int32_t chunks = 0;           ///< SSE data events with text
  double ttft_seconds = 0;      ///< request sent → first text
  double total_seconds = 0;     ///< request sent → [DONE]
};

/// POST /v1/completions with "stream": true and parses the Server-Sent Events.
StreamResult StreamCompletion(const StreamRequest& request);

}  // namespace kvq::server
