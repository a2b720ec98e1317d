// kvq serve end to end on loopback, in process, with the bundled stories260K: greedy completions
// equal Session::Generate's, streams equal the whole response (concurrent requests equal the same
// requests alone in server_speculation_test.cc, with and without speculation), prefixes are reused live and from a snapshot folder after a restart (a damaged
// snapshot refused and deleted), and every bad request gets its status while the server keeps
// serving: malformed bodies, unknown models, budgets, a full queue, API keys, a body over the
// limit, a client that disconnects mid-stream and one that sends half its headers and stalls.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "grammar/grammar.h"
#include "grammar/grammar_matcher.h"
#include "kvq/generator.h"
#include "kvq/model.h"
#include "kvq/session.h"
#include "server/engine.h"
#include "test_util/bundled_model.h"
#include "test_util/serve_in_process.h"
#include "server/http_server.h"
#include "api_bench/load_client.h"
#include "synth/synth.h"

namespace kvq::server {
namespace {

using json = nlohmann::json;
using test::Alone;
using test::Body;
using test::Bundled;
using test::kDir;
using test::TestServer;

TEST(Serve, GreedyCompletionEqualsGenerate) {
  TestServer server;
  const std::string prompt = "Once upon a time, there was a little dog";
  httplib::Result r = server.Post("/v1/completions", json{{"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0}}.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = Body(r);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "stories260K");
  EXPECT_EQ(j["choices"][0]["text"], Alone(prompt, 40));
  EXPECT_EQ(j["usage"]["prompt_tokens"], static_cast<int64_t>(Bundled().Tokenize(prompt).size()));
  EXPECT_LE(j["usage"]["completion_tokens"].get<int64_t>(), 40);
  // The same request streamed gives the same text, then [DONE], with usage.
  const StreamResult s = server.Stream(prompt, 40);
  EXPECT_EQ(s.error, "");
  EXPECT_EQ(s.text, j["choices"][0]["text"]);
  EXPECT_EQ(s.finish_reason, j["choices"][0]["finish_reason"]);
  EXPECT_EQ(s.completion_tokens, j["usage"]["completion_tokens"]);
  EXPECT_GE(s.chunks, 1);
}

TEST(Serve, ChatCompletionAndStop) {
  TestServer server;
  const json chat = {{"messages", {{{"role", "user"}, {"content", "Tell me a story."}}}},
                     {"max_tokens", 30}, {"temperature", 0}};
  httplib::Result r = server.Post("/v1/chat/completions", chat.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = Body(r);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  // The ChatML prompt, rendered and tokenized as the server does, continued by Generate.
  const std::string prompt = "<|im_start|>user\nTell me a story.<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(j["choices"][0]["message"]["content"], Alone(prompt, 30));
  // A stop string cuts the text before it and ends with "stop".
  const std::string full = Alone("Once upon a time", 60);
  const size_t cut = full.find(' ', 12);
  ASSERT_NE(cut, std::string::npos);
  const std::string stop = full.substr(cut, 4);
  const json c = Body(server.Post("/v1/completions", json{{"prompt", "Once upon a time"}, {"max_tokens", 60},
                                                          {"temperature", 0}, {"stop", stop}}.dump()));
  EXPECT_EQ(c["choices"][0]["text"], full.substr(0, full.find(stop)));
  EXPECT_EQ(c["choices"][0]["finish_reason"], "stop");
}

TEST(Serve, PrefixReusedLiveAndAfterARestart) {
  const std::string dir = testing::TempDir() + "/kvq_serve_prefix_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::string prefix = "Once upon a time, there was a little girl named Lily. She liked to play in the park. ";
  prefix += prefix;
  prefix += prefix;  // about 80 tokens: more than a prefill block, so a snapshot is worth loading
  const std::string first = prefix + "One day she saw a dog.", second = prefix + "One day she found a ball.";
  const std::string want = Alone(second, 32);
  {
    TestServer server({.parallel = 1, .prefix_cache_dir = dir});
    EXPECT_EQ(server.Stream(first, 32).cached_tokens, 0);
    const StreamResult warm = server.Stream(second, 32);
    EXPECT_GT(warm.cached_tokens, 70);  // the shared prefix, from the idle session
    EXPECT_EQ(warm.text, want);
    EXPECT_EQ(server.metrics.prefix_hits_live.load(), 1);
    EXPECT_GE(server.metrics.prefix_snapshots_saved.load(), 1);
  }
  {
    TestServer restarted({.parallel = 1, .prefix_cache_dir = dir});
    const StreamResult r = restarted.Stream(second, 32);
    EXPECT_GT(r.cached_tokens, 70);  // from the snapshot folder
    EXPECT_EQ(r.text, want);
    EXPECT_EQ(restarted.metrics.prefix_hits_disk.load(), 1);
  }
  // Damage every snapshot: each is refused and deleted, never used, and the output is still right.
  int damaged = 0;
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir)) {
    if (f.path().extension() != ".kvqs") continue;
    std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(std::filesystem::file_size(f.path()) / 2));
    io.put('\x5a');
    ++damaged;
  }
  ASSERT_GT(damaged, 0);
  {
    TestServer again({.parallel = 1, .prefix_cache_dir = dir});
    const StreamResult r = again.Stream(second, 32);
    EXPECT_EQ(r.cached_tokens, 0);
    EXPECT_EQ(r.text, want);
    EXPECT_GE(again.metrics.prefix_snapshots_refused.load(), 1);
  }
  int left = 0;
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir)) {
    if (f.path().extension() == ".kvqs") ++left;
  }
  EXPECT_EQ(left, 1);  // the damaged ones are gone; the last request saved its own prompt
  std::filesystem::remove_all(dir);
}

// A hybrid model (tiny qwen35: Gated DeltaNet layers with a fixed state): its state cannot roll back,
// so a session is reused only when the prompt extends all it holds — live, and from a snapshot after
// a restart (the snapshot carries the state) — and a prompt sharing only part of it is a miss, not
// a "hit" that recomputes the whole prefix. Outputs equal a fresh session's, greedy.
TEST(Serve, AHybridReusesWholePrefixesLiveAndFromSnapshots) {
  const std::string dir = testing::TempDir() + "/kvq_serve_hybrid_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/tiny-qwen35.gguf";
  ASSERT_TRUE(WriteSynthModel(*SynthPreset("tiny-qwen35"), kDir + "stories260K.gguf", path).ok());
  Result<std::unique_ptr<Model>> model = Model::Load(path, {.threads = 1});
  ASSERT_TRUE(model.ok()) << model.status().message();
  // The random model's text has stray bytes, which the server's JSON replaces by U+FFFD (per chunk):
  // both sides are compared on their ASCII characters.
  auto ascii = [](const std::string& text) {
    std::string out;
    for (const char ch : text) {
      if (static_cast<unsigned char>(ch) < 0x80) out += ch;
    }
    return out;
  };
  auto alone = [&](const std::string& prompt, int32_t max_tokens) {
    Result<std::unique_ptr<Session>> s = (*model)->NewSession();
    Result<Completion> c = (*s)->Generate(prompt, {.max_tokens = max_tokens, .sampling = {.temperature = 0}});
    EXPECT_TRUE(c.ok()) << c.status().message();
    return ascii(c->text);
  };
  std::string first = "Once upon a time, there was a little girl named Lily. She liked to play in the park.";
  first += " " + first + " " + first;  // more than a prefill block of tokens
  const std::string second = first + " One day she saw a dog.";   // extends what the session holds
  const std::string third = first.substr(0, 24) + " the cat sat.";  // shares a few tokens
  const std::string prefix_dir = dir + "/prefixes";
  {
    TestServer server({.parallel = 1, .prefix_cache_dir = prefix_dir}, {}, **model);
    // One new token: the session (and its snapshot) then holds exactly the prompt (the sampled
    // token is not run), so the next prompt extends all of it.
    EXPECT_EQ(server.Stream(first, 1).cached_tokens, 0);
    const StreamResult warm = server.Stream(second, 1);
    EXPECT_GT(warm.cached_tokens, 60);
    EXPECT_EQ(ascii(warm.text), alone(second, 1));
    EXPECT_EQ(server.metrics.prefix_hits_live.load(), 1);
    const StreamResult part = server.Stream(third, 8);
    EXPECT_EQ(part.cached_tokens, 0) << "a part of a hybrid's cache cannot be kept";
    EXPECT_EQ(ascii(part.text), alone(third, 8));
    EXPECT_EQ(server.metrics.prefix_hits_live.load(), 1);
  }
  {
    TestServer restarted({.parallel = 1, .prefix_cache_dir = prefix_dir}, {}, **model);
    const StreamResult r = restarted.Stream(second + " It ran.", 8);
    EXPECT_GT(r.cached_tokens, 60);  // the second request's snapshot, state included
    EXPECT_EQ(ascii(r.text), alone(second + " It ran.", 8));
    EXPECT_EQ(restarted.metrics.prefix_hits_disk.load(), 1);
    EXPECT_EQ(restarted.metrics.prefix_snapshots_refused.load(), 0);
  }
  std::filesystem::remove_all(dir);
}

TEST(Serve, BadRequestsGetTheirStatusAndTheServerKeepsServing) {
  TestServer server({.parallel = 1, .max_queue = 1, .kv_budget_per_session_bytes = 64 * 1024},
                    {.max_body_bytes = 4096});
  auto status = [&](const httplib::Result& r) { return r ? r->status : 0; };
  EXPECT_EQ(status(server.Post("/v1/completions", "{oops")), 400);
  EXPECT_EQ(status(server.Post("/v1/completions", R"({"prompt":1})")), 400);
  EXPECT_EQ(status(server.Post("/v1/completions", R"({"prompt":"x","max_tokens":-3})")), 400);
  EXPECT_EQ(status(server.Post("/v1/completions", R"({"prompt":"x","max_tokens":100000000})")), 400);
  httplib::Result unknown = server.Post("/v1/completions", R"({"prompt":"x","model":"gpt-9"})");
  EXPECT_EQ(status(unknown), 404);
  EXPECT_EQ(Body(unknown)["error"]["code"], "model_not_found");
  // A request whose positions need more KV than a session may hold (64 KiB: 102 positions at 640 B each in f16).
  httplib::Result big = server.Post("/v1/completions", R"({"prompt":"Once upon a time","max_tokens":400})");
  EXPECT_EQ(status(big), 413);
  EXPECT_EQ(Body(big)["error"]["code"], "kv_budget_exceeded");
  // A body over the limit; an unknown route: JSON errors too.
  httplib::Result huge = server.Post("/v1/completions", json{{"prompt", std::string(8000, 'a')}}.dump());
  EXPECT_EQ(status(huge), 413);
  httplib::Result nowhere = server.Get("/v2/nothing");
  EXPECT_EQ(status(nowhere), 404);
  EXPECT_TRUE(Body(nowhere).contains("error"));
  // A prompt past the context.
  std::string long_prompt;
  for (int i = 0; i < 200; ++i) long_prompt += "the dog ran. ";
  httplib::Result too_long = server.Post("/v1/completions", json{{"prompt", long_prompt}, {"max_tokens", 1}}.dump());
  EXPECT_EQ(status(too_long), 400);
  // Still serving.
  httplib::Result fine = server.Post("/v1/completions", R"({"prompt":"The cat","max_tokens":5,"temperature":0})");
  EXPECT_EQ(status(fine), 200);
  EXPECT_EQ(status(server.Get("/health")), 200);
  const std::string metrics = server.Get("/metrics")->body;
  EXPECT_NE(metrics.find("kvq_requests_total{route=\"/v1/completions\",code=\"400\"} 5"), std::string::npos) << metrics;
}

// Constrained output: llama.cpp's grammar and json_schema, OpenAI's response_format, on both
// endpoints (sampled at temperature 1, so the grammar decides the shape); bad ones are 400s naming
// the field.
TEST(Serve, GrammarJsonSchemaAndResponseFormat) {
  TestServer server;
  const json schema = json::parse(R"({"type":"object","properties":{"n":{"type":"integer"},
      "tag":{"enum":["a","b"]}},"required":["n","tag"]})");
  auto valid = [](const std::string& text) {
    const json v = json::parse(text, nullptr, false);
    return !v.is_discarded() && v.is_object() && v.size() == 2 && v["n"].is_number_integer() &&
           (v["tag"] == "a" || v["tag"] == "b");
  };
  const json chat_messages = {{{"role", "user"}, {"content", "Give me JSON."}}};
  for (int seed = 0; seed < 3; ++seed) {
    json c = {{"prompt", "Once upon a time"}, {"max_tokens", 200}, {"temperature", 1}, {"seed", seed},
              {"grammar", "root ::= \"yes\" | \"no\""}};
    json j = Body(server.Post("/v1/completions", c.dump()));
    const std::string yes_no = j["choices"][0]["text"];
    EXPECT_TRUE(yes_no == "yes" || yes_no == "no") << j.dump();
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
    c.erase("grammar");
    c["json_schema"] = schema;
    j = Body(server.Post("/v1/completions", c.dump()));
    EXPECT_TRUE(valid(j["choices"][0]["text"])) << j.dump();
    json chat = {{"messages", chat_messages}, {"max_tokens", 200}, {"temperature", 1}, {"seed", seed},
                 {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "t"}, {"schema", schema}}}}}};
    j = Body(server.Post("/v1/chat/completions", chat.dump()));
    EXPECT_TRUE(valid(j["choices"][0]["message"]["content"])) << j.dump();
    // Any object: its strings are unbounded, so the story model may still be inside one at
    // max_tokens; the text is then a prefix of an object (the matcher takes it), else an object.
    chat["response_format"] = {{"type", "json_object"}};
    j = Body(server.Post("/v1/chat/completions", chat.dump()));
    const std::string content = j["choices"][0]["message"]["content"];
    Result<Grammar> any_object = ParseGbnf(JsonObjectGrammar());
    ASSERT_TRUE(any_object.ok());
    GrammarMatcher m(std::make_shared<const Grammar>(std::move(any_object).value()));
    EXPECT_TRUE(m.Accept(content)) << j.dump();
    if (j["choices"][0]["finish_reason"] == "stop") {
      EXPECT_TRUE(json::parse(content, nullptr, false).is_object()) << j.dump();
    } else {
      EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
    }
  }
  const std::pair<json, std::string> bad[] = {
      {{{"grammar", "root ::= ("}}, "grammar"},
      {{{"grammar", 5}}, "grammar"},
      {{{"json_schema", {{"type", "string"}, {"pattern", "a+"}}}}, "json_schema"},
      {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "nope"}}}}}}}},
       "response_format.json_schema.schema"},
      {{{"response_format", {{"type", "yaml"}}}}, "response_format"},
      {{{"grammar", "root ::= \"a\""}, {"json_schema", json::object()}}, "grammar"},
  };
  for (const auto& [fields, param] : bad) {
    json body = {{"prompt", "x"}, {"max_tokens", 4}};
    body.update(fields);
    httplib::Result r = server.Post("/v1/completions", body.dump());
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << body.dump() << " " << r->body;
    EXPECT_EQ(Body(r)["error"]["param"], param) << r->body;
  }
}

