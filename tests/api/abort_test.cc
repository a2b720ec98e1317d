// Session::SetAbortCallback: Prefill and RunBatch stop at a block boundary when the callback fires,
// the session keeps exactly the blocks that ran, and running the rest later gives the bits of an
// uninterrupted run; Generate finishes as cancelled.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "kvq/model.h"
#include "kvq/session.h"
#include "test_util/synth_model.h"

namespace kvq {
namespace {

using test::LoadTinySynth;
using test::NewSessionOrFail;
using test::RandomIds;

std::vector<float> Copy(std::span<const float> v) { return {v.begin(), v.end()}; }

// A callback that fires on its `fire_at`-th call (1-based), counting every call.
struct CountingAbort {
  int fire_at;
  int calls = 0;
  std::function<bool()> Callback() {
    return [this] { return ++calls >= fire_at; };
  }
};

TEST(SessionAbort, PrefillStopsAfterOneBlockAndResumesBitExact) {
  std::unique_ptr<Model> m = LoadTinySynth("abort");
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> ids = RandomIds(2000, m->info().vocab_size, 7);

  std::unique_ptr<Session> whole = NewSessionOrFail(*m);
  ASSERT_TRUE(whole->Prefill(ids).ok());

  std::unique_ptr<Session> cut = NewSessionOrFail(*m);
  CountingAbort abort{.fire_at = 1};
  cut->SetAbortCallback(abort.Callback());
  const Status st = cut->Prefill(ids);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("aborted"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("holds 64 positions"), std::string::npos) << st.message();
  EXPECT_EQ(abort.calls, 1);
  EXPECT_EQ(cut->positions(), kPrefillBlock);
  EXPECT_TRUE(std::equal(cut->tokens().begin(), cut->tokens().end(), ids.begin()));
  EXPECT_TRUE(cut->logits().empty());  // the block with the logits never ran

  // The rest, without the callback: the same bits as the uninterrupted run.
  cut->SetAbortCallback({});
  ASSERT_TRUE(cut->Prefill(std::span<const int32_t>(ids).subspan(kPrefillBlock)).ok());
  EXPECT_EQ(cut->positions(), whole->positions());
  EXPECT_EQ(Copy(cut->logits()), Copy(whole->logits()));
  EXPECT_EQ(cut->kv_bytes(), whole->kv_bytes());
  ASSERT_TRUE(cut->Decode(5).ok());
  ASSERT_TRUE(whole->Decode(5).ok());
  EXPECT_EQ(Copy(cut->logits()), Copy(whole->logits()));
}

TEST(SessionAbort, FiresAtTheThirdCheckAfterThreeBlocks) {
  std::unique_ptr<Model> m = LoadTinySynth("abort3");
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> ids = RandomIds(300, m->info().vocab_size, 8);
  std::unique_ptr<Session> s = NewSessionOrFail(*m);
  CountingAbort abort{.fire_at = 3};
  s->SetAbortCallback(abort.Callback());
  EXPECT_FALSE(s->Prefill(ids).ok());
  EXPECT_EQ(abort.calls, 3);
  EXPECT_EQ(s->positions(), 3 * kPrefillBlock);
  // A prefill of one block asks nothing: there is no boundary inside it.
  std::unique_ptr<Session> t = NewSessionOrFail(*m);
  CountingAbort never{.fire_at = 1};
  t->SetAbortCallback(never.Callback());
  EXPECT_TRUE(t->Prefill(std::span<const int32_t>(ids).first(kPrefillBlock)).ok());
  EXPECT_EQ(never.calls, 0);
}

TEST(SessionAbort, RunBatchStopsEverySessionAndNamesTheItem) {
  std::unique_ptr<Model> m = LoadTinySynth("abort_batch");
  ASSERT_NE(m, nullptr);
  const int32_t vocab = m->info().vocab_size;
  const std::vector<int32_t> a = RandomIds(200, vocab, 1), b = RandomIds(30, vocab, 2),
                             c = RandomIds(150, vocab, 3);
  std::unique_ptr<Session> sa = NewSessionOrFail(*m), sb = NewSessionOrFail(*m),
                           sc = NewSessionOrFail(*m);
  CountingAbort abort{.fire_at = 2};  // c's second check: before the third block
  sc->SetAbortCallback(abort.Callback());
  const BatchItem items[] = {{sa.get(), a}, {sb.get(), b}, {sc.get(), c}};
  const Status st = Session::RunBatch(items);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("item 2's abort callback"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("128, 30, 128"), std::string::npos) << st.message();
  EXPECT_EQ(sa->positions(), 128);
  EXPECT_EQ(sb->positions(), 30);  // finished in the first pass: its logits stand
  EXPECT_EQ(sb->logits().size(), static_cast<size_t>(vocab));
  EXPECT_TRUE(sa->logits().empty());
  // Resuming a alone gives a's uninterrupted bits.
  ASSERT_TRUE(sa->Prefill(std::span<const int32_t>(a).subspan(128)).ok());
  std::unique_ptr<Session> alone = NewSessionOrFail(*m);
  ASSERT_TRUE(alone->Prefill(a).ok());
  EXPECT_EQ(Copy(sa->logits()), Copy(alone->logits()));
}

TEST(SessionAbort, GenerateFinishesCancelled) {
  std::unique_ptr<Model> m = LoadTinySynth("abort_gen");
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> prompt = RandomIds(10, m->info().vocab_size, 4);
  const GenerateRequest greedy{
      .max_tokens = 20, .sampling = {.temperature = 0}, .ignore_eos = true};

  // Between decode steps: the first check comes before the first token is sampled.
  std::unique_ptr<Session> s = NewSessionOrFail(*m);
  CountingAbort abort{.fire_at = 4};
  s->SetAbortCallback(abort.Callback());
  Result<Completion> c = s->Generate(prompt, greedy);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->finish, FinishReason::kCancelled);
  EXPECT_EQ(c->tokens.size(), 3u);
  EXPECT_EQ(s->positions(), 13);  // every generated token ran
  std::unique_ptr<Session> free_run = NewSessionOrFail(*m);
  Result<Completion> full = free_run->Generate(prompt, greedy);
  ASSERT_TRUE(full.ok());
  EXPECT_TRUE(std::equal(c->tokens.begin(), c->tokens.end(), full->tokens.begin()));

