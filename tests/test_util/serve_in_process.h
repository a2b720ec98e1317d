// kvq serve in process on loopback for the server tests: an Engine and an HttpServer on a free
// port over a model (the bundled stories260K by default), and what Session::Generate gives alone
// for a prompt, which the server must give too.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "kvq/model.h"
#include "kvq/session.h"
#include "server/engine.h"
#include "server/http_server.h"
#include "api_bench/load_client.h"
#include "test_util/bundled_model.h"

namespace kvq::test {

using server::EngineOptions;
using server::Metrics;
using server::ServerOptions;
using server::StreamResult;

inline const std::string kDir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";

inline const Model& Bundled() { return BundledModel(); }

class TestServer {
 public:
  explicit TestServer(EngineOptions engine = {}, ServerOptions http = {}, const Model& model = Bundled()) {
    http.port = 0;
    http.model_id = "stories260K";
    Result<std::unique_ptr<server::Engine>> e = server::Engine::Create(model, engine, &metrics);
    EXPECT_TRUE(e.ok()) << e.status().message();
    engine_ = std::move(e).value();
    server_ = std::make_unique<server::HttpServer>(model, *engine_, metrics, http);
    Result<int> p = server_->Bind();
    EXPECT_TRUE(p.ok()) << p.status().message();
    port = *p;
    thread_ = std::thread([this] { server_->Serve(); });
  }
  ~TestServer() {
    server_->Stop();
    thread_.join();
  }
  httplib::Result Post(const std::string& path, const std::string& body, httplib::Headers headers = {}) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(std::chrono::seconds(60));
    return c.Post(path, headers, body, "application/json");
  }
  httplib::Result Get(const std::string& path, httplib::Headers headers = {}) {
    httplib::Client c("127.0.0.1", port);
    return c.Get(path, headers);
  }
  StreamResult Stream(const std::string& prompt, int32_t max_tokens, bool ignore_eos = false) {
    return server::StreamCompletion({.port = port, .prompt = prompt, .max_tokens = max_tokens, .ignore_eos = ignore_eos});
  }
  server::Engine& engine() { return *engine_; }

  Metrics metrics;
  int port = 0;

 private:
  std::unique_ptr<server::Engine> engine_;
  std::unique_ptr<server::HttpServer> server_;
  std::thread thread_;
};

// What Session::Generate gives for the prompt, greedy by default: the server must give the same.
inline std::string Alone(const std::string& prompt, int32_t max_tokens, const SamplerOptions& sampling = {.temperature = 0},
                  const Model& model = Bundled()) {
  Result<std::unique_ptr<Session>> s = model.NewSession();
  Result<Completion> c = (*s)->Generate(prompt, {.max_tokens = max_tokens, .sampling = sampling});
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c->text;
}

inline nlohmann::json Body(const httplib::Result& r) {
  EXPECT_TRUE(r) << "no response";
  return r ? nlohmann::json::parse(r->body, nullptr, false) : nlohmann::json();
}

}  // namespace kvq::test