TEST(Serve, AFullQueueGets429) {
  TestServer server({.parallel = 1, .max_queue = 1});
  // 24 requests at once for one session and one queue place: the rest are refused, not dropped.
  std::vector<int> statuses(24);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < statuses.size(); ++i) {
    threads.emplace_back([&, i] {
      httplib::Result r = server.Post("/v1/completions", R"({"prompt":"Once","max_tokens":300,"ignore_eos":true})");
      statuses[i] = r ? r->status : -static_cast<int>(r.error());
    });
  }
  for (std::thread& t : threads) t.join();
  const auto count = [&](int s) { return std::count(statuses.begin(), statuses.end(), s); };
  EXPECT_GE(count(200), 1);
  EXPECT_GE(count(429), 1);
  EXPECT_EQ(count(200) + count(429), static_cast<long>(statuses.size()))
      << ::testing::PrintToString(statuses);
  httplib::Result after = server.Post("/v1/completions", R"({"prompt":"x","max_tokens":2})");
  EXPECT_EQ(after ? after->status : 0, 200);
}

TEST(Serve, ApiKeyIsRequiredWhenSet) {
  TestServer server({}, {.api_key = "sekret"});
  const std::string body = R"({"prompt":"The dog","max_tokens":3})";
  httplib::Result none = server.Post("/v1/completions", body);
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(Body(none)["error"]["code"], "invalid_api_key");
  EXPECT_EQ(server.Post("/v1/completions", body, {{"Authorization", "Bearer wrong"}})->status, 401);
  EXPECT_EQ(server.Get("/metrics")->status, 401);
  EXPECT_EQ(server.Post("/v1/completions", body, {{"Authorization", "Bearer sekret"}})->status, 200);
  EXPECT_EQ(server.Get("/v1/models", {{"Authorization", "Bearer sekret"}})->status, 200);
  EXPECT_EQ(server.Get("/health")->status, 200);  // liveness probes carry no key
}

