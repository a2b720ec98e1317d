// kvq serve's routes beside generation, in process with the bundled stories260K: /health through
// loading, ready and draining; /tokenize and /detokenize against the model's own tokenizer;
// /apply-template against ChatML as kvq/chat.h defines it; /props and /slots; 405 for a known path
// asked with another method; an unknown chat role refused by name; the vLLM metric names carrying
// the same numbers as kvq's own.
#include <gtest/gtest.h>
#include <httplib.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "kvq/model.h"
#include "server/engine.h"
#include "test_util/bundled_model.h"
#include "server/http_server.h"
#include "server/metrics.h"

namespace kvq::server {
namespace {

using json = nlohmann::json;

const Model& Bundled() { return test::BundledModel(); }

// A server that starts loading (no model); Attach makes it ready.
class LoadingServer {
 public:
  explicit LoadingServer(EngineOptions engine_options = {}) : engine_options_(engine_options) {
    server_ = std::make_unique<HttpServer>(
        metrics, ServerOptions{.port = 0, .model_id = "stories260K", .log_requests = false});
    Result<int> p = server_->Bind();
    EXPECT_TRUE(p.ok()) << p.status().message();
    port = p.ok() ? *p : 0;
    thread_ = std::thread([this] { server_->Serve(); });
  }
  ~LoadingServer() {
    server_->Stop();
    thread_.join();
  }
  void Attach() {
    Result<std::unique_ptr<Engine>> e = Engine::Create(Bundled(), engine_options_, &metrics);
    ASSERT_TRUE(e.ok()) << e.status().message();
    engine_ = std::move(e).value();
    server_->Attach(Bundled(), *engine_);
  }
  HttpServer& http() { return *server_; }
  httplib::Result Get(const std::string& path) {
    httplib::Client c("127.0.0.1", port);
    return c.Get(path);
  }
  httplib::Result Post(const std::string& path, const std::string& body) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(std::chrono::seconds(60));
    return c.Post(path, body, "application/json");
  }

  Metrics metrics;
  int port = 0;

 private:
  EngineOptions engine_options_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
};

json Body(const httplib::Result& r) {
  EXPECT_TRUE(r) << "no response";
  return r ? json::parse(r->body, nullptr, false) : json();
}

TEST(ServeRoutes, HealthSaysLoadingThenOkThenDraining) {
  LoadingServer server;
  httplib::Result health = server.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_EQ(Body(health)["status"], "loading");
  // The model's routes wait for it; /metrics answers.
  httplib::Result early = server.Post("/v1/completions", R"({"prompt":"Once","max_tokens":2})");
  ASSERT_TRUE(early);
  EXPECT_EQ(early->status, 503);
  EXPECT_EQ(Body(early)["error"]["code"], "loading");
  EXPECT_EQ(server.Get("/metrics")->status, 200);

  server.Attach();
  health = server.Get("/health");
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(Body(health)["status"], "ok");
  EXPECT_EQ(server.Post("/v1/completions", R"({"prompt":"Once","max_tokens":2})")->status, 200);

  server.http().SetDraining();
  health = server.Get("/health");
  EXPECT_EQ(health->status, 503);
  EXPECT_EQ(Body(health)["status"], "draining");
}

TEST(ServeRoutes, TokenizeDetokenizeAndApplyTemplate) {
  LoadingServer server;
  server.Attach();
  const Model& m = Bundled();
  const std::string text = "Once upon a time, a little girl named Lily\nsaw a cat.";
  const json tokens = Body(server.Post("/tokenize", json{{"content", text}}.dump()))["tokens"];
  std::vector<int32_t> expected = m.Tokenize(text, AddBos::kNo);
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(tokens.get<std::vector<int32_t>>(), expected);
  // add_special: BOS as the vocabulary wants it.
  const json with_bos = Body(server.Post("/tokenize", json{{"content", text}, {"add_special", true}}.dump()));
  EXPECT_EQ(with_bos["tokens"].get<std::vector<int32_t>>(), m.Tokenize(text));
  const json pieces = Body(server.Post("/tokenize", json{{"content", text}, {"with_pieces", true}}.dump()));
  ASSERT_EQ(pieces["tokens"].size(), expected.size());
  EXPECT_EQ(pieces["tokens"][1]["piece"], m.TokenPiece(expected[1]));
  // Round trip.
  EXPECT_EQ(Body(server.Post("/detokenize", json{{"tokens", tokens}}.dump()))["content"], text);
  httplib::Result bad = server.Post("/detokenize", R"({"tokens":[1, 99999]})");
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->body.find("tokens[1]"), std::string::npos) << bad->body;
  EXPECT_EQ(server.Post("/tokenize", R"({"text":"x"})")->status, 400);

