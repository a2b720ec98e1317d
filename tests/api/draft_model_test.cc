// Speculation with a draft model (DraftSource::kModel, kvq/speculation.h) changes no output: a
// smaller model sharing the target's vocabulary (the same synthetic weights' seed, fewer layers),
// and the target itself with a 4-bit draft cache, draft, and greedy generation gives the tokens, text, finish reason and cache of generation
// without, for every registered KV format of the target and for a hybrid target, over three
// prompts. Drafts are counted kept and rejected, so the test fails if either never happens. A
// draft that is the target itself keeps every drafted token; a draft of another vocabulary is
// refused, naming both files and the first id that differs. A fork carries the draft's session.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "kvq/format.h"
#include "kvq/model.h"
#include "kvq/session.h"
#include "kvq/speculation.h"
#include "synth/synth.h"
#include "test_util/synth_model.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

// The target and its draft: the same seed draws the same embeddings and classifier, so the
// one-layer draft often, not always, agrees with the four-layer target.
SynthSpec TinyLlama(int64_t n_layers, int64_t vocab_size = 0) {
  return {.arch = SynthArch::kLlama, .dim = 64, .n_layers = n_layers, .n_heads = 4, .n_kv_heads = 2,
          .hidden_dim = 128, .vocab_size = vocab_size, .context = 1024, .type = "f32", .seed = 3};
}

// Three prompts: a story told twice (text that repeats), plain text, random ids.
std::vector<std::vector<int32_t>> Prompts(const Model& m) {
  const std::string story = "Once upon a time, there was a little girl named Lily. She loved to play outside. ";
  return {m.Tokenize(story + story + "Once upon"), m.Tokenize("The sun was warm and the sky was blue"),
          test::RandomIds(40, m.info().vocab_size, 11)};
}

using Outcome = test::GenerateOutcome;

Outcome Generate(const Model& m, const KvOptions& kv, std::span<const int32_t> prompt,
                 const GenerateRequest& request) {
  return test::GenerateAndSnapshot(m, kv, prompt, request, "kvq_draft");
}

void ExpectSame(const Outcome& spec, const Outcome& plain, const std::string& what) {
  EXPECT_EQ(spec.completion.tokens, plain.completion.tokens) << what;
  EXPECT_EQ(spec.completion.text, plain.completion.text) << what;
  EXPECT_EQ(spec.completion.finish, plain.completion.finish) << what;
  EXPECT_TRUE(spec.cache == plain.cache) << what << ": the caches differ";
}

// Drafts of 4 tokens, ungated, with any probability: many drafts, many of them rejected.
SpeculationOptions DraftWith(const Model& draft) {
  return {.source = DraftSource::kModel, .max_draft = 4, .min_draft_probability = 1e-6, .ungated = true,
          .draft_model = &draft};
}

TEST(DraftModel, GreedyOutputIsTheTargetsForEveryFormatAndPrompt) {
  std::unique_ptr<Model> target = test::LoadSynth(TinyLlama(4), "draft_target");
  std::unique_ptr<Model> draft = test::LoadSynth(TinyLlama(1), "draft_small");
  ASSERT_NE(target, nullptr);
  ASSERT_NE(draft, nullptr);
  int64_t kept = 0, dropped = 0;
  for (const FormatDesc* f : Formats()) {
    SCOPED_TRACE(f->name);
    const KvOptions kv{.key_format = f->name, .value_format = f->name, .page_positions = 64};
    for (const std::vector<int32_t>& prompt : Prompts(*target)) {
      GenerateRequest request{.max_tokens = 64, .sampling = {.temperature = 0}};
      const Outcome plain = Generate(*target, kv, prompt, request);
      // The small draft (mostly rejected), and the target itself with an int4 draft cache (mostly
      // kept: only where int4's rounding changes its choice does it differ).
      for (const bool self : {false, true}) {
        request.speculation = DraftWith(self ? *target : *draft);
        if (self) request.speculation.draft_kv = {.key_format = "int4", .value_format = "int4"};
        const Outcome spec = Generate(*target, kv, prompt, request);
        ExpectSame(spec, plain, std::string(self ? "self-draft" : "small draft") + ", prompt of " +
                                    std::to_string(prompt.size()) + " tokens");
        const SpeculationStats& st = spec.completion.speculation;
        EXPECT_LE(st.accepted, st.drafted);
        kept += st.accepted;
        dropped += st.drafted - st.accepted;
      }
    }
  }
  EXPECT_GT(kept, 100);
  EXPECT_GT(dropped, 100);
  std::printf("Draft model: %lld drafted tokens kept, %lld dropped\n", static_cast<long long>(kept),
              static_cast<long long>(dropped));
}