TEST(Serve, TheTotalKvBudgetQueuesWhatDoesNotFitNowAndRefusesWhatNeverFits) {
  // Room for one request of 200 positions (640 B each in f16 here) but not two: the second waits
  // for the first to finish (idle sessions' caches are dropped to make room), then runs.
  TestServer server({.parallel = 2, .kv_budget_bytes = 200 * 640 + 100 * 640});
  const std::string a = "Once upon a time", b = "The cat sat";
  std::vector<StreamResult> results(2);
  std::thread ta([&] { results[0] = server.Stream(a, 190, true); });
  std::thread tb([&] { results[1] = server.Stream(b, 190, true); });
  ta.join();
  tb.join();
  EXPECT_EQ(results[0].error, "");
  EXPECT_EQ(results[1].error, "");
  EXPECT_EQ(results[0].completion_tokens, 190);
  EXPECT_EQ(results[1].completion_tokens, 190);
  EXPECT_GT(server.metrics.kv_bytes_reserved_peak.load(), 190 * 640);
  EXPECT_LE(server.metrics.kv_bytes_reserved_peak.load(), 300 * 640);  // the budget held
  // One that alone needs more than the whole budget: 413, at once.
  httplib::Result never = server.Post("/v1/completions", R"({"prompt":"Once","max_tokens":480})");
  ASSERT_TRUE(never);
  EXPECT_EQ(never->status, 413);
  EXPECT_NE(Body(never)["error"]["message"].get<std::string>().find("--kv-budget"), std::string::npos);
}

