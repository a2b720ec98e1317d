// kvq serve's routes beside generation, in process with the bundled stories260K: /health through
// loading, ready and draining; /tokenize and /detokenize against the model's own tokenizer;
// /apply-template against ChatML as kvq/chat.h defines it; /props and /slots; 405 for a known path
// asked with another method; an unknown chat role refused by name; the vLLM metric names carrying
// the same numbers as kvq's own; the chat page compiled into the program, served at / with no web
// bundle; llama-server's timings in a reply.
#include <gtest/gtest.h>
#include <httplib.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
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
  explicit LoadingServer(EngineOptions engine_options = {}, ServerOptions options = {})
      : engine_options_(engine_options) {
    options.port = 0;
    options.model_id = "stories260K";
    options.log_requests = false;
    server_ = std::make_unique<HttpServer>(metrics, options);
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

namespace kvq::server {
namespace {

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// The page needs no web bundle (the release build has none) and no API key; / leads to it while
// the model loads, and every file of web/chat/ is served as it is in the source tree.
TEST(ServeRoutes, TheChatPageIsCompiledInAndServedAtTheRoot) {
  LoadingServer server({}, {.api_key = "k"});
  for (const char* path : {"/", "/chat"}) {
    httplib::Result root = server.Get(path);
    ASSERT_TRUE(root);
    EXPECT_EQ(root->status, 302) << path;
    EXPECT_EQ(root->get_header_value("Location"), "/chat/") << path;
  }
  const std::filesystem::path dir = std::filesystem::path(KVQ_SOURCE_DIR) / "web" / "chat";
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    httplib::Result r = server.Get("/chat/" + name);
    ASSERT_TRUE(r) << name;
    EXPECT_EQ(r->status, 200) << name;
    EXPECT_EQ(r->body, ReadFile(entry.path())) << name << ": the served bytes are not the source's";
    EXPECT_FALSE(r->get_header_value("Content-Type").empty()) << name;
    ++files;
  }
  EXPECT_GE(files, 2);
  httplib::Result index = server.Get("/chat/");
  ASSERT_TRUE(index);
  EXPECT_EQ(index->body, ReadFile(dir / "index.html"));
  EXPECT_EQ(index->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_EQ(server.Get("/chat/missing.js")->status, 404);
  server.Attach();
  EXPECT_EQ(server.Get("/props")->status, 401);  // the API still needs the key
}

// With a web bundle (--web), its own files answer beside the page; / still leads to the chat.
TEST(ServeRoutes, TheWebBundleIsServedBesideTheChatPage) {
  const std::string dir = testing::TempDir() + "/kvq_routes_web_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/index.html") << "<!doctype html><title>runtime</title>";
  {
    LoadingServer server({}, {.web_root = dir});
    EXPECT_EQ(server.Get("/")->status, 302);
    httplib::Result runtime = server.Get("/index.html");
    ASSERT_TRUE(runtime);
    EXPECT_EQ(runtime->status, 200);
    EXPECT_EQ(runtime->body, "<!doctype html><title>runtime</title>");
  }
  std::filesystem::remove_all(dir);
}

// The last chunk of a streamed reply, and a whole reply, carry llama-server's timings, agreeing
// with their usage; a follow-up turn's reused prompt tokens are its cache_n.
TEST(ServeRoutes, RepliesCarryTimingsThatAgreeWithTheirUsage) {
  LoadingServer server(EngineOptions{.parallel = 1});
  server.Attach();
  auto check = [](const json& reply, const std::string& what) {
    ASSERT_TRUE(reply.contains("timings")) << what << ": " << reply;
    const json& t = reply["timings"];
    const json& u = reply["usage"];
    EXPECT_EQ(t["predicted_n"], u["completion_tokens"]) << what;
    EXPECT_EQ(t["cache_n"], u["prompt_tokens_details"]["cached_tokens"]) << what;
    EXPECT_EQ(t["prompt_n"].get<int64_t>() + t["cache_n"].get<int64_t>(), u["prompt_tokens"].get<int64_t>()) << what;
    EXPECT_GT(t["prompt_ms"].get<double>(), 0) << what;
    EXPECT_GE(t["predicted_ms"].get<double>(), 0) << what;
    const int64_t n = t["predicted_n"].get<int64_t>();
    const double ms = t["predicted_ms"].get<double>();
    EXPECT_EQ(t["predicted_per_second"].get<double>(), n > 1 && ms > 0 ? static_cast<double>(n - 1) * 1e3 / ms : 0.0)
        << what;
  };
  json chat = {{"messages", {{{"role", "user"}, {"content", "Tell me a story."}}}},
               {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true}};
  const json whole = Body(server.Post("/v1/chat/completions", chat.dump()));
  check(whole, "whole reply");
  EXPECT_EQ(whole["usage"]["completion_tokens"], 12);
  // The conversation continued, streamed: the slot holds the first turn, so its tokens are reused.
  chat["messages"].push_back({{"role", "assistant"}, {"content", whole["choices"][0]["message"]["content"]}});
  chat["messages"].push_back({{"role", "user"}, {"content", "Go on."}});
  chat["stream"] = true;
  httplib::Result streamed = server.Post("/v1/chat/completions", chat.dump());
  ASSERT_TRUE(streamed);
  json last;
  std::istringstream lines(streamed->body);
  for (std::string line; std::getline(lines, line);) {
    if (!line.starts_with("data: {")) continue;
    const json chunk = json::parse(line.substr(6));
    if (!chunk["choices"].empty() && !chunk["choices"][0]["finish_reason"].is_null()) last = chunk;
    if (last.is_null()) {
      EXPECT_FALSE(chunk.contains("timings")) << "only the last chunk has timings: " << line;
    }
  }
  ASSERT_FALSE(last.is_null()) << streamed->body;
  check(last, "streamed reply");
  EXPECT_GT(last["timings"]["cache_n"].get<int64_t>(), 0) << last;
}

}  // namespace
}  // namespace kvq::server