  // stories260K has no template: ChatML as kvq/chat.h writes it.
  const json chat = {{"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi"}}}}};
  EXPECT_EQ(Body(server.Post("/apply-template", chat.dump()))["prompt"],
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ServeRoutes, UnknownRoleWrongMethodPropsSlotsAndMetrics) {
  LoadingServer server(EngineOptions{.parallel = 2});
  server.Attach();
  // An unknown role is refused, by name, by the chat route and the template route alike.
  for (const char* path : {"/v1/chat/completions", "/apply-template"}) {
    httplib::Result r = server.Post(path, R"({"messages":[{"role":"wizard","content":"hi"}]})");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << path;
    EXPECT_EQ(Body(r)["error"]["param"], "messages[0].role") << r->body;
    EXPECT_NE(r->body.find("'wizard'"), std::string::npos) << r->body;
  }
  // A known path with another method: 405 and the method it takes; an unknown path: 404.
  httplib::Result get_post_route = server.Get("/v1/chat/completions");
  EXPECT_EQ(get_post_route->status, 405);
  EXPECT_EQ(get_post_route->get_header_value("Allow"), "POST");
  EXPECT_EQ(server.Post("/health", "{}")->status, 405);
  EXPECT_EQ(server.Get("/nowhere")->status, 404);

  const json props = Body(server.Get("/props"));
  EXPECT_EQ(props["model"], "stories260K");
  EXPECT_EQ(props["context"], Bundled().info().context);
  EXPECT_EQ(props["sessions"], 2);
  EXPECT_EQ(props["kv"]["key"], "f16");

  // A prompt of 2 tokens and 5 generated: the slot holds the prompt and the tokens run (the last
  // sampled one is not), exactly the bytes of that many f16 positions.
  ASSERT_EQ(server.Post("/v1/completions", R"({"prompt":"Once","max_tokens":5,"ignore_eos":true})")->status, 200);
  const json slots = Body(server.Get("/slots"));
  ASSERT_EQ(slots.size(), 2u);
  int busy = 0;
  const ModelInfo& info = Bundled().info();
  for (const json& s : slots) {
    EXPECT_EQ(s["state"], "idle");
    if (s["positions"] == 0) continue;
    ++busy;
    EXPECT_EQ(s["positions"], 2 + 5 - 1) << s;
    EXPECT_EQ(s["kv_bytes"], int64_t{2} * 2 * info.n_layers * info.n_kv_heads * info.head_dim * (2 + 5 - 1)) << s;
  }
  EXPECT_EQ(busy, 1) << slots;

  const std::string metrics = server.Get("/metrics")->body;
  auto value = [&](const std::string& name) {
    std::smatch m;
    EXPECT_TRUE(std::regex_search(metrics, m, std::regex("\n" + name + " ([0-9.e+-]+)\n"))) << name << "\n" << metrics;
    return m.size() > 1 ? std::stod(m[1]) : -1.0;
  };
  EXPECT_EQ(value("vllm:num_requests_running"), value("kvq_active_sessions"));
  EXPECT_EQ(value("vllm:num_requests_waiting"), value("kvq_queued_requests"));
  EXPECT_EQ(value("vllm:prefix_cache_queries_total"), value("kvq_prompt_tokens_total"));
  EXPECT_EQ(value("vllm:prefix_cache_hits_total"), value("kvq_prompt_tokens_reused_total"));
  const double usage = value("vllm:kv_cache_usage_perc");
  EXPECT_GT(usage, 0);
  EXPECT_LE(usage, 1);
}

}  // namespace
}  // namespace kvq::server