TEST(Serve, ARequestPastItsTimeoutGets504) {
  TestServer server({.parallel = 1}, {.request_timeout_seconds = 1e-6});
  httplib::Result r = server.Post("/v1/completions", R"({"prompt":"Once","max_tokens":400,"ignore_eos":true})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 504) << r->body;
  EXPECT_EQ(Body(r)["error"]["code"], "timeout");
}

TEST(Serve, ServesTheWebBundleBesideTheChatPage) {
  const std::string dir = testing::TempDir() + "/kvq_serve_web_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/index.html") << "<!doctype html><title>kvq</title>";
  TestServer server({}, {.api_key = "k", .web_root = dir});
  httplib::Result page = server.Get("/index.html");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);  // static files need no key: the page holds no secrets
  EXPECT_NE(page->body.find("<title>kvq</title>"), std::string::npos);
  // Cross-origin isolated, so the page may use SharedArrayBuffer (its threaded build).
  EXPECT_EQ(page->get_header_value("Cross-Origin-Opener-Policy"), "same-origin");
  EXPECT_EQ(page->get_header_value("Cross-Origin-Embedder-Policy"), "require-corp");
  EXPECT_EQ(server.Get("/v1/models")->status, 401);
  std::filesystem::remove_all(dir);
}

// A raw loopback connection, for clients that misbehave below HTTP.
int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

