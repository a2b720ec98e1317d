// kvq serve's sampling fields end to end, on the bundled stories260K in process: logprobs (the
// completions and chat shapes, streamed too) against a log-softmax recomputed here from the
// session's logits; penalties and logit_bias against Session::Generate with the same options and
// a scalar recomputation of the first token; n = 4 equals four requests seeded seed .. seed + 3,
// its other choices forked from the first's session after the prompt (not prefilled again);
// llama.cpp's n_predict honoured and its samplers kvq lacks refused with a 400 naming them.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <thread>

#include "kvq/model.h"
#include "kvq/session.h"
#include "server/engine.h"
#include "test_util/bundled_model.h"
#include "server/http_server.h"

namespace kvq::server {
namespace {

using json = nlohmann::json;
const std::string kPrompt = "Once upon a time, there was a little dog";

const Model& Bundled() { return test::BundledModel(); }

class Server {
 public:
  explicit Server(int32_t parallel = 2) {
    Result<std::unique_ptr<Engine>> e = Engine::Create(Bundled(), {.parallel = parallel}, &metrics_);
    EXPECT_TRUE(e.ok()) << e.status().message();
    engine_ = std::move(e).value();
    http_ = std::make_unique<HttpServer>(Bundled(), *engine_, metrics_, ServerOptions{.port = 0, .model_id = "m"});
    port_ = *http_->Bind();
    thread_ = std::thread([this] { http_->Serve(); });
  }
  ~Server() {
    http_->Stop();
    thread_.join();
  }
  // The response body (its status checked).
  json Post(const std::string& path, const json& body, int status = 200) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(std::chrono::seconds(60));
    httplib::Result r = c.Post(path, body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return json();
    EXPECT_EQ(r->status, status) << r->body;
    return json::parse(r->body);
  }
  // The data events of a streamed request, parsed ([DONE] left out).
  const Metrics& metrics() const { return metrics_; }
  std::vector<json> Stream(const std::string& path, json body) {
    body["stream"] = true;
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(std::chrono::seconds(60));
    httplib::Result r = c.Post(path, body.dump(), "application/json");
    std::vector<json> events;
    if (!r) return events;
    for (size_t at = 0; (at = r->body.find("data: ", at)) != std::string::npos;) {
      const size_t end = r->body.find("\n\n", at);
      const std::string data = r->body.substr(at + 6, end - at - 6);
      if (data != "[DONE]") events.push_back(json::parse(data));
      at = end;
    }
    return events;
  }

