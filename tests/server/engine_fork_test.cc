// kvq serve's engine reuses a prefix from a busy session by forking it (Engine::ForkLongerPrefix,
// Session::Fork): a request that shares a long prompt prefix with a request still running gets
// that prefix without recomputing it, counted as reused prompt tokens, and both replies are, bit
// for bit, what each prompt gives alone (greedy) — the fork changes neither the borrower nor the
// session it borrowed from.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "kvq/model.h"
#include "kvq/session.h"
#include "server/engine.h"
#include "test_util/bundled_model.h"
#include "test_util/synth_model.h"

namespace kvq::server {
namespace {


const Model& Bundled() { return test::BundledModel(); }

// What a fresh session generates for `prompt`, greedy.
std::string Alone(const std::vector<int32_t>& prompt, int32_t max_tokens, bool ignore_eos) {
  Result<std::unique_ptr<Session>> s = Bundled().NewSession();
  EXPECT_TRUE(s.ok());
  Result<Completion> c = (*s)->Generate(
      prompt, {.max_tokens = max_tokens, .sampling = {.temperature = 0}, .ignore_eos = ignore_eos});
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? c->text : "<error>";
}

struct Reply {
  std::string text;
  Job::News last;
};

// Reads a job to its end (each Wait bounded; 600 waits of 100 ms at most).
Reply ReadAll(Job& job, std::string text = "") {
  for (int i = 0; i < 600; ++i) {
    Job::News n = job.Wait(std::chrono::milliseconds(100));
    text += n.text;
    if (n.finished) return {text, n};
  }
  ADD_FAILURE() << "the job did not finish";
  return {text, {}};
}

TEST(EngineFork, ARequestSharingARunningRequestsPrefixForksItsSession) {
  const Model& model = Bundled();
  std::string prefix =
      "Once upon a time, there was a little girl named Lily. She liked to play in the park. ";
  prefix += prefix;
  prefix += prefix;  // about 80 tokens
  const std::vector<int32_t> running = model.Tokenize(prefix + "One day she saw a dog.");
  const std::vector<int32_t> joining = model.Tokenize(prefix + "One day she found a ball.");
  size_t shared = 0;
  while (shared < running.size() && running[shared] == joining[shared]) ++shared;
  ASSERT_GT(shared, 70u);
  // The running request generates to near the end of the context, so it is still running when the
  // second one arrives (it is admitted at the scheduler's next step).
  const int32_t long_reply = static_cast<int32_t>(model.info().context - running.size() - 1);
  ASSERT_GT(long_reply, 300);

  Metrics metrics;
  Result<std::unique_ptr<Engine>> engine = Engine::Create(model, {.parallel = 2}, &metrics);
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  auto a = (*engine)->Submit({.prompt = running,
                              .max_tokens = long_reply,
                              .sampling = {.temperature = 0},
                              .ignore_eos = true});
  ASSERT_TRUE(std::holds_alternative<std::shared_ptr<Job>>(a));
  Job& first = *std::get<std::shared_ptr<Job>>(a);
  // Its first text: its prompt is in its session's cache now.
  Job::News started;
  for (int i = 0; i < 600 && started.text.empty() && !started.finished; ++i) {
    started = first.Wait(std::chrono::milliseconds(100));
  }
  ASSERT_FALSE(started.text.empty());
  ASSERT_FALSE(started.finished)
      << "the first request ended before the second could share its prefix";

  auto b = (*engine)->Submit({.prompt = joining, .max_tokens = 32, .sampling = {.temperature = 0}});
  ASSERT_TRUE(std::holds_alternative<std::shared_ptr<Job>>(b));
  const Reply second = ReadAll(*std::get<std::shared_ptr<Job>>(b));
  const Reply first_reply = ReadAll(first, started.text);

  EXPECT_EQ(second.text, Alone(joining, 32, false));
  EXPECT_EQ(second.last.usage.cached_tokens, static_cast<int64_t>(shared))
      << "the shared prefix, forked";
  EXPECT_EQ(first_reply.text, Alone(running, long_reply, true))
      << "the session forked from is unchanged";
  EXPECT_EQ(first_reply.last.usage.cached_tokens, 0);
  EXPECT_EQ(metrics.prefix_hits_live.load(), 1);
  EXPECT_EQ(metrics.prompt_tokens_reused.load(), static_cast<int64_t>(shared));
}

}  // namespace
}  // namespace kvq::server

