// kvq serve's HTTP side (cpp-httplib, Debian's libcpp-httplib-dev): the OpenAI routes, health,
// metrics and the browser page, API keys, body and time limits. Requests are parsed and tokenized
// on the HTTP threads and handed to the Engine; a streamed response is written as Server-Sent
// Events as tokens arrive, and a client that goes away cancels its job (detected by the next
// write: an SSE comment is sent every second while a job waits, so a silent disconnect is found).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kvq/model.h"
#include "kvq/status.h"
#include "server/engine.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"

namespace httplib {
class Server;
struct Response;
}

namespace kvq::server {

struct ServerOptions {
  std::string host = "127.0.0.1";  ///< loopback unless told otherwise
  int port = 8080;                 ///< 0: any free port (tests)
  std::string api_key;             ///< non-empty: every request but GET /health and the page needs it
  std::string model_id;            ///< the id /v1/models lists and requests may name
  int64_t max_body_bytes = 8 << 20;
  int read_timeout_seconds = 10;   ///< a client that sends part of a request and stalls is dropped
  int write_timeout_seconds = 30;
  double request_timeout_seconds = 600;  ///< queue + generation; then 504 (or the stream ends)
  std::string web_root;            ///< "": no page at /
  RequestLimits limits;
  int32_t http_threads = 32;       ///< connections served at once (each streaming client holds one)
};

class HttpServer {
 public:
  /// Chat requests are rendered by model.ApplyChatTemplate (the model's template, or ChatML).
  HttpServer(const Model& model, Engine& engine, Metrics& metrics, ServerOptions options);
  ~HttpServer();

  /// Binds host:port; returns the port (the one chosen when options.port is 0). Errors: the
  /// address is taken or not valid, a web root that is not a folder.
  Result<int> Bind();
  /// Serves until Stop(); returns when the listening socket is closed and connections are done.
  void Serve();
  void Stop();

 private:
  void Routes();
  void Generate(Endpoint endpoint, const std::string& body, httplib::Response& res);
  // The prompt's text and ids for a checked request, or an error.
  std::variant<std::vector<int32_t>, ApiError> PromptIds(const GenerationRequest& request) const;

  const Model& model_;
  Engine& engine_;
  Metrics& metrics_;
  ServerOptions options_;
  std::unique_ptr<httplib::Server> http_;
};

}  // namespace kvq::server