// A hybrid target (recurrent state restored on a rejection) with a plain Llama draft of its
// vocabulary, sampled as well as greedy.
TEST(DraftModel, AHybridTargetGivesItsOwnOutput) {
  Result<SynthSpec> hybrid = SynthPreset("tiny-qwen35");
  ASSERT_TRUE(hybrid.ok()) << hybrid.status().message();
  std::unique_ptr<Model> target = test::LoadSynth(*hybrid, "draft_hybrid");
  std::unique_ptr<Model> draft = test::LoadSynth(TinyLlama(1), "draft_for_hybrid");
  ASSERT_NE(target, nullptr);
  ASSERT_NE(draft, nullptr);
  int64_t drafted = 0;
  for (const std::vector<int32_t>& prompt : Prompts(*target)) {
    for (const float temperature : {0.0f, 0.8f}) {
      GenerateRequest request{.max_tokens = 48, .sampling = {.temperature = temperature, .seed = 5}};
      const Outcome plain = Generate(*target, {}, prompt, request);
      request.speculation = DraftWith(*draft);
      const Outcome spec = Generate(*target, {}, prompt, request);
      ExpectSame(spec, plain, "temperature " + std::to_string(temperature));
      drafted += spec.completion.speculation.drafted;
    }
  }
  EXPECT_GT(drafted, 100);
}

// The target as its own draft: every drafted token is the target's, so each pass runs the draft
// length + 1 tokens. N = P·(k + 1) + 1 new tokens (end tokens kept): P full passes, then the last
// token, which is drawn from the last pass's logits and never run.
TEST(DraftModel, TheTargetAsItsOwnDraftKeepsEveryToken) {
  std::unique_ptr<Model> target = test::LoadSynth(TinyLlama(2), "draft_self");
  ASSERT_NE(target, nullptr);
  constexpr int32_t kDraft = 5, kPasses = 12;
  for (const std::vector<int32_t>& prompt : Prompts(*target)) {
    GenerateRequest request{.max_tokens = kPasses * (kDraft + 1) + 1, .sampling = {.temperature = 0},
                            .ignore_eos = true};
    const Outcome plain = Generate(*target, {}, prompt, request);
    request.speculation = {.source = DraftSource::kModel, .max_draft = kDraft, .min_draft_probability = 1e-9,
                           .ungated = true, .draft_model = target.get()};
    const Outcome spec = Generate(*target, {}, prompt, request);
    ExpectSame(spec, plain, "self-draft");
    const SpeculationStats& st = spec.completion.speculation;
    EXPECT_EQ(st.passes, kPasses);
    EXPECT_EQ(st.drafted, kPasses * kDraft);
    EXPECT_EQ(st.accepted, st.drafted);
  }
}