TEST(Serve, AClientThatDisconnectsMidStreamFreesItsSession) {
  TestServer server({.parallel = 1});
  const int fd = Connect(server.port);
  const std::string body = R"({"prompt":"Once upon a time","max_tokens":450,"ignore_eos":true,"stream":true})";
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  char buf[256];
  ASSERT_GT(recv(fd, buf, sizeof(buf), 0), 0);  // the stream has started
  close(fd);
  // The session is freed long before 450 tokens would have been generated on a busy server, and the
  // next request (which needs the only session) is served.
  const auto start = std::chrono::steady_clock::now();
  const StreamResult next = server.Stream("The cat", 8);
  EXPECT_EQ(next.error, "");
  EXPECT_LT(server.metrics.generated_tokens.load(), 450 + 8);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(Serve, AClientThatStallsInItsHeadersIsDropped) {
  TestServer server({}, {.read_timeout_seconds = 1});
  const int fd = Connect(server.port);
  const std::string partial = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-";
  ASSERT_EQ(send(fd, partial.data(), partial.size(), 0), static_cast<ssize_t>(partial.size()));
  // Others are served meanwhile.
  EXPECT_EQ(server.Stream("The dog", 4).error, "");
  // The server ends the stalled connection after its read timeout: closed, or a 4xx and closed.
  timeval tv{.tv_sec = 10, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const auto start = std::chrono::steady_clock::now();
  std::string got;
  char buf[256];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) got.append(buf, static_cast<size_t>(n));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE(got.empty() || got.starts_with("HTTP/1.1 4")) << got;
  close(fd);
}

}  // namespace
}  // namespace kvq::server
