// Speculative decoding in kvq serve, end to end on loopback in process: with each draft source as
// the server's default (a draft model included) concurrent requests, greedy and greedy with
// penalties, give what they give alone; a hybrid speculates (its recurrent state restored from a
// copy when a draft is rejected) and a hybrid cache that cannot drop a row at a time is refused;
// requests ask for speculation with kvq's and llama-server's fields, and bad ones get a 400; a
// request's draft-model session counts against the KV budgets.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "kvq/kv_memory.h"
#include "kvq/model.h"
#include "kvq/session.h"
#include "kvq/speculation.h"
#include "server/engine.h"
#include "synth/synth.h"
#include "test_util/serve_in_process.h"

namespace kvq::server {
namespace {

using json = nlohmann::json;
using test::Alone;
using test::Body;
using test::Bundled;
using test::kDir;
using test::TestServer;

// Greedy with penalties (repeat, frequency, presence over the last 32 tokens): each judged
// position's window must end before it, taking in the drafted tokens kept before it and none after.
const SamplerOptions kPenalized = {.temperature = 0, .repeat_penalty = 1.3f, .frequency_penalty = 0.5f,
                                   .presence_penalty = 0.4f, .repeat_last_n = 32};
json PenalizedBody(const std::string& prompt, int32_t max_tokens) {
  return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"repeat_penalty", 1.3},
          {"frequency_penalty", 0.5}, {"presence_penalty", 0.4}, {"repeat_last_n", 32}};
}