// A chat: the session keeps its draft session between calls, and the next turn's prompt (the
// history, the reply, a new line) finds it holding the last turn's tokens and a rejected draft's;
// it is brought in step by dropping those and running only the new tokens. Each turn gives what a
// fresh session without speculation gives for the same prompt.
TEST(DraftModel, TheDraftSessionFollowsAConversation) {
  std::unique_ptr<Model> target = test::LoadSynth(TinyLlama(4), "draft_chat_target");
  std::unique_ptr<Model> draft = test::LoadSynth(TinyLlama(1), "draft_chat_small");
  ASSERT_NE(target, nullptr);
  ASSERT_NE(draft, nullptr);
  std::unique_ptr<Session> chat = test::NewSessionOrFail(*target);
  ASSERT_NE(chat, nullptr);
  std::vector<int32_t> history = Prompts(*target)[0];
  int64_t drafted = 0;
  for (int turn = 0; turn < 3; ++turn) {
    SCOPED_TRACE(turn);
    GenerateRequest request{.max_tokens = 24, .sampling = {.temperature = 0}};
    const Outcome plain = Generate(*target, {}, history, request);
    request.speculation = DraftWith(*draft);
    Result<Completion> c = chat->Generate(history, request);
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ(c->tokens, plain.completion.tokens);
    drafted += c->speculation.drafted;
    history.insert(history.end(), c->tokens.begin(), c->tokens.end());
    const std::vector<int32_t> more = target->Tokenize(" And then", AddBos::kNo);
    history.insert(history.end(), more.begin(), more.end());
  }
  EXPECT_GT(drafted, 20);
}

// A prompt prefilled once with its draft (Session::PrefillDraft) serves forks: each fork carries
// the draft session, so its Generate runs only the prompt's last token through the draft model
// (draft_prompt_tokens 1 against the whole prompt for a fresh session) and drafts what a fresh
// session drafts (ungated: the same drafts, kept and rejected alike), twice from one base, and the
// base after its forks wrote into the pages they shared. A session whose tokens were cut after
// PrefillDraft brings the draft back in step. Other sources and vocabularies are refused.
TEST(DraftModel, AForkCarriesTheDraftSessionThatReadThePromptOnce) {
  std::unique_ptr<Model> target = test::LoadSynth(TinyLlama(4), "draft_fork_target");
  std::unique_ptr<Model> draft = test::LoadSynth(TinyLlama(1), "draft_fork_small");
  ASSERT_NE(target, nullptr);
  ASSERT_NE(draft, nullptr);
  const std::vector<int32_t> prompt = Prompts(*target)[0];
  const int64_t n = static_cast<int64_t>(prompt.size());
  GenerateRequest request{.max_tokens = 40, .sampling = {.temperature = 0}};
  request.speculation = DraftWith(*draft);
  std::unique_ptr<Session> fresh = test::NewSessionOrFail(*target);
  ASSERT_NE(fresh, nullptr);
  Result<Completion> alone = fresh->Generate(prompt, request);
  ASSERT_TRUE(alone.ok()) << alone.status().message();
  EXPECT_EQ(alone->speculation.draft_prompt_tokens, n);
  ASSERT_GT(alone->speculation.drafted, alone->speculation.accepted);  // rejections happen
  ASSERT_GT(alone->speculation.accepted, 0);
  auto expect_as = [&](Session& s, std::span<const int32_t> p, const Completion& as, int64_t draft_prompt_tokens,
                       const std::string& what) {
    Result<Completion> c = s.Generate(p, request);
    ASSERT_TRUE(c.ok()) << what << ": " << c.status().message();
    EXPECT_EQ(c->tokens, as.tokens) << what;
    EXPECT_EQ(c->speculation.draft_prompt_tokens, draft_prompt_tokens) << what;
    EXPECT_EQ(c->speculation.passes, as.speculation.passes) << what;
    EXPECT_EQ(c->speculation.drafted, as.speculation.drafted) << what;
    EXPECT_EQ(c->speculation.accepted, as.speculation.accepted) << what;
  };
  std::unique_ptr<Session> base = test::NewSessionOrFail(*target);
  ASSERT_NE(base, nullptr);
  ASSERT_TRUE(base->Prefill(std::span<const int32_t>(prompt).first(n - 1)).ok());
  ASSERT_TRUE(base->PrefillDraft(request.speculation).ok());
  for (int i = 0; i < 2; ++i) {
    Result<std::unique_ptr<Session>> fork = base->Fork();
    ASSERT_TRUE(fork.ok()) << fork.status().message();
    expect_as(**fork, prompt, *alone, 1, "fork " + std::to_string(i));
  }
  expect_as(*base, prompt, *alone, 1, "the base after its forks");
  // Cut to 10 positions after PrefillDraft, then another prompt sharing those 10: the draft drops
  // the rest of what it read and runs only the new tokens.
  std::vector<int32_t> other_prompt(prompt.begin(), prompt.begin() + 10);
  const std::vector<int32_t> plain_text = Prompts(*target)[1];
  other_prompt.insert(other_prompt.end(), plain_text.begin() + 1, plain_text.end());
  std::unique_ptr<Session> fresh_other = test::NewSessionOrFail(*target);
  ASSERT_NE(fresh_other, nullptr);
  Result<Completion> alone_other = fresh_other->Generate(other_prompt, request);
  ASSERT_TRUE(alone_other.ok()) << alone_other.status().message();
  std::unique_ptr<Session> cut = test::NewSessionOrFail(*target);
  ASSERT_NE(cut, nullptr);
  ASSERT_TRUE(cut->Prefill(std::span<const int32_t>(prompt).first(n - 1)).ok());
  ASSERT_TRUE(cut->PrefillDraft(request.speculation).ok());
  ASSERT_TRUE(cut->Truncate(10).ok());
  expect_as(*cut, other_prompt, *alone_other, static_cast<int64_t>(other_prompt.size()) - 10,
            "a session cut to 10 positions, another prompt");

  Status st = base->PrefillDraft({.source = DraftSource::kNgram});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("DraftSource::kModel"), std::string::npos) << st.message();
  std::unique_ptr<Model> other = test::LoadSynth(TinyLlama(1, 520), "draft_fork_520");
  ASSERT_NE(other, nullptr);
  st = base->PrefillDraft({.source = DraftSource::kModel, .draft_model = other.get()});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("does not share the vocabulary"), std::string::npos) << st.message();
}

