// kvq serve's HTTP side (cpp-httplib, Debian's libcpp-httplib-dev): the OpenAI routes, health,
// metrics, the model's tools (tokenize, detokenize, apply-template, props, slots) and the browser
// page, API keys, body and time limits, and one log line per request. Requests are parsed and tokenized
// on the HTTP threads and handed to the Engine; a streamed response is written as Server-Sent
// Events as tokens arrive, and a client that goes away cancels its job (detected by the next
// write: an SSE comment is sent every second while a job waits, so a silent disconnect is found).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvq/model.h"
#include "kvq/status.h"
#include "server/engine.h"
#include "server/metrics.h"
#include "kvq/reasoning.h"
#include "server/openai_protocol.h"

namespace httplib {
class Server;
struct Request;
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
  bool log_requests = true;        ///< one line per request on stderr (id, route, status, tokens, timings)
  /// Jinja source rendering chat requests instead of the model's template (its tool-call format
  /// too); "": the model's (or ChatML). chat_template_origin says where it came from, for /props.
  std::string chat_template;
  std::string chat_template_origin;
  /// How chat replies' thoughts are returned (--reasoning-format; a request's `reasoning_format`
  /// overrides it): llama-server's default splits them into reasoning_content.
  ReasoningFormat reasoning_format = ReasoningFormat::kDeepSeek;
};

/// What /health says: 503 "loading" until the model is attached, 200 "ok", 503 "draining" once
/// shutdown has begun (a load balancer stops routing here while running requests finish).
enum class ServerState { kLoading, kReady, kDraining };

class HttpServer {
 public:
  /// A server that is loading: it can Bind and Serve (/health says "loading", the model's routes
  /// answer 503) until Attach gives it the model and engine.
  HttpServer(Metrics& metrics, ServerOptions options);
  /// A server ready at once. Chat requests are rendered by model.ApplyChatTemplate (the model's
  /// template, or ChatML).
  HttpServer(const Model& model, Engine& engine, Metrics& metrics, ServerOptions options);
  ~HttpServer();

  /// Binds host:port exclusively (a port another process listens on is refused, never shared);
  /// returns the port (the one chosen when options.port is 0). Errors: the port is in use (the
  /// message names it), the address is not valid, a web root that is not a folder.
  Result<int> Bind();
  /// Serves until Stop(); returns when the listening socket is closed and connections are done.
  void Serve();
  /// Ends Serve (from another thread; called before Serve has begun, it waits up to 5 s for it).
  void Stop();
  /// The model is loaded: its routes answer from now on. Call once; both outlive the server.
  void Attach(const Model& model, Engine& engine);
  /// Shutdown has begun: /health answers 503 "draining" (the engine refuses new work itself).
  void SetDraining();
  ServerState state() const { return state_.load(); }

 private:
  // One route: its method and path (for 405 on another method and the metrics' route label).
  struct Route {
    std::string method;
    std::string path;
  };
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;
  void Routes();
  void InfoRoutes();  // /tokenize, /detokenize, /apply-template, /props, /slots
  void Handle(const std::string& method, const std::string& path, Handler handler);
  std::string RouteLabel(const std::string& path) const;
  void Generate(Endpoint endpoint, const std::string& body, httplib::Response& res);
  // The prompt's text and ids for a checked request, or an error.
  /// `rendered` (when given): the chat prompt's text, "" for completions.
  std::variant<std::vector<int32_t>, ApiError> PromptIds(const GenerationRequest& request,
                                                         std::string* rendered = nullptr) const;
  // The chat prompt text of a checked chat request (the model's template, or ChatML), or an error.
  std::variant<std::string, ApiError> ChatPrompt(const GenerationRequest& request) const;
  /// Which template renders chat requests, in words (the --chat-template file, or the model's choice).
  std::string ChatTemplateOrigin() const;
  void LogRequest(const httplib::Request& req, const httplib::Response& res);
  const Model& model() const { return *model_.load(); }
  Engine& engine() const { return *engine_.load(); }

  std::atomic<const Model*> model_{nullptr};  // null while loading
  std::atomic<Engine*> engine_{nullptr};
  Metrics& metrics_;
  ServerOptions options_;
  std::atomic<ServerState> state_{ServerState::kLoading};
  std::atomic<int64_t> next_request_id_{1};
  std::atomic<bool> serve_returned_{false};
  std::vector<Route> routes_;
  std::unique_ptr<httplib::Server> http_;
};

}  // namespace kvq::server
