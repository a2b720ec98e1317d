// A hybrid's recurrent state cannot drop positions, so Session::Truncate used to recompute a hybrid
// session from its first position. With a checkpoint (Session::SaveCheckpoint) at or below the
// cut it restores the checkpoint's state and recomputes only what follows it; a draft model's
// session takes one before each draft (DraftByModels), so dropping a rejected draft costs the
// draft's tokens, not the whole sequence again. Checked for every hybrid architecture's tiny synth:
// the positions run (Session::positions_run) are the checkpoint's few, and the cache, state and
// logits are bit for bit those of a session that ran only the kept ids; without a checkpoint, or
// cut below it, every kept position runs again (the checkpoint is dropped).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gguf/architectures.h"
#include "kvq/model.h"
#include "kvq/session.h"
#include "kvq/speculation.h"
#include "synth/synth.h"
#include "test_util/synth_model.h"

namespace kvq {
namespace {

// The tiny synth preset of each hybrid architecture; none is a failure.
std::vector<std::unique_ptr<Model>> TinyHybrids() {
  std::vector<std::unique_ptr<Model>> models;
  for (const Architecture& arch : Architectures()) {
    if (!arch.hybrid()) continue;
    bool found = false;
    for (const std::string& name : SynthPresetNames()) {
      Result<SynthSpec> spec = SynthPreset(name);
      if (!name.starts_with("tiny-") || !spec.ok() || spec->arch != arch.id) continue;
      models.push_back(test::LoadSynth(*spec, std::string("ckpt_") + arch.name));
      found = true;
      break;
    }
    EXPECT_TRUE(found) << "no tiny- synth preset of the hybrid architecture " << arch.name;
  }
  return models;
}

// A session that ran only `ids` then `next`: its state and logits are what a cut session must hold.
void ExpectSameAsFresh(const Model& m, Session& cut, std::span<const int32_t> ids, int32_t next,
                       const std::string& what) {
  std::unique_ptr<Session> fresh = test::NewSessionOrFail(m);
  ASSERT_NE(fresh, nullptr);
  ASSERT_TRUE(fresh->Prefill(ids).ok());
  const std::vector<float> want_state(fresh->recurrent_state().begin(), fresh->recurrent_state().end());
  const std::vector<float> got_state(cut.recurrent_state().begin(), cut.recurrent_state().end());
  EXPECT_TRUE(got_state == want_state) << what << ": the recurrent state differs";
  ASSERT_TRUE(fresh->Decode(next).ok());
  ASSERT_TRUE(cut.Decode(next).ok());
  const std::vector<float> want(fresh->logits().begin(), fresh->logits().end());
  const std::vector<float> got(cut.logits().begin(), cut.logits().end());
  EXPECT_TRUE(got == want) << what << ": the logits after the cut differ";
}

TEST(HybridCheckpoint, TruncateRestoresTheCheckpointAndRunsOnlyWhatFollowsIt) {
  int64_t models = 0;
  for (const std::unique_ptr<Model>& m : TinyHybrids()) {
    ASSERT_NE(m, nullptr);
    SCOPED_TRACE(m->info().architecture);
    ++models;
    const std::vector<int32_t> ids = test::RandomIds(160, m->info().vocab_size, 7);
    std::unique_ptr<Session> s = test::NewSessionOrFail(*m);
    ASSERT_NE(s, nullptr);
    ASSERT_FALSE(s->recurrent_state().empty());
    EXPECT_EQ(s->checkpoint_positions(), -1);
    ASSERT_TRUE(s->Prefill(std::span(ids).first(150)).ok());
    s->SaveCheckpoint();
    EXPECT_EQ(s->checkpoint_positions(), 150);
    ASSERT_TRUE(s->Prefill(std::span(ids).subspan(150, 6)).ok());
    // Cut at 153: the state at 150 restored, 3 positions run (153 without the checkpoint).
    int64_t before = s->positions_run();
    ASSERT_TRUE(s->Truncate(153).ok());
    EXPECT_EQ(s->positions_run() - before, 3);
    EXPECT_EQ(s->positions(), 153);
    EXPECT_EQ(s->checkpoint_positions(), 150);
    ExpectSameAsFresh(*m, *s, std::span(ids).first(153), ids[153], "cut to 153 from the checkpoint at 150");
    // Exactly at the checkpoint: nothing runs.
    before = s->positions_run();
    ASSERT_TRUE(s->Truncate(150).ok());
    EXPECT_EQ(s->positions_run() - before, 0);
    ExpectSameAsFresh(*m, *s, std::span(ids).first(150), ids[150], "cut to the checkpoint");
    // Below it: the checkpoint is dropped and every kept position runs again.
    before = s->positions_run();
    ASSERT_TRUE(s->Truncate(100).ok());
    EXPECT_EQ(s->positions_run() - before, 100);
    EXPECT_EQ(s->checkpoint_positions(), -1);
    ExpectSameAsFresh(*m, *s, std::span(ids).first(100), ids[100], "cut below the checkpoint");
    // Clear drops it too.
    s->SaveCheckpoint();
    EXPECT_EQ(s->checkpoint_positions(), 101);
    ASSERT_TRUE(s->Clear().ok());
    EXPECT_EQ(s->checkpoint_positions(), -1);
  }
  EXPECT_GE(models, 1);
}

// A draft model's session: the second draft continues the first's first token and then departs
// from it (a rejection at the second drafted token). The draft session drops back to its checkpoint
// before the first draft and runs only the kept and new tokens and the second draft's own.
TEST(HybridCheckpoint, AHybridDraftDropsARejectedDraftWithoutRunningItsSequenceAgain) {
  constexpr int32_t kDraft = 4;
  for (const std::unique_ptr<Model>& m : TinyHybrids()) {
    ASSERT_NE(m, nullptr);
    SCOPED_TRACE(m->info().architecture);
    const int32_t vocab = m->info().vocab_size;
    std::vector<int32_t> sequence = test::RandomIds(150, vocab, 9);
    std::unique_ptr<Session> draft = test::NewSessionOrFail(*m);
    ASSERT_NE(draft, nullptr);
    Result<std::vector<int32_t>> first = DraftByModel(*draft, sequence, kDraft, 0.0);
    ASSERT_TRUE(first.ok()) << first.status().message();
    ASSERT_EQ(first->size(), static_cast<size_t>(kDraft));
    EXPECT_EQ(draft->checkpoint_positions(), 150);
    // The target kept the first drafted token and drew another than the second.
    sequence.push_back((*first)[0]);
    sequence.push_back(((*first)[1] + 1) % vocab);
    const int64_t before = draft->positions_run();
    Result<std::vector<int32_t>> second = DraftByModel(*draft, sequence, kDraft, 0.0);
    ASSERT_TRUE(second.ok()) << second.status().message();
    // The 2 new positions of the sequence, then kDraft - 1 drafted ones (the last is not run).
    EXPECT_EQ(draft->positions_run() - before, 2 + kDraft - 1);
    // The same draft as a fresh session's for the same sequence, bit for bit its greedy choices.
    std::unique_ptr<Session> fresh = test::NewSessionOrFail(*m);
    ASSERT_NE(fresh, nullptr);
    Result<std::vector<int32_t>> want = DraftByModel(*fresh, sequence, kDraft, 0.0);
    ASSERT_TRUE(want.ok()) << want.status().message();
    EXPECT_EQ(*second, *want);
    const std::vector<float> got_state(draft->recurrent_state().begin(), draft->recurrent_state().end());
    const std::vector<float> want_state(fresh->recurrent_state().begin(), fresh->recurrent_state().end());
    EXPECT_TRUE(got_state == want_state) << "the draft sessions' recurrent states differ";
  }
}

}  // namespace
}  // namespace kvq