// A draft stops where the draft model is unsure: with min_draft_probability 1 no token is ever
// certain enough, so nothing is drafted (and the output is still the target's).
TEST(DraftModel, AnUnsureDraftModelDraftsNothing) {
  std::unique_ptr<Model> target = test::LoadSynth(TinyLlama(2), "draft_unsure");
  ASSERT_NE(target, nullptr);
  const std::vector<int32_t> prompt = Prompts(*target)[1];
  GenerateRequest request{.max_tokens = 20, .sampling = {.temperature = 0}};
  const Outcome plain = Generate(*target, {}, prompt, request);
  request.speculation = {.source = DraftSource::kModel, .max_draft = 4, .min_draft_probability = 1.0,
                         .ungated = true, .draft_model = target.get()};
  const Outcome spec = Generate(*target, {}, prompt, request);
  ExpectSame(spec, plain, "p-min 1");
  EXPECT_EQ(spec.completion.speculation.drafted, 0);
}

// DraftByModels says how many tokens each draft's catch-up ran (DraftCatchUpTokens before the call)
// and times the catch-up pass apart from the drafted tokens' (kvq serve records it as the gate's
// catch-up seconds, as Drafter::Next does); no catch-up: 0 tokens and 0 seconds.
TEST(DraftModel, DraftByModelsReportsEachCatchUp) {
  std::unique_ptr<Model> m = test::LoadSynth(TinyLlama(2), "draft_catch_up");
  ASSERT_NE(m, nullptr);
  std::unique_ptr<Session> a = test::NewSessionOrFail(*m, KvOptions{}), b = test::NewSessionOrFail(*m, KvOptions{});
  ASSERT_TRUE(a != nullptr && b != nullptr);
  const std::vector<int32_t> prompt = Prompts(*m)[1];
  ASSERT_GT(prompt.size(), 4u);
  const std::vector<int32_t> shorter(prompt.begin(), prompt.end() - 2);
  ASSERT_TRUE(DraftByModel(*b, shorter, 1, 0.0).ok());  // b holds the shorter sequence: 2 more to run
  std::vector<ModelDraft> drafts = {{.draft = a.get(), .sequence = prompt, .max_tokens = 3, .min_probability = 0.0},
                                    {.draft = b.get(), .sequence = prompt, .max_tokens = 3, .min_probability = 0.0}};
  const int64_t want_a = DraftCatchUpTokens(*a, prompt), want_b = DraftCatchUpTokens(*b, prompt);
  EXPECT_EQ(want_a, static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(want_b, 2);
  double seconds = -1;
  Result<int32_t> passes = DraftByModels(drafts, &seconds);
  ASSERT_TRUE(passes.ok()) << passes.status().message();
  EXPECT_EQ(drafts[0].caught_up, want_a);
  EXPECT_EQ(drafts[1].caught_up, want_b);
  EXPECT_GT(seconds, 0.0);
  for (ModelDraft& d : drafts) d.max_tokens = 0;  // nothing to draft: no catch-up pass
  passes = DraftByModels(drafts, &seconds);
  ASSERT_TRUE(passes.ok()) << passes.status().message();
  EXPECT_EQ(drafts[0].caught_up, 0);
  EXPECT_EQ(drafts[1].caught_up, 0);
  EXPECT_EQ(seconds, 0.0);
  EXPECT_EQ(*passes, 0);
}

TEST(DraftModel, ADraftOfAnotherTokenCountIsRefusedNamingTheFirstMissingId) {
  std::unique_ptr<Model> target = test::LoadSynth(TinyLlama(2), "draft_vocab_target");
  std::unique_ptr<Model> draft = test::LoadSynth(TinyLlama(1, 520), "draft_vocab_520");
  ASSERT_NE(target, nullptr);
  ASSERT_NE(draft, nullptr);
  const Status st = CheckDraftVocabulary(*target, *draft);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(target->info().path), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(draft->info().path), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("is 512"), std::string::npos) << st.message();
  // Generate refuses it before anything runs.
  std::unique_ptr<Session> s = test::NewSessionOrFail(*target);
  ASSERT_NE(s, nullptr);
  Result<Completion> c = s->Generate(std::vector<int32_t>{1, 2, 3},
                                     {.max_tokens = 4, .speculation = {.source = DraftSource::kModel, .draft_model = draft.get()}});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("is 512"), std::string::npos) << c.status().message();
  EXPECT_EQ(s->positions(), 0);
  // Without a draft model the options are refused, naming the field.
  c = s->Generate(std::vector<int32_t>{1, 2, 3}, {.max_tokens = 4, .speculation = {.source = DraftSource::kModel}});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("draft_model"), std::string::npos) << c.status().message();
}

