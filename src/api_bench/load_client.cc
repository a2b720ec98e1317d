// A timed streaming client of kvq serve (see load_client.h).
#include "api_bench/load_client.h"

#include <fmt/format.h>
#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>

namespace kvq::server {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Parses one SSE "data:" payload into the result; returns false at [DONE].
bool TakeEvent(const std::string& data, StreamResult& r, Clock::time_point start) {
  if (data == "[DONE]") return false;
  json j = json::parse(data, nullptr, false);
  if (j.is_discarded()) {
    r.error = "a stream event is not JSON: " + data.substr(0, 200);
    return true;
  }
  if (j.contains("error")) {
    r.error = j["error"].value("message", "an error event");
    return true;
  }
  if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
    const json& c = j["choices"][0];
    const std::string text = c.contains("text") && c["text"].is_string() ? c["text"].get<std::string>() : "";
    if (!text.empty()) {
      if (r.text.empty()) r.ttft_seconds = std::chrono::duration<double>(Clock::now() - start).count();
      r.text += text;
      ++r.chunks;
    }
    if (c.contains("finish_reason") && c["finish_reason"].is_string()) r.finish_reason = c["finish_reason"];
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    const json& u = j["usage"];
    r.prompt_tokens = u.value("prompt_tokens", int64_t{0});
    r.completion_tokens = u.value("completion_tokens", int64_t{0});
    if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object()) {
      r.cached_tokens = u["prompt_tokens_details"].value("cached_tokens", int64_t{0});
    }
  }
  return true;
}

}  // namespace

StreamResult StreamCompletion(const StreamRequest& q) {
  StreamResult r;
  httplib::Client client(q.host, q.port);
  const auto timeout = std::chrono::duration<double>(q.timeout_seconds);
  client.set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));
  client.set_connection_timeout(std::chrono::seconds(10));
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  if (!q.api_key.empty()) req.set_header("Authorization", "Bearer " + q.api_key);
  req.body = json{{"prompt", q.prompt},          {"max_tokens", q.max_tokens}, {"temperature", q.temperature},
                  {"stream", true},              {"ignore_eos", q.ignore_eos},
                  {"stream_options", {{"include_usage", true}}}}
                 .dump();
  std::string pending;  // bytes after the last complete event
  std::string body;     // a non-stream (error) body
  bool streaming = false;
  bool done = false;
  const Clock::time_point start = Clock::now();
  req.response_handler = [&](const httplib::Response& res) {
    streaming = res.status == 200 && res.get_header_value("Content-Type").starts_with("text/event-stream");
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (!streaming) {
      body.append(data, n);
      return true;
    }
    pending.append(data, n);
    for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
      const std::string event = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (!event.starts_with("data: ")) continue;  // comments (": waiting") and blank lines
      if (!TakeEvent(event.substr(6), r, start)) done = true;
    }
    return true;
  };
  httplib::Result res = client.send(req);
  r.total_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (!res) {
    r.error = "no response: " + httplib::to_string(res.error());
    return r;
  }
  r.status = res->status;
  if (r.status != 200) {
    json j = json::parse(body.empty() ? res->body : body, nullptr, false);
    r.error = !j.is_discarded() && j.contains("error") ? j["error"].value("message", "error") : "HTTP error";
  } else if (!done && r.error.empty()) {
    r.error = "the stream ended without [DONE]";
  }
  return r;
}

}  // namespace kvq::server