  // During the prompt: no tokens, the prompt's first block kept, and a retry reuses it.
  const std::vector<int32_t> long_prompt = RandomIds(300, m->info().vocab_size, 5);
  std::unique_ptr<Session> p = NewSessionOrFail(*m);
  CountingAbort early{.fire_at = 1};
  p->SetAbortCallback(early.Callback());
  Result<Completion> cut = p->Generate(long_prompt, greedy);
  ASSERT_TRUE(cut.ok()) << cut.status().message();
  EXPECT_EQ(cut->finish, FinishReason::kCancelled);
  EXPECT_TRUE(cut->tokens.empty());
  EXPECT_EQ(p->positions(), kPrefillBlock);
  p->SetAbortCallback({});
  Result<Completion> retry = p->Generate(long_prompt, greedy);
  ASSERT_TRUE(retry.ok());
  EXPECT_EQ(retry->n_reused, kPrefillBlock);
  std::unique_ptr<Session> q = NewSessionOrFail(*m);
  Result<Completion> fresh = q->Generate(long_prompt, greedy);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(retry->tokens, fresh->tokens);
}

TEST(SessionAbort, TruncateIsNotAborted) {
  std::unique_ptr<Model> m = LoadTinySynth("abort_trunc");
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> ids = RandomIds(300, m->info().vocab_size, 6);
  // A sink spec recomputes every kept position on Truncate: several blocks.
  Result<std::unique_ptr<Session>> made =
      m->NewSession({.key_format = "f16+sink4", .value_format = "f16"});
  ASSERT_TRUE(made.ok()) << made.status().message();
  Session& s = **made;
  ASSERT_TRUE(s.Prefill(ids).ok());
  s.SetAbortCallback([] { return true; });
  ASSERT_TRUE(s.Truncate(250).ok());
  EXPECT_EQ(s.positions(), 250);
}

}  // namespace
}  // namespace kvq