// Without speculation and with each draft source as the server's default (ungated, so that drafts
// run and are rejected often; the draft model is the target itself with a 2-bit KV cache, which
// mostly, not always, agrees with it): a session's draft is its segment of the batched step, and
// every request, greedy or greedy with penalties, gives what it gives alone.
TEST(Serve, ConcurrentRequestsEqualTheSameRequestsAlone) {
  const std::vector<std::string> prompts = {"Once upon a time", "The cat sat", "Lily went to the park",
                                            "Tom had a red ball", "One day, a bird", "The sun was hot"};
  std::vector<std::string> alone, alone_penalized;
  for (const std::string& p : prompts) {
    alone.push_back(Alone(p, 48));
    alone_penalized.push_back(Alone(p, 48, kPenalized));
  }
  for (const DraftSource source : DraftSources()) {
    SCOPED_TRACE(DraftSourceName(source));
    SpeculationOptions spec = {.source = source, .max_draft = 6, .ungated = true};
    if (source == DraftSource::kModel) {
      spec = {.source = source, .max_draft = 4, .min_draft_probability = 1e-6, .ungated = true,
              .draft_model = &Bundled(), .draft_kv = {.key_format = "int2", .value_format = "int2"}};
    }
    TestServer server({.parallel = 4, .speculation = spec});
    // Even requests streamed plain, odd ones with penalties.
    std::vector<std::string> texts(4 * prompts.size()), errors(texts.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < texts.size(); ++i) {
      threads.emplace_back([&, i] {
        const std::string& prompt = prompts[i / 2 % prompts.size()];
        if (i % 2 == 0) {
          const StreamResult r = server.Stream(prompt, 48);
          texts[i] = r.text;
          errors[i] = r.error;
        } else {
          const json j = Body(server.Post("/v1/completions", PenalizedBody(prompt, 48).dump()));
          texts[i] = j["choices"][0].value("text", "(no text: " + j.dump() + ")");
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (size_t i = 0; i < texts.size(); ++i) {
      const size_t p = i / 2 % prompts.size();
      EXPECT_EQ(errors[i], "") << i;
      EXPECT_EQ(texts[i], i % 2 == 0 ? alone[p] : alone_penalized[p]) << prompts[p] << (i % 2 ? " (penalties)" : "");
    }
    EXPECT_GT(server.metrics.steps.load(), 0);
    const int64_t drafted = server.metrics.spec_draft_tokens.load();
    const int64_t kept = server.metrics.spec_accepted_tokens.load();
    if (source == DraftSource::kNone) {
      EXPECT_EQ(drafted, 0);
    } else {  // drafts both kept and rejected, or the comparison proved little
      EXPECT_GT(kept, 0);
      EXPECT_LT(kept, drafted);
    }
  }
}

// A hybrid (tiny-qwen35: recurrent layers beside attention ones) speculates too: a rejected draft's
// KV rows are dropped and the recurrent state restored from its copy before the pass. Concurrent
// requests, plain and with penalties, give what they give alone. A KV spec that cannot drop one row
// at a time (sinks and a residual) is refused: at start as the default, per request with a 400.
TEST(Serve, AHybridSpeculatesAndGivesWhatItGivesAlone) {
  const std::string dir = testing::TempDir() + "/kvq_serve_hybrid_spec_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/tiny-qwen35.gguf";
  ASSERT_TRUE(WriteSynthModel(*SynthPreset("tiny-qwen35"), kDir + "stories260K.gguf", path).ok());
  Result<std::unique_ptr<Model>> model = Model::Load(path, {.threads = 1});
  ASSERT_TRUE(model.ok()) << model.status().message();
  // The random model's stray bytes become U+FFFD in JSON: compared on the ASCII characters, and on
  // the number of tokens.
  auto ascii = [](const std::string& text) {
    std::string out;
    for (const char ch : text) {
      if (static_cast<unsigned char>(ch) < 0x80) out += ch;
    }
    return out;
  };
  const std::vector<std::string> prompts = {"Once upon a time", "The cat sat on the mat. The cat sat",
                                            "Lily went to the park"};
  const int32_t kTokens = 40;
  // The random model's text seldom repeats: prompt-lookup drafts are mostly rejected; the model
  // drafting for itself with a 2-bit cache mostly, not always, agrees with itself.
  for (const DraftSource source : {DraftSource::kNgram, DraftSource::kModel}) {
    SCOPED_TRACE(DraftSourceName(source));
    SpeculationOptions spec = {.source = source, .max_draft = 4, .ungated = true};
    if (source == DraftSource::kModel) {
      spec = {.source = source, .max_draft = 4, .min_draft_probability = 1e-6, .ungated = true,
              .draft_model = model->get(), .draft_kv = {.key_format = "int2", .value_format = "int2"}};
    }
    TestServer server({.parallel = 3, .speculation = spec}, {}, **model);
    std::vector<json> replies(2 * prompts.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < replies.size(); ++i) {
      threads.emplace_back([&, i] {
        const std::string& prompt = prompts[i / 2];
        const json body = i % 2 == 0 ? json{{"prompt", prompt}, {"max_tokens", kTokens}, {"temperature", 0}}
                                     : PenalizedBody(prompt, kTokens);
        replies[i] = Body(server.Post("/v1/completions", body.dump()));
      });
    }
    for (std::thread& t : threads) t.join();
    for (size_t i = 0; i < replies.size(); ++i) {
      const std::string& prompt = prompts[i / 2];
      Result<std::unique_ptr<Session>> s = (*model)->NewSession();
      Result<Completion> c = (*s)->Generate(
          prompt, {.max_tokens = kTokens, .sampling = i % 2 == 0 ? SamplerOptions{.temperature = 0} : kPenalized});
      ASSERT_TRUE(c.ok()) << c.status().message();
      EXPECT_EQ(ascii(replies[i]["choices"][0].value("text", "")), ascii(c->text)) << i << ": " << replies[i].dump();
      EXPECT_EQ(replies[i]["usage"].value("completion_tokens", -1), static_cast<int64_t>(c->tokens.size())) << i;
    }
    const int64_t drafted = server.metrics.spec_draft_tokens.load();
    const int64_t kept = server.metrics.spec_accepted_tokens.load();
    std::printf("hybrid, %s drafts: kept %lld of %lld drafted tokens\n", DraftSourceName(source),
                static_cast<long long>(kept), static_cast<long long>(drafted));
    EXPECT_LT(kept, drafted);  // rejected drafts, so states were restored
    if (source == DraftSource::kModel) {
      EXPECT_GT(kept, 0);
    }
  }
  const EngineOptions grouped = {.kv = {.key_format = "int4+sink4+res64", .value_format = "int4+sink4+res64"},
                                 .speculation = {.source = DraftSource::kNgram}};
  Metrics metrics;
  Result<std::unique_ptr<Engine>> refused = Engine::Create(**model, grouped, &metrics);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--spec ngram: speculative decoding on a hybrid model"), std::string::npos)
      << refused.status().message();
  TestServer server({.parallel = 1, .kv = grouped.kv}, {}, **model);
  httplib::Result r = server.Post("/v1/completions", json{{"prompt", "The cat"}, {"max_tokens", 4}, {"spec", "ngram"}}.dump());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_EQ(Body(r)["error"]["param"], "spec") << r->body;
  // Without speculation it serves.
  r = server.Post("/v1/completions", json{{"prompt", "The cat"}, {"max_tokens", 4}}.dump());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  std::filesystem::remove_all(dir);
}

// Per request: kvq's `spec` and llama-server's `speculative.*` fields on a server without a
// default; the text is the request's alone, its timings carry its drafted and kept tokens under
// llama-server's names (draft_n, draft_n_accepted; absent when nothing was drafted), streamed
// too, /metrics counts the drafts under kvq's, vLLM's and llama-server's names, and a bad field is
// a 400 naming it.
TEST(Serve, ARequestAsksForSpeculation) {
  // Ungated (the server's default, under what a request asks): every asking request drafts. Gated,
  // a request resuming its slot's gate after one on the same prompt may rightly draft nothing here.
  TestServer server({.parallel = 2, .speculation = {.ungated = true}});
  const std::string prompt = "Once upon a time, there was a little dog";
  const std::string want = Alone(prompt, 40);
  const std::vector<json> asks = {{{"spec", "suffix"}, {"speculative.n_max", 5}},
                                  {{"speculative.n_max", 3}, {"speculative.n_min", 2}},
                                  {{"spec", "ngram"}, {"speculative.n_max", 0}}};
  int64_t drafted = 0, accepted = 0;
  for (const json& ask : asks) {
    for (const bool stream : {false, true}) {
      json body = {{"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0}, {"stream", stream}};
      body.update(ask);
      httplib::Result r = server.Post("/v1/completions", body.dump());
      ASSERT_TRUE(r);
      // Streamed, the last chunk carries the timings.
      const size_t last = r->body.rfind("data: {");
      const json j = stream ? json::parse(r->body.substr(last + 6, r->body.find('\n', last) - last - 6), nullptr, false)
                            : Body(r);
      if (!stream) {
        EXPECT_EQ(j["choices"][0]["text"], want) << ask.dump();
      }
      const int64_t now = server.metrics.spec_draft_tokens.load();
      const int64_t now_accepted = server.metrics.spec_accepted_tokens.load();
      // The request's own counts under llama-server's names, as it writes them: only when a draft ran.
      const json timings = j.value("timings", json::object());
      if (ask.value("speculative.n_max", 1) == 0) {
        EXPECT_EQ(now, drafted) << ask.dump();  // n_max 0: none
        EXPECT_FALSE(timings.contains("draft_n")) << timings.dump();
      } else {
        EXPECT_GT(now, drafted) << ask.dump();
        EXPECT_EQ(timings.value("draft_n", int64_t{-1}), now - drafted) << ask.dump() << " " << timings.dump();
        EXPECT_EQ(timings.value("draft_n_accepted", int64_t{-1}), now_accepted - accepted) << timings.dump();
      }
      drafted = now;
      accepted = now_accepted;
    }
  }
  const json chat = {{"messages", {{{"role", "user"}, {"content", "Tell me a story."}}}}, {"max_tokens", 30},
                     {"temperature", 0}, {"spec", "ngram"}};
  const json c = Body(server.Post("/v1/chat/completions", chat.dump()));
  EXPECT_EQ(c["choices"][0]["message"]["content"],
            Alone("<|im_start|>user\nTell me a story.<|im_end|>\n<|im_start|>assistant\n", 30));
  // Sampled (seeded) and with logprobs: the same draws and the same logprobs as without a draft.
  for (const json& extra : {json{{"temperature", 0.9}, {"seed", 17}}, json{{"temperature", 0}, {"logprobs", 3}}}) {
    json body = {{"prompt", prompt + ". " + prompt}, {"max_tokens", 40}};
    body.update(extra);
    const json plain = Body(server.Post("/v1/completions", body.dump()));
    body.update(json{{"spec", "ngram"}, {"speculative.n_max", 6}});
    const int64_t before = server.metrics.spec_draft_tokens.load();
    const json spec = Body(server.Post("/v1/completions", body.dump()));
    EXPECT_GT(server.metrics.spec_draft_tokens.load(), before) << extra.dump();
    EXPECT_EQ(spec["choices"][0]["text"], plain["choices"][0]["text"]) << extra.dump();
    EXPECT_EQ(spec["choices"][0]["logprobs"], plain["choices"][0]["logprobs"]) << extra.dump();
  }
  httplib::Result m = server.Get("/metrics");
  ASSERT_TRUE(m);
  for (const char* name : {"vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                           "vllm:spec_decode_num_accepted_tokens_total", "kvq_spec_draft_tokens_total"}) {
    EXPECT_NE(m->body.find(std::string(name) + " "), std::string::npos) << name;
  }
  // Every name of the same count gives it: kvq's, vLLM's and llama-server's.
  for (const auto& [suffix, count] : std::vector<std::pair<std::string, int64_t>>{
           {"num_drafts_total", server.metrics.spec_drafts.load()},
           {"num_draft_tokens_total", server.metrics.spec_draft_tokens.load()},
           {"num_accepted_tokens_total", server.metrics.spec_accepted_tokens.load()}}) {
    for (const char* prefix : {"vllm:", "llamacpp:"}) {
      EXPECT_NE(m->body.find(fmt::format("\n{}spec_decode_{} {}\n", prefix, suffix, count)), std::string::npos)
          << prefix << suffix;
    }
  }
  const std::vector<std::pair<json, std::string>> bad = {{{{"spec", "eagle"}}, "spec"},
                                                         {{{"spec", "draft"}}, "spec"},
                                                         {{{"speculative.n_max", 65}}, "speculative.n_max"},
                                                         {{{"speculative.n_max", 2}, {"speculative.n_min", 3}}, "speculative.n_min"},
                                                         {{{"speculative.p_min", 0}}, "speculative.p_min"}};
  for (const auto& [fields, param] : bad) {
    json body = {{"prompt", prompt}, {"max_tokens", 4}};
    body.update(fields);
    httplib::Result r = server.Post("/v1/completions", body.dump());
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << fields.dump();
    EXPECT_EQ(Body(r)["error"]["param"], param) << r->body;
  }
}

// The server-wide suffix index (EngineOptions::spec_index_tokens) on a repeated-request workload:
// six prompts, then the same six again, concurrently each time. With the index, the second round's
// suffix drafts continue the first round's replies; every reply is still the request's alone, and
// the second round keeps more drafted tokens than without the index (printed: acceptance on this
// machine's run, not a speed claim).
TEST(Serve, TheSuffixIndexDraftsFromEarlierRequestsAndChangesNoOutput) {
  const std::vector<std::string> prompts = {"Once upon a time", "The cat sat", "Lily went to the park",
                                            "Tom had a red ball", "One day, a bird", "The sun was hot"};
  std::vector<std::string> alone;
  for (const std::string& p : prompts) alone.push_back(Alone(p, 48));
  int64_t kept_second[2] = {0, 0};
  for (const int64_t index : {int64_t{0}, int64_t{4096}}) {
    SCOPED_TRACE(index);
    TestServer server({.parallel = 3,
                       .speculation = {.source = DraftSource::kSuffix, .max_draft = 6, .ungated = true},
                       .spec_index_tokens = index});
    int64_t drafted[2] = {0, 0}, kept[2] = {0, 0};
    for (int round = 0; round < 2; ++round) {
      const int64_t drafted_before = server.metrics.spec_draft_tokens.load();
      const int64_t kept_before = server.metrics.spec_accepted_tokens.load();
      std::vector<StreamResult> results(prompts.size());
      std::vector<std::thread> threads;
      for (size_t i = 0; i < prompts.size(); ++i) {
        threads.emplace_back([&, i] { results[i] = server.Stream(prompts[i], 48); });
      }
      for (std::thread& t : threads) t.join();
      for (size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_EQ(results[i].error, "") << i;
        EXPECT_EQ(results[i].text, alone[i]) << prompts[i] << " (round " << round + 1 << ")";
      }
      drafted[round] = server.metrics.spec_draft_tokens.load() - drafted_before;
      kept[round] = server.metrics.spec_accepted_tokens.load() - kept_before;
    }
    std::printf("suffix drafts, server-wide index of %lld tokens: first round kept %lld of %lld drafted tokens, "
                "second round %lld of %lld; index drafts %lld, index holds %lld tokens\n",
                static_cast<long long>(index), static_cast<long long>(kept[0]), static_cast<long long>(drafted[0]),
                static_cast<long long>(kept[1]), static_cast<long long>(drafted[1]),
                static_cast<long long>(server.metrics.spec_index_drafts.load()),
                static_cast<long long>(server.metrics.spec_index_tokens.load()));
    kept_second[index > 0 ? 1 : 0] = kept[1];
    if (index == 0) {
      EXPECT_EQ(server.metrics.spec_index_drafts.load(), 0);
    } else {
      EXPECT_GT(server.metrics.spec_index_drafts.load(), 0);
      EXPECT_LE(server.metrics.spec_index_tokens.load(), index);
    }
  }
  EXPECT_GT(kept_second[1], kept_second[0]);
}

// One slot: each request lands there, and from the second on its gate starts with what the last
// one's learnt (the same source and settings); the output is the request's alone either way.
TEST(Serve, ASlotsNextRequestResumesItsGate) {
  TestServer server({.parallel = 1, .speculation = {.source = DraftSource::kNgram, .max_draft = 4}});
  const std::vector<std::string> prompts = {"Once upon a time", "The cat sat", "Once upon a time"};
  for (size_t i = 0; i < prompts.size(); ++i) {
    const StreamResult r = server.Stream(prompts[i], 32);
    EXPECT_EQ(r.error, "") << i;
    EXPECT_EQ(r.text, Alone(prompts[i], 32)) << i;
    EXPECT_EQ(server.metrics.spec_gates_resumed.load(), static_cast<int64_t>(i)) << "after request " << i + 1;
  }
}

// Exact bytes a session of `model` holding `positions` takes with every layer's K and V in
// `format`: the library's byte count (kvq/kv_memory.h) from the model's shape, not the engine's.
int64_t SessionBytesFor(const Model& model, const std::string& format, int64_t positions) {
  const Result<KvSpec> spec = ParseKvSpec(format);
  EXPECT_TRUE(spec.ok()) << format;
  const LayerFormats layer = LayerFormats::Of(*spec, *spec);
  const ModelInfo& info = model.info();
  const Result<int64_t> kv = KvBytesForContext(
      std::span<const LayerFormats>(&layer, 1),
      {.n_layers = info.n_attention_layers, .n_kv_heads = info.n_kv_heads, .head_dim = info.head_dim}, positions);
  EXPECT_TRUE(kv.ok()) << kv.status().message();
  return *kv + info.state_bytes;
}

int64_t Gauge(const std::string& metrics, const std::string& name) {
  const size_t at = metrics.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stoll(metrics.substr(at + name.size() + 2));
}

// A request drafting with the draft model holds a session of it besides its own: its reservation
// is the target's bytes for prompt + max_tokens positions plus the draft session's for as many
// (the draft model with a 2-bit cache here), read back from /metrics; the draft session it leaves
// behind holds no more than was reserved for it and is counted in the KV gauges. A budget one byte
// short of the two together refuses it with a 413 naming both parts (per session and in all),
// while the same request without the draft model fits and runs.
TEST(Serve, ADraftModelsSessionCountsAgainstTheKvBudgets) {
  const std::string prompt = "Once upon a time";
  const int32_t kTokens = 40;
  const SpeculationOptions spec = {.source = DraftSource::kModel, .max_draft = 4, .min_draft_probability = 1e-6,
                                   .ungated = true, .draft_model = &Bundled(),
                                   .draft_kv = {.key_format = "int2", .value_format = "int2"}};
  const json body = {{"prompt", prompt}, {"max_tokens", kTokens}, {"temperature", 0}, {"ignore_eos", true}};
  int64_t target = 0, draft = 0;
  {
    TestServer server({.parallel = 1, .speculation = spec});
    const json j = Body(server.Post("/v1/completions", body.dump()));
    ASSERT_EQ(j["usage"].value("completion_tokens", -1), kTokens) << j.dump();
    const int64_t positions = j["usage"].value("prompt_tokens", 0) + kTokens;
    target = SessionBytesFor(Bundled(), "f16", positions);
    draft = SessionBytesFor(Bundled(), "int2", positions);
    ASSERT_GT(draft, 0);
    EXPECT_GT(server.metrics.spec_draft_tokens.load(), 0);  // it did draft with the model
    httplib::Result m = server.Get("/metrics");
    ASSERT_TRUE(m);
    EXPECT_EQ(Gauge(m->body, "kvq_kv_bytes_reserved_peak"), target + draft) << m->body;
    // Idle now: the slot's sessions are what it counts, the draft's bytes within its reservation.
    const json slots = Body(server.Get("/slots"));
    const int64_t held_draft = slots[0].value("draft_kv_bytes", int64_t{-1});
    EXPECT_GT(held_draft, 0) << slots.dump();
    EXPECT_LE(held_draft, draft) << slots.dump();
    EXPECT_EQ(Gauge(m->body, "kvq_kv_bytes_draft"), held_draft);
    EXPECT_EQ(Gauge(m->body, "kvq_kv_bytes_reserved_draft"), held_draft);
    EXPECT_EQ(Gauge(m->body, "kvq_kv_bytes_reserved"), slots[0].value("kv_bytes", int64_t{0}) + held_draft);
    EXPECT_EQ(slots[0].value("kv_reserved_bytes", int64_t{-1}), Gauge(m->body, "kvq_kv_bytes_reserved"));
  }
  // A per-session budget that holds the target's smallest request but not with its draft: a server
  // drafting with the draft model by default is refused at start.
  {
    Metrics metrics;
    const Result<std::unique_ptr<Engine>> refused = Engine::Create(
        Bundled(), {.kv_budget_per_session_bytes = SessionBytesFor(Bundled(), "f16", 2), .speculation = spec}, &metrics);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("the draft model's session"), std::string::npos)
        << refused.status().message();
  }
  for (const bool per_session : {true, false}) {
    SCOPED_TRACE(per_session ? "--kv-budget-per-session" : "--kv-budget");
    EngineOptions o = {.parallel = 1, .speculation = spec};
    (per_session ? o.kv_budget_per_session_bytes : o.kv_budget_bytes) = target + draft - 1;
    TestServer server(o);
    httplib::Result r = server.Post("/v1/completions", body.dump());
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 413) << r->body;
    const json error = Body(r).value("error", json::object());
    EXPECT_EQ(error.value("code", ""), "kv_budget_exceeded") << r->body;
    const std::string message = error.value("message", "");
    for (const std::string& part : {fmt::format("need {} B of KV cache", target),
                                    fmt::format("the draft model's session (spec \"draft\") {} B more", draft),
                                    fmt::format("{} B in all", target + draft),
                                    std::string(per_session ? "--kv-budget-per-session" : "--kv-budget)")}) {
      EXPECT_NE(message.find(part), std::string::npos) << part << " in: " << message;
    }
    EXPECT_EQ(server.metrics.spec_draft_tokens.load(), 0);
    // Without the draft model it fits: prompt lookup, or no speculation.
    for (const json& ask : {json{{"spec", "ngram"}}, json{{"speculative.n_max", 0}}}) {
      json plain = body;
      plain.update(ask);
      httplib::Result ok = server.Post("/v1/completions", plain.dump());
      ASSERT_TRUE(ok);
      EXPECT_EQ(ok->status, 200) << ask.dump() << ": " << ok->body;
    }
  }
}

// A request run through the engine to its end: its text and its final usage.
struct Ran {
  std::string text;
  Usage usage;
};
Ran RunToEnd(const std::shared_ptr<Job>& job) {
  Ran out;
  Job::News news;
  do {
    news = job->Wait(std::chrono::seconds(60));
    out.text += news.text;
  } while (!news.finished);
  EXPECT_FALSE(news.error.has_value()) << news.error->message;
  out.usage = news.usage;
  return out;
}

// The engine drafts every slot's draft-model draft in the same passes of the draft model
// (DraftByModels: one RunBatch per round of drafted tokens), and each draft is the one it makes
// alone: four requests at once give each the text, drafted tokens and kept tokens it gets alone
// (ungated: the draft lengths do not depend on timing), in fewer passes of the draft model than
// the four alone took together.
TEST(Serve, DraftModelPassesAreBatchedAcrossSlotsAndEachDraftIsItsAlone) {
  const std::vector<std::string> prompts = {"Once upon a time", "The cat sat", "Lily went to the park",
                                            "Tom had a red ball"};
  const SpeculationOptions spec = {.source = DraftSource::kModel, .max_draft = 4, .min_draft_probability = 1e-6,
                                   .ungated = true, .draft_model = &Bundled(),
                                   .draft_kv = {.key_format = "int2", .value_format = "int2"}};
  auto job_spec = [&](const std::string& prompt) {
    return JobSpec{.prompt = Bundled().Tokenize(prompt), .max_tokens = 40, .sampling = {.temperature = 0},
                   .ignore_eos = true, .speculation = spec};
  };
  std::vector<Ran> alone;
  int64_t alone_passes = 0;
  for (const std::string& p : prompts) {
    Metrics metrics;
    Result<std::unique_ptr<Engine>> e = Engine::Create(Bundled(), {.parallel = 1, .speculation = spec}, &metrics);
    ASSERT_TRUE(e.ok()) << e.status().message();
    auto job = (*e)->Submit(job_spec(p));
    ASSERT_TRUE(std::holds_alternative<std::shared_ptr<Job>>(job));
    alone.push_back(RunToEnd(std::get<std::shared_ptr<Job>>(job)));
    alone_passes += metrics.spec_draft_model_passes.load();
  }
  Metrics metrics;
  Result<std::unique_ptr<Engine>> e = Engine::Create(Bundled(), {.parallel = 4, .speculation = spec}, &metrics);
  ASSERT_TRUE(e.ok()) << e.status().message();
  std::vector<std::shared_ptr<Job>> jobs;
  for (const std::string& p : prompts) {
    auto job = (*e)->Submit(job_spec(p));
    ASSERT_TRUE(std::holds_alternative<std::shared_ptr<Job>>(job));
    jobs.push_back(std::get<std::shared_ptr<Job>>(job));
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Ran together = RunToEnd(jobs[i]);
    EXPECT_EQ(together.text, alone[i].text) << prompts[i];
    EXPECT_EQ(together.usage.completion_tokens, 40) << prompts[i];
    EXPECT_GT(alone[i].usage.drafted_tokens, alone[i].usage.accepted_tokens) << prompts[i];  // kept and rejected
    EXPECT_GT(alone[i].usage.accepted_tokens, 0) << prompts[i];
    EXPECT_EQ(together.usage.drafted_tokens, alone[i].usage.drafted_tokens) << prompts[i];
    EXPECT_EQ(together.usage.accepted_tokens, alone[i].usage.accepted_tokens) << prompts[i];
  }
  std::printf("draft-model passes: %lld for four requests at once, %lld for the four alone\n",
              static_cast<long long>(metrics.spec_draft_model_passes.load()), static_cast<long long>(alone_passes));
  EXPECT_LT(metrics.spec_draft_model_passes.load(), alone_passes);
}

}  // namespace
}  // namespace kvq::server
