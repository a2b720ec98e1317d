// GenerateRequest::on_prompt_progress: Generate reports the prompt block by block as it runs —
// held counts after each block of kPrefillBlock tokens, reused tokens counted as held, the last call
// saying the whole prompt — and nothing while it generates.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "kvq/model.h"
#include "kvq/session.h"
#include "test_util/synth_model.h"

namespace kvq {
namespace {

using test::LoadTinySynth;
using test::NewSessionOrFail;
using test::RandomIds;
using Calls = std::vector<std::pair<int64_t, int64_t>>;

// What Generate runs for a prompt of `n` tokens when `held` are reused: Prefill of the rest but
// the last (one call per block of 64), then the last token's Decode.
Calls Expected(int64_t held, int64_t n) {
  Calls calls;
  for (int64_t at = held + kPrefillBlock; at < n - 1; at += kPrefillBlock) calls.push_back({at, n});
  if (held < n - 1) calls.push_back({n - 1, n});
  calls.push_back({n, n});
  return calls;
}

TEST(PromptProgress, ReportedPerBlockFromTheReusedPartToTheWholePrompt) {
  std::unique_ptr<Model> m = LoadTinySynth("prompt_progress");
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> ids = RandomIds(300, m->info().vocab_size, 11);
  const int64_t n = static_cast<int64_t>(ids.size());
  std::unique_ptr<Session> s = NewSessionOrFail(*m);
  Calls calls;
  const GenerateRequest request{.max_tokens = 8,
                                .sampling = {.temperature = 0},
                                .ignore_eos = true,
                                .on_prompt_progress = [&](int64_t held, int64_t total) {
                                  calls.push_back({held, total});
                                }};
  Result<Completion> c = s->Generate(ids, request);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->tokens.size(), 8u);
  EXPECT_EQ(calls, Expected(0, n));  // none for the 8 generated tokens

  // 100 tokens kept: the first report is a block after them.
  ASSERT_TRUE(s->Truncate(100).ok());
  calls.clear();
  c = s->Generate(ids, request);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->n_reused, 100);
  EXPECT_EQ(calls, Expected(100, n));

  // All but the last reused: one report, the whole prompt.
  ASSERT_TRUE(s->Truncate(n - 1).ok());
  calls.clear();
  ASSERT_TRUE(s->Generate(ids, request).ok());
  EXPECT_EQ(calls, (Calls{{n, n}}));
}

}  // namespace
}  // namespace kvq