 private:
  Metrics metrics_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<HttpServer> http_;
  std::thread thread_;
  int port_ = 0;
};

// log-softmax of logits, in double, as the test's own recomputation.
std::vector<double> LogSoftmax(std::span<const float> logits) {
  const double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(l - max);
  std::vector<double> out;
  for (float l : logits) out.push_back(l - max - std::log(sum));
  return out;
}

// The logits after each of `generated` (and after the prompt) as a session computes them.
std::vector<std::vector<float>> LogitsAlong(const std::vector<int32_t>& prompt, const std::vector<int32_t>& generated) {
  std::unique_ptr<Session> s = std::move(Bundled().NewSession()).value();
  EXPECT_TRUE(s->Prefill(prompt).ok());
  std::vector<std::vector<float>> out = {{s->logits().begin(), s->logits().end()}};
  for (int32_t id : generated) {
    EXPECT_TRUE(s->Decode(id).ok());
    out.push_back({s->logits().begin(), s->logits().end()});
  }
  return out;
}

TEST(ServeSampling, LogprobsAreTheModelsLogSoftmax) {
  Server server;
  const json c = server.Post("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 3}});
  const json& lp = c["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), c["usage"]["completion_tokens"].get<size_t>()) << c.dump();
  const std::vector<int32_t> prompt = Bundled().Tokenize(kPrompt);
  // Greedy: each token is the argmax, so recompute along the ids whose texts the response gives.
  std::vector<int32_t> ids;
  std::vector<std::vector<float>> along = LogitsAlong(prompt, {});
  for (size_t t = 0; t < lp["tokens"].size(); ++t) {
    const std::vector<double> expected = LogSoftmax(along.back());
    const int32_t argmax = static_cast<int32_t>(std::max_element(expected.begin(), expected.end()) - expected.begin());
    EXPECT_FLOAT_EQ(lp["token_logprobs"][t].get<float>(), static_cast<float>(expected[argmax])) << t;
    EXPECT_EQ(lp["tokens"][t], Bundled().TokenText(ids.empty() ? prompt.back() : ids.back(), argmax)) << t;
    EXPECT_EQ(lp["top_logprobs"][t].size(), 3u);
    ids.push_back(argmax);
    along = LogitsAlong(prompt, ids);
  }
  // Chat: the same numbers in the chat shape, streamed equal to whole.
  const json chat = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 5}, {"temperature", 0},
                     {"logprobs", true}, {"top_logprobs", 2}};
  const json whole = server.Post("/v1/chat/completions", chat);
  const json& content = whole["choices"][0]["logprobs"]["content"];
  ASSERT_GE(content.size(), 1u);
  EXPECT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(content[0]["top_logprobs"][0]["logprob"], content[0]["logprob"]);  // greedy: the top one
  json streamed = json::array();
  for (const json& e : server.Stream("/v1/chat/completions", chat)) {
    if (e["choices"].empty() || !e["choices"][0].contains("logprobs")) continue;
    for (const json& entry : e["choices"][0]["logprobs"]["content"]) streamed.push_back(entry);
  }
  EXPECT_EQ(streamed, content);
}

TEST(ServeSampling, PenaltiesAndLogitBiasAreTheCoresAndTheirDefinitions) {
  Server server;
  const SamplerOptions options{.temperature = 0, .seed = 1, .repeat_penalty = 1.8f, .frequency_penalty = 0.7f,
                               .presence_penalty = 0.4f, .repeat_last_n = 16, .logit_bias = {{100, 3.0f}}};
  const json c = server.Post("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 30}, {"temperature", 0},
                                                 {"repeat_penalty", 1.8}, {"frequency_penalty", 0.7},
                                                 {"presence_penalty", 0.4}, {"repeat_last_n", 16},
                                                 {"logit_bias", {{"100", 3.0}}}});
  std::unique_ptr<Session> s = std::move(Bundled().NewSession()).value();
  Result<Completion> alone = s->Generate(kPrompt, {.max_tokens = 30, .sampling = options});
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ(c["choices"][0]["text"], alone->text);
  const json plain = server.Post("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 30}, {"temperature", 0}});
  EXPECT_NE(plain["choices"][0]["text"], c["choices"][0]["text"]) << "the penalties changed nothing";
  // The first token, recomputed from the prompt's logits by the definitions.
  const std::vector<int32_t> prompt = Bundled().Tokenize(kPrompt);
  std::vector<float> l = LogitsAlong(prompt, {})[0];
  l[100] += 3.0f;
  std::map<int32_t, int> count;
  for (size_t i = prompt.size() > 16 ? prompt.size() - 16 : 0; i < prompt.size(); ++i) ++count[prompt[i]];
  for (const auto& [id, n] : count) {
    l[id] = l[id] > 0 ? l[id] / 1.8f : l[id] * 1.8f;
    l[id] -= static_cast<float>(n) * 0.7f + 0.4f;
  }
  const int32_t first = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  EXPECT_EQ(alone->tokens[0], first);
  // A bias of +100 makes a token the greedy choice; ids past the vocabulary are refused.
  const json forced = server.Post("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 1}, {"temperature", 0},
                                                      {"logit_bias", {{"77", 100}}}, {"logprobs", 0}});
  EXPECT_EQ(forced["choices"][0]["logprobs"]["tokens"][0], Bundled().TokenText(prompt.back(), 77));
  const json bad = server.Post("/v1/completions", {{"prompt", kPrompt}, {"logit_bias", {{"512", 1}}}}, 400);
  EXPECT_EQ(bad["error"]["param"], "logit_bias");
}

TEST(ServeSampling, NChoicesEqualSeparateSeededRequests) {
  Server server(4);
  const json base = {{"prompt", kPrompt}, {"max_tokens", 12}, {"temperature", 1.0}, {"top_k", 0}, {"top_p", 1.0},
                     {"min_p", 0}};
  json four = base;
  four["n"] = 4;
  four["seed"] = 41;
  const json together = server.Post("/v1/completions", four);
  ASSERT_EQ(together["choices"].size(), 4u);
  // With four idle slots, choices 1..3 ran from forks of choice 0's session: their prompts were
  // reused whole, not prefilled.
  const int64_t prompt = static_cast<int64_t>(Bundled().Tokenize(kPrompt).size());
  EXPECT_EQ(server.metrics().prompt_tokens.load(), 4 * prompt);
  EXPECT_EQ(server.metrics().prompt_tokens_reused.load(), 3 * prompt);
  std::set<std::string> distinct;
  int64_t tokens = 0;
  for (int i = 0; i < 4; ++i) {
    json one = base;
    one["seed"] = 41 + i;
    const json alone = server.Post("/v1/completions", one);
    EXPECT_EQ(together["choices"][i]["index"], i);
    EXPECT_EQ(together["choices"][i]["text"], alone["choices"][0]["text"]) << i;
    distinct.insert(alone["choices"][0]["text"].get<std::string>());
    tokens += alone["usage"]["completion_tokens"].get<int64_t>();
  }
  EXPECT_GT(distinct.size(), 1u) << "four seeds gave one text: the seeds are not used";
  EXPECT_EQ(together["usage"]["completion_tokens"], tokens);
  // Streamed: each chunk is one choice's (choices[0].index), and the pieces of choice i make the
  // same text as choice i unstreamed, each choice ending once with its own finish_reason; the usage
  // (stream_options.include_usage) counts all four.
  json streamed = four;
  streamed["stream_options"] = {{"include_usage", true}};
  std::vector<std::string> texts(4);
  std::vector<int> finishes(4, 0);
  json usage;
  for (const json& e : server.Stream("/v1/completions", streamed)) {
    if (e["choices"].empty()) {
      usage = e["usage"];
      continue;
    }
    ASSERT_EQ(e["choices"].size(), 1u);
    const int index = e["choices"][0]["index"].get<int>();
    ASSERT_TRUE(index >= 0 && index < 4) << e.dump();
    EXPECT_EQ(finishes[index], 0) << "choice " << index << " goes on after its finish_reason";
    texts[index] += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) ++finishes[index];
  }
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(texts[i], together["choices"][i]["text"]) << i;
    EXPECT_EQ(finishes[i], 1) << i;
  }
  EXPECT_EQ(usage["completion_tokens"], tokens);
}

TEST(ServeSampling, LlamaCppFieldsAreHonouredOrRefused) {
  Server server;
  const json by_n_predict = server.Post("/v1/completions", {{"prompt", kPrompt}, {"n_predict", 7}, {"temperature", 0},
                                                            {"ignore_eos", true}});
  EXPECT_EQ(by_n_predict["usage"]["completion_tokens"], 7);
  for (const char* field : {"typical_p", "mirostat", "dry_multiplier", "xtc_probability", "tfs_z", "n_probs"}) {
    const json e = server.Post("/v1/completions", {{"prompt", "x"}, {field, 0.5}}, 400);
    EXPECT_EQ(e["error"]["param"], field);
  }
  for (const char* field : {"repeat_penalty", "frequency_penalty", "presence_penalty"}) {
    EXPECT_EQ(server.Post("/v1/completions", {{"prompt", "x"}, {field, "a lot"}}, 400)["error"]["param"], field);
  }
  EXPECT_EQ(server.Post("/v1/completions", {{"prompt", "x"}, {"repeat_penalty", 0}}, 400)["error"]["param"],
            "repeat_penalty");
}

}  // namespace
}  // namespace kvq::server
