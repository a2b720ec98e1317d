// kvq serve's HTTP routes (see http_server.h).
#include "server/http_server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>
#include <thread>

#include "kvq/log.h"
#include "kvq/tool_calls.h"
#include "server/chat_page.h"

namespace kvq::server {
namespace {

using Clock = std::chrono::steady_clock;

void Reply(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(e.Json(), "application/json");
}

ApiError Error(int status, std::string type, std::string message, std::string code = "") {
  return {.status = status, .type = std::move(type), .message = std::move(message), .param = "", .code = std::move(code)};
}

// Compares without returning early, so the time taken says nothing about where a guess differs.
bool SameSecret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

std::string ResponseId(Endpoint endpoint) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}-{:016x}", endpoint == Endpoint::kChatCompletions ? "chatcmpl" : "cmpl", rng());
}

// What one request did, for its log line. The handler, the stream's content provider and the
// logger of one request run on the same HTTP thread, one after another, so a thread-local record
// carries it from the first to the last; the pre-routing handler starts it afresh.
struct RequestRecord {
  int64_t id = 0;
  Clock::time_point start = Clock::now();
  bool generation = false;
  Usage usage;
  double ttft_seconds = 0;  // submit to first text; 0: none came
};
thread_local RequestRecord t_record;

// httplib's default socket options set SO_REUSEPORT, with which a second server binds the same
// port and the kernel splits connections between them. SO_REUSEADDR alone lets a restart bind
// while old connections linger in TIME_WAIT, but never beside a live listener.
void ExclusiveSocketOptions(int sock) {
  int yes = 1;
  setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
}

// Why host:port cannot be bound, as the system says it (a probe bind with the same options).
std::string BindFailure(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    return fmt::format("the address {} is not valid ({})", host, gai_strerror(rc));
  }
  std::string why = "cannot bind";
  const int sock = socket(found->ai_family, found->ai_socktype, found->ai_protocol);
  if (sock >= 0) {
    ExclusiveSocketOptions(sock);
    if (bind(sock, found->ai_addr, found->ai_addrlen) != 0) {
      why = errno == EADDRINUSE ? fmt::format("port {} is in use (another server listens on it)", port)
                                : std::strerror(errno);
    }
    close(sock);
  }
  freeaddrinfo(found);
  return why;
}

// Debian's cpp-httplib is a compiled library whose listen() backlog is its default of 5: a burst
// of more connections than that overflows the accept queue and some clients see their first write
// fail. httplib does not expose its socket, so find our listening socket by its port and listen
// again with the system's limit (on Linux a second listen() only changes the backlog).
void WidenListenBacklog(int port) {
  rlimit limit{};
  const int max_fd = getrlimit(RLIMIT_NOFILE, &limit) == 0 ? static_cast<int>(std::min<rlim_t>(limit.rlim_cur, 65536)) : 1024;
  for (int fd = 0; fd < max_fd; ++fd) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    int listening = 0;
    socklen_t optlen = sizeof(listening);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) continue;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &optlen) != 0 || !listening) continue;
    const int bound = addr.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port)
                      : addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                                   : -1;
    if (bound == port) listen(fd, SOMAXCONN);
  }
}

}  // namespace

HttpServer::HttpServer(Metrics& metrics, ServerOptions options)
    : metrics_(metrics), options_(std::move(options)), http_(std::make_unique<httplib::Server>()) {
  Routes();
}

HttpServer::HttpServer(const Model& model, Engine& engine, Metrics& metrics, ServerOptions options)
    : HttpServer(metrics, std::move(options)) {
  Attach(model, engine);
}

void HttpServer::Attach(const Model& model, Engine& engine) {
  engine_ = &engine;
  model_ = &model;  // last: a non-null model_ is what lets requests through to both
  ServerState loading = ServerState::kLoading;
  state_.compare_exchange_strong(loading, ServerState::kReady);  // a drain begun while loading stays
}

void HttpServer::SetDraining() { state_ = ServerState::kDraining; }

void HttpServer::Handle(const std::string& method, const std::string& path, Handler handler) {
  routes_.push_back({method, path});
  if (method == "GET") http_->Get(path, std::move(handler));
  if (method == "POST") http_->Post(path, std::move(handler));
}