// The same token count, other texts: stories260K's 512 tokens padded to 32,000 against the 32,000
// of Llama's SentencePiece vocabulary. The first id whose text differs (found here through the
// public TokenPiece) is the one named.
TEST(DraftModel, ADraftWhoseTokensDifferIsRefusedNamingTheFirstDifferentId) {
  const std::string spm = std::string(KVQ_SOURCE_DIR) + "/tests/testdata/vocab/ggml-vocab-llama-spm.gguf";
  const std::string stories = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/stories260K.gguf";
  std::vector<std::unique_ptr<Model>> models;
  for (const std::string& vocab : {stories, spm}) {
    const std::string path = (fs::path(::testing::TempDir()) /
                              ("kvq_draft_vocab_" + std::to_string(models.size()) + "_" + std::to_string(::getpid()) + ".gguf"))
                                 .string();
    ASSERT_TRUE(WriteSynthModel(TinyLlama(1, 32000), vocab, path).ok());
    Result<std::unique_ptr<Model>> m = Model::Load(path, {.threads = 2});
    fs::remove(path);
    ASSERT_TRUE(m.ok()) << m.status().message();
    models.push_back(std::move(m).value());
  }
  ASSERT_EQ(models[0]->info().vocab_size, models[1]->info().vocab_size);
  int32_t first = -1;
  for (int32_t id = 0; id < models[0]->info().vocab_size && first < 0; ++id) {
    if (models[0]->TokenPiece(id) != models[1]->TokenPiece(id)) first = id;
  }
  ASSERT_GE(first, 0);
  const Status st = CheckDraftVocabulary(*models[0], *models[1]);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("token " + std::to_string(first) + " is"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(models[0]->info().path), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(models[1]->info().path), std::string::npos) << st.message();
}

}  // namespace
}  // namespace kvq