namespace kvq::server {
namespace {

// Eight requests arriving together with one long system prompt: the first prefills it, the other
// seven wait for it and fork its session (not compute it eight times), so the engine's peak
// reservation is about one prefix plus eight suffixes — and each reply is what its prompt gives
// alone, bit for bit.
TEST(EngineFork, SimultaneousRequestsSharingASystemPromptHoldItOnce) {
  std::unique_ptr<Model> model = test::LoadTinySynth("engine_fork_simultaneous_" + std::to_string(getpid()), 1);
  ASSERT_NE(model, nullptr);
  std::vector<int32_t> system;  // [2000] a long system prompt: a cycle of the vocabulary's ordinary tokens
  for (int i = 0; i < 2000; ++i) system.push_back(3 + (i * 37) % 500);
  constexpr int kRequests = 8;
  constexpr int32_t kMaxTokens = 8;
  std::vector<std::vector<int32_t>> prompts;  // [8][2000 + 4] each with its own question
  for (int r = 0; r < kRequests; ++r) {
    prompts.push_back(system);
    for (int i = 0; i < 4; ++i) prompts.back().push_back(3 + (r * 11 + i * 5) % 500);
  }
  Metrics metrics;
  Result<std::unique_ptr<Engine>> engine = Engine::Create(*model, {.parallel = kRequests}, &metrics);
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  std::vector<std::shared_ptr<Job>> jobs;
  for (const std::vector<int32_t>& p : prompts) {
    auto j = (*engine)->Submit({.prompt = p, .max_tokens = kMaxTokens, .sampling = {.temperature = 0}});
    ASSERT_TRUE(std::holds_alternative<std::shared_ptr<Job>>(j));
    jobs.push_back(std::get<std::shared_ptr<Job>>(j));
  }
  int forked = 0;
  for (int r = 0; r < kRequests; ++r) {
    const Reply reply = ReadAll(*jobs[r]);
    std::unique_ptr<Session> alone = test::NewSessionOrFail(*model);
    ASSERT_NE(alone, nullptr);
    Result<Completion> c = alone->Generate(prompts[r], {.max_tokens = kMaxTokens, .sampling = {.temperature = 0}});
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ(reply.text, c->text) << "request " << r;
    if (reply.last.usage.cached_tokens == static_cast<int64_t>(system.size())) ++forked;
  }
  EXPECT_EQ(forked, kRequests - 1) << "all but the first forked the system prompt";
  // Reservations: one prefix (the first request's) and each request's own tokens past it.
  // Exact bytes of a cache holding n positions, from a session that ran them.
  const auto kv_bytes = [&](size_t n) {
    std::unique_ptr<Session> s = test::NewSessionOrFail(*model);
    std::vector<int32_t> ids = prompts[0];  // [n] the first prompt, extended
    ids.resize(n, 3);
    EXPECT_TRUE(s != nullptr && s->Prefill(ids).ok());
    return s == nullptr ? int64_t{0} : s->kv_bytes();
  };
  const int64_t prefix = kv_bytes(system.size());
  const int64_t whole = kv_bytes(prompts[0].size() + kMaxTokens);
  const int64_t suffix = whole - prefix;
  EXPECT_LE(metrics.kv_bytes_reserved_peak.load(), static_cast<int64_t>(1.25 * prefix) + kRequests * suffix)
      << "prefix " << prefix << " B, suffix " << suffix << " B";
}

}  // namespace
}  // namespace kvq::server