std::string HttpServer::RouteLabel(const std::string& path) const {
  for (const Route& r : routes_) {
    if (r.path == path) return path;
  }
  return "other";
}

HttpServer::~HttpServer() = default;

Result<int> HttpServer::Bind() {
  if (!options_.web_root.empty()) {
    if (!std::filesystem::is_directory(options_.web_root) || !http_->set_mount_point("/", options_.web_root)) {
      return Status::Error(fmt::format("--web {}: not a folder", options_.web_root));
    }
    // Cross-origin isolation for the page's files: without it a browser withholds SharedArrayBuffer,
    // and the page falls back to its one-thread WebAssembly build. The page loads nothing cross-origin.
    http_->set_file_request_handler([](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cross-Origin-Opener-Policy", "same-origin");
      res.set_header("Cross-Origin-Embedder-Policy", "require-corp");
    });
  }
  http_->set_socket_options(ExclusiveSocketOptions);
  const int port = options_.port == 0 ? http_->bind_to_any_port(options_.host)
                                      : (http_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
  if (port < 0) {
    return Status::Error(fmt::format("cannot listen on {}:{}: {}", options_.host, options_.port,
                                     BindFailure(options_.host, options_.port)));
  }
  WidenListenBacklog(port);
  return port;
}

void HttpServer::Serve() {
  http_->listen_after_bind();
  serve_returned_ = true;
}

void HttpServer::Stop() {
  // httplib's stop() does nothing before the listening loop has started, which would then run on:
  // wait (boundedly) until Serve is under way or over.
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (!http_->is_running() && !serve_returned_ && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  http_->stop();
}

std::variant<std::string, ApiError> HttpServer::ChatPrompt(const GenerationRequest& r) const {
  Result<std::string> text =
      model().ApplyChatTemplate(r.messages, {.add_generation_prompt = true, .enable_thinking = r.enable_thinking,
                                            .template_override = options_.chat_template,
                                            .tools_json = r.has_tools ? r.tools.tools_json : ""});
  if (!text.ok()) {
    return Error(400, "invalid_request_error",
                 fmt::format("the chat template ({}) refused the messages: {}", ChatTemplateOrigin(),
                             text.status().message()));
  }
  return std::move(text).value();
}

std::string HttpServer::ChatTemplateOrigin() const {
  return options_.chat_template.empty() ? model().chat_template_choice().origin : options_.chat_template_origin;
}

std::variant<std::vector<int32_t>, ApiError> HttpServer::PromptIds(const GenerationRequest& r,
                                                                   std::string* rendered) const {
  if (r.endpoint == Endpoint::kCompletions) return model().Tokenize(r.prompt);
  std::variant<std::string, ApiError> text = ChatPrompt(r);
  if (auto* e = std::get_if<ApiError>(&text)) return *e;
  if (rendered != nullptr) *rendered = std::get<std::string>(text);
  return model().TokenizeChatPrompt(std::get<std::string>(text));
}

void HttpServer::LogRequest(const httplib::Request& req, const httplib::Response& res) {
  RequestRecord& r = t_record;
  if (r.id == 0) r.id = next_request_id_++;  // refused before routing (a malformed request)
  const double seconds = std::chrono::duration<double>(Clock::now() - r.start).count();
  std::string line = fmt::format("kvq serve: request {} {} {} {} in {:.3f} s", r.id, req.method, req.path,
                                 res.status, seconds);
  if (r.generation) {
    line += fmt::format("; prompt {} tokens ({} reused), generated {}", r.usage.prompt_tokens,
                        r.usage.cached_tokens, r.usage.completion_tokens);
    if (r.ttft_seconds > 0) line += fmt::format(", TTFT {:.3f} s", r.ttft_seconds);
    // Decode speed: the tokens after the first over the time after the first.
    const double per_second = TimingsOf(r.usage, r.ttft_seconds, seconds).predicted_per_second();
    if (r.ttft_seconds > 0 && per_second > 0) line += fmt::format(", {:.1f} tok/s", per_second);
  }
  fmt::print(stderr, "{}\n", line);
  r = RequestRecord{};
}

void HttpServer::Generate(Endpoint endpoint, const std::string& body, httplib::Response& res) {
  t_record.generation = true;
  std::variant<GenerationRequest, ApiError> parsed = ParseGenerationRequest(endpoint, body, options_.limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return Reply(res, *e);
  GenerationRequest& r = std::get<GenerationRequest>(parsed);
  if (!r.model.empty() && r.model != options_.model_id) {
    return Reply(res, Error(404, "invalid_request_error",
                            fmt::format("The model '{}' does not exist; this server serves '{}'", r.model,
                                        options_.model_id),
                            "model_not_found"));
  }
  std::string rendered;
  std::variant<std::vector<int32_t>, ApiError> ids = PromptIds(r, &rendered);
  if (auto* e = std::get_if<ApiError>(&ids)) return Reply(res, *e);
  JobSpec spec;
  spec.prompt = std::move(std::get<std::vector<int32_t>>(ids));
  t_record.usage.prompt_tokens = static_cast<int64_t>(spec.prompt.size());
  const int64_t room = engine().context() - static_cast<int64_t>(spec.prompt.size());
  spec.max_tokens = r.max_tokens.value_or(static_cast<int32_t>(
      std::clamp<int64_t>(room, 1, options_.limits.max_tokens_limit)));
  spec.stop = r.stop;
  spec.sampling = r.sampling;
  spec.ignore_eos = r.ignore_eos;
  spec.grammar = r.grammar;
  spec.speculation = SpeculationOf(r, engine().options().speculation);
  if (spec.speculation.source != DraftSource::kNone) {
    // This server's sessions or options cannot draft: refused rather than silently not drafted.
    std::string why = engine().speculation_refusal();
    if (why.empty() && spec.speculation.source == DraftSource::kModel && spec.speculation.draft_model == nullptr) {
      why = "this server has no draft model (kvq serve --spec draft --draft-model FILE)";
    }
    if (!why.empty()) {
      ApiError e = Error(400, "invalid_request_error",
                         fmt::format("'spec' \"{}\": {}", DraftSourceName(spec.speculation.source), why));
      e.param = "spec";
      return Reply(res, e);
    }
  }
  spec.min_draft = r.spec_n_min.value_or(0);
  // Tools: the model's format decides the grammar of a forced call and how calls are found in the reply.
  const ToolCallFormat& tool_format = ToolCallFormatOf(model(), options_.chat_template);
  const bool parse_calls = r.has_tools && r.tools.choice != ToolChoice::kNone;
  // A chat reply is split into reasoning, content and calls (kvq/tool_calls.h's ReplyParser); a
  // completion's text is the model's text as is.
  const bool chat = endpoint == Endpoint::kChatCompletions;
  const ReasoningFormat reasoning = chat ? r.reasoning_format.value_or(options_.reasoning_format) : ReasoningFormat::kNone;
  const bool starts_thinking = PromptOpensThinking(rendered);
  const ToolCallFormat* call_format = parse_calls ? &tool_format : nullptr;
  // The format's control-token openings reach the parser as text (and the grammar can ask for them).
  if (parse_calls) spec.preserved_tokens = PreservedTokens(tool_format);
  if (r.has_tools) {
    if (Status s = CheckToolCallTemplate(model(), options_.chat_template); !s.ok()) {
      ApiError e = Error(400, "invalid_request_error", "'tools': " + s.message());
      e.param = "tools";
      return Reply(res, e);
    }
    ToolOptions tools = r.tools;
    tools.starts_thinking = reasoning != ReasoningFormat::kNone && starts_thinking;
    Result<std::string> forced = ToolCallGrammar(tool_format, tools);
    if (!forced.ok()) {
      ApiError e = Error(400, "invalid_request_error", forced.status().message());
      e.param = "tools";
      return Reply(res, e);
    }
    // tool_choice auto: the lazy grammar (free text, then only declared calls once one opens)
    // unless the request constrains the reply itself; a forced call: its grammar (the request
    // parser refused a grammar beside it).
    if (!forced->empty() && (spec.grammar.empty() || r.tools.choice != ToolChoice::kAuto)) {
      spec.grammar = std::move(forced).value();
    }
  }
  spec.deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(options_.request_timeout_seconds * 1e3));
  for (const auto& [id, bias] : spec.sampling.logit_bias) {
    if (id >= model().info().vocab_size) {
      ApiError e = Error(400, "invalid_request_error",
                         fmt::format("'logit_bias' names token {}; the vocabulary has {} tokens", id,
                                     model().info().vocab_size));
      e.param = "logit_bias";
      return Reply(res, e);
    }
  }
  spec.top_logprobs = r.logprobs ? r.top_logprobs : -1;
  // n choices: choice i samples with seed + i (so it equals a request with that seed and n 1).
  const Clock::time_point submit_time = Clock::now();  // the reply's timings count from here
  std::variant<std::vector<std::shared_ptr<Job>>, ApiError> submitted = engine().SubmitChoices(std::move(spec), r.n);
  if (auto* e = std::get_if<ApiError>(&submitted)) return Reply(res, *e);
  const std::vector<std::shared_ptr<Job>> jobs = std::get<std::vector<std::shared_ptr<Job>>>(submitted);
  const ResponseMeta meta{.id = ResponseId(endpoint), .created = static_cast<int64_t>(std::time(nullptr)),
                          .model = options_.model_id};
  if (!r.stream) {
    std::vector<ChoiceResult> choices(jobs.size());
    Usage usage;
    for (size_t i = 0; i < jobs.size(); ++i) {
      ChoiceResult& c = choices[i];
      for (;;) {
        Job::News news = jobs[i]->Wait(std::chrono::milliseconds(500));
        c.text += news.text;
        c.logprobs.insert(c.logprobs.end(), news.logprobs.begin(), news.logprobs.end());
        if (!news.finished) continue;
        if (news.error) {
          for (const auto& j : jobs) j->Cancel();
          return Reply(res, *news.error);
        }
        c.finish = news.finish;
        usage.prompt_tokens = news.usage.prompt_tokens;
        usage.completion_tokens += news.usage.completion_tokens;
        usage.drafted_tokens += news.usage.drafted_tokens;
        usage.accepted_tokens += news.usage.accepted_tokens;
        if (i == 0) usage.cached_tokens = news.usage.cached_tokens;
        break;
      }
      if (chat) {
        ReplyParser::Delta split = SplitReply(reasoning, starts_thinking, call_format, c.text);
        c.text = std::move(split.content);
        c.reasoning = std::move(split.reasoning);
        c.calls = std::move(split.calls);
        // A reply cut short keeps "length", so a client knows a call's arguments may be cut too.
        if (!c.calls.empty() && c.finish != FinishReason::kLength) c.finish = FinishReason::kToolCalls;
      }
    }
    t_record.usage = usage;
    t_record.ttft_seconds = jobs[0]->ttft_seconds();
    const Timings timings = TimingsOf(usage, t_record.ttft_seconds,
                                      std::chrono::duration<double>(Clock::now() - submit_time).count());
    res.set_content(CompletionJson(endpoint, meta, choices, usage, r.logprobs, &timings), "application/json");
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  // One stream for all choices: each chunk is one choice's (choices[0].index says which), and each
  // choice ends with its own finish_reason. A chat reply's text goes through its ReplyParser, which
  // holds back what may be a tag or a call and releases reasoning, content and call chunks.
  struct Choice {
    std::shared_ptr<Job> job;
    ReplyParser parser;
    size_t text_offset = 0;  // completions' logprobs.text_offset
    bool finished = false;
  };
  struct Stream {
    std::vector<Choice> choices;
    bool first = true;
    size_t next = 0;  // the choice waited on next, round robin
    Usage usage;      // summed over the finished choices
  };
  auto stream = std::make_shared<Stream>();
  for (const auto& j : jobs) {
    stream->choices.push_back({.job = j, .parser = ReplyParser(reasoning, starts_thinking, call_format)});
  }
  const bool include_usage = r.include_usage;
  const bool with_logprobs = r.logprobs;
  res.set_chunked_content_provider(
      "text/event-stream",
      [stream, meta, endpoint, chat, include_usage, with_logprobs, submit_time](size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
        auto cancel_all = [&] {
          for (Choice& c : stream->choices) c.job->Cancel();
        };
        if (stream->first) {
          stream->first = false;
          for (size_t i = 0; chat && i < stream->choices.size(); ++i) {
            if (!write(SseEvent(StreamChunkJson(endpoint, meta, ChunkDelta{}, true, std::nullopt, nullptr, false, 0,
                                                nullptr, static_cast<int>(i))))) {
              cancel_all();
              return false;
            }
          }
        }
        const size_t n = stream->choices.size();
        size_t index = stream->next;
        while (stream->choices[index].finished) index = (index + 1) % n;
        stream->next = (index + 1) % n;
        Choice& c = stream->choices[index];
        Job::News news = c.job->Wait(std::chrono::milliseconds(std::max<int64_t>(1000 / static_cast<int64_t>(n), 50)));
        if (news.error) {
          // Headers are out: the error travels as an event in OpenAI's error shape, then the end.
          cancel_all();
          write(SseEvent(news.error->Json()));
          write("data: [DONE]\n\n");
          sink.done();
          return true;
        }
        ChunkDelta delta{.text = std::move(news.text), .reasoning = "", .calls = {}, .logprobs = std::move(news.logprobs)};
        if (chat) {
          ReplyParser::Delta d = c.parser.Add(delta.text);
          if (news.finished) {
            ReplyParser::Delta end = c.parser.Finish();
            d.reasoning += end.reasoning;
            d.content += end.content;
            d.chunks.insert(d.chunks.end(), end.chunks.begin(), end.chunks.end());
          }
          delta.text = std::move(d.content);
          delta.reasoning = std::move(d.reasoning);
          delta.calls = std::move(d.chunks);
        }
        const size_t text_offset = c.text_offset;
        for (const LogprobEntry& e : delta.logprobs) c.text_offset += e.token.size();
        if (news.finished) {
          c.finished = true;
          stream->usage.prompt_tokens = news.usage.prompt_tokens;
          stream->usage.completion_tokens += news.usage.completion_tokens;
          stream->usage.drafted_tokens += news.usage.drafted_tokens;
          stream->usage.accepted_tokens += news.usage.accepted_tokens;
          if (index == 0) stream->usage.cached_tokens = news.usage.cached_tokens;
          std::optional<FinishReason> finish = news.finish;
          if (c.parser.calls() > 0 && finish != FinishReason::kLength) finish = FinishReason::kToolCalls;
          bool all_done = true;
          for (const Choice& other : stream->choices) all_done = all_done && other.finished;
          // The last choice to finish carries the usage and timings of the whole request.
          std::optional<Timings> timings;
          if (all_done) {
            t_record.usage = stream->usage;  // this runs on the request's thread, before its log line
            t_record.ttft_seconds = stream->choices[0].job->ttft_seconds();
            timings = TimingsOf(stream->usage, t_record.ttft_seconds,
                                std::chrono::duration<double>(Clock::now() - submit_time).count());
          }
          if (!write(SseEvent(StreamChunkJson(endpoint, meta, delta, false, finish, all_done ? &stream->usage : nullptr,
                                              with_logprobs, text_offset, timings ? &*timings : nullptr,
                                              static_cast<int>(index))))) {
            cancel_all();
            return false;
          }
          if (!all_done) return true;
          if (include_usage && !write(SseEvent(UsageChunkJson(endpoint, meta, stream->usage)))) return false;
          write("data: [DONE]\n\n");
          sink.done();
          return true;
        }
        // Nothing new: an SSE comment, which clients ignore, finds a client that went away.
        const bool nothing = delta.text.empty() && delta.reasoning.empty() && delta.calls.empty() && delta.logprobs.empty();
        const std::string event = nothing ? std::string(": waiting\n\n")
                                          : SseEvent(StreamChunkJson(endpoint, meta, delta, false, std::nullopt, nullptr,
                                                                     with_logprobs, text_offset, nullptr,
                                                                     static_cast<int>(index)));
        if (!write(event)) {
          cancel_all();
          return false;
        }
        return true;
      },
      [stream](bool success) {
        if (success) return;
        for (Choice& c : stream->choices) c.job->Cancel();  // the connection ended before the stream did
      });
}

void HttpServer::Routes() {
  httplib::Server& s = *http_;
  s.new_task_queue = [n = options_.http_threads] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
  s.set_payload_max_length(static_cast<size_t>(options_.max_body_bytes));
  s.set_read_timeout(options_.read_timeout_seconds, 0);
  // An idle keep-alive connection, or one that sent nothing yet, waits no longer than a slow one.
  s.set_keep_alive_timeout(std::min(5, options_.read_timeout_seconds));
  s.set_write_timeout(options_.write_timeout_seconds, 0);
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    t_record = RequestRecord{.id = next_request_id_++};
    res.set_header("X-Request-Id", std::to_string(t_record.id));
    // The chat page is static and holds no secrets: no key, and before the model has loaded.
    if (ServeChatPage(req, res)) return httplib::Server::HandlerResponse::Handled;
    const bool model_route = req.path != "/health" && req.path != "/metrics" && RouteLabel(req.path) != "other";
    if (model_route && model_.load() == nullptr) {
      Reply(res, Error(503, "server_error", "the model is still loading; retry when GET /health says ok", "loading"));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (options_.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    const bool api = model_route || req.path.starts_with("/v1/") || req.path == "/metrics";
    if (!api) return httplib::Server::HandlerResponse::Unhandled;  // the page: static files
    const std::string given = req.get_header_value("Authorization");
    if (!SameSecret(given, "Bearer " + options_.api_key)) {
      Reply(res, Error(401, "invalid_request_error",
                       given.empty() ? "no API key: send the header 'Authorization: Bearer KEY'"
                                     : "the API key is not valid",
                       "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  s.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                   httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (res.status == 404) {  // a known path asked with another method: 405 and the methods it takes
      std::string allow;
      for (const Route& r : routes_) {
        if (r.path == req.path) allow += (allow.empty() ? "" : ", ") + r.method;
      }
      if (!allow.empty()) {
        res.status = 405;
        res.set_header("Allow", allow);
        Reply(res, Error(405, "invalid_request_error",
                         fmt::format("{} does not take {}; it takes {}", req.path, req.method, allow),
                         "method_not_allowed"));
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    ApiError e = Error(res.status, "invalid_request_error", fmt::format("HTTP {}", res.status));
    if (res.status == 404) e.message = fmt::format("no route {} {}", req.method, req.path);
    if (res.status == 413) {
      e.message = fmt::format("the request body is larger than this server's limit of {} bytes", options_.max_body_bytes);
      e.code = "request_too_large";
    }
    Reply(res, e);
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    Log(LogLevel::kError, "serve: a handler threw: " + what);
    Reply(res, Error(500, "server_error", "internal error: " + what));
  });
  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics_.CountRequest(RouteLabel(req.path), res.status);
    if (options_.log_requests) LogRequest(req, res);
  });
  Handle("POST", "/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Generate(Endpoint::kCompletions, req.body, res);
  });
  Handle("POST", "/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Generate(Endpoint::kChatCompletions, req.body, res);
  });
  Handle("GET", "/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(ModelsJson(options_.model_id, static_cast<int64_t>(std::time(nullptr))), "application/json");
  });
  // A load balancer routes only where this says 200: not before the model is loaded, nor once a
  // drain has begun (while running requests finish and new ones get 503).
  Handle("GET", "/health", [this](const httplib::Request&, httplib::Response& res) {
    const ServerState state = state_.load();
    res.status = state == ServerState::kReady ? 200 : 503;
    res.set_content(state == ServerState::kReady     ? R"({"status":"ok"})"
                    : state == ServerState::kLoading ? R"({"status":"loading"})"
                                                     : R"({"status":"draining"})",
                    "application/json");
  });
  Handle("GET", "/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.Render(), "text/plain; version=0.0.4");
  });
  InfoRoutes();
}

}  // namespace kvq::server
