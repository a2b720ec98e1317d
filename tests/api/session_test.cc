// The public C++ API (kvq/model.h, kvq/session.h) on the bundled stories260K: Generate against the
// golden run.c output, the step-by-step API against Generate, truncate/clear/prefix round trips
// against uninterrupted runs, and every refusal with its message.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "kvq/log.h"
#include "kvq/model.h"
#include "kvq/session.h"
#include "test_util/golden_runc.h"

namespace kvq {
namespace {

const std::string kDir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";

std::unique_ptr<Model> LoadBundled(ModelOptions options = {}) {
  options.tokenizer_path = kDir + "tok512.bin";
  if (options.threads == 0) options.threads = 1;
  Result<std::unique_ptr<Model>> m = Model::Load(kDir + "stories260K.bin", options);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::unique_ptr<Session> NewSession(const Model& model) {
  Result<std::unique_ptr<Session>> s = model.NewSession();
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? std::move(s).value() : nullptr;
}

int32_t Argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(logits.size()); ++i) best = logits[i] > logits[best] ? i : best;
  return best;
}

const GenerateRequest kGreedy{.max_tokens = 60, .sampling = {.temperature = 0}};

TEST(ModelApi, InfoComesFromTheFile) {
  std::unique_ptr<Model> m = LoadBundled({.context = 100});
  ASSERT_NE(m, nullptr);
  const ModelInfo& i = m->info();
  EXPECT_EQ(i.architecture, "llama");
  EXPECT_EQ(i.n_layers, 5);
  EXPECT_EQ(i.dim, 64);
  EXPECT_EQ(i.head_dim, 8);
  EXPECT_EQ(i.vocab_size, 512);
  EXPECT_EQ(i.trained_context, 512);
  EXPECT_EQ(i.context, 100);
  EXPECT_EQ(i.bos, 1);
  EXPECT_EQ(i.eos, 2);
}

TEST(ModelApi, TokenizeDetokenizeRoundTrip) {
  std::unique_ptr<Model> m = LoadBundled();
  ASSERT_NE(m, nullptr);
  const std::string text = "Once upon a time, there was a little girl.";
  const std::vector<int32_t> with_bos = m->Tokenize(text);
  ASSERT_FALSE(with_bos.empty());
  EXPECT_EQ(with_bos[0], 1);
  const std::vector<int32_t> without = m->Tokenize(text, AddBos::kNo);
  EXPECT_EQ(std::vector<int32_t>(with_bos.begin() + 1, with_bos.end()), without);
  Result<std::string> back = m->Detokenize(with_bos);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, text);
  EXPECT_FALSE(m->Detokenize(std::vector<int32_t>{5, 512}).ok());
  EXPECT_EQ(m->TokenPiece(1), "\n<s>\n");  // as tok512.bin stores it
  EXPECT_EQ(m->TokenPiece(-1), "");
  EXPECT_TRUE(m->IsEndOfGeneration(2));
  EXPECT_FALSE(m->IsEndOfGeneration(5));
}

// Every golden run.c run: Generate's prompt + completion ids equal run.c's, up to run.c's BOS stop
// (kvq stops there too, without emitting it).
TEST(SessionApi, GreedyGenerateEqualsRunC) {
  std::unique_ptr<Model> m = LoadBundled({.kv = {.key_format = "f32", .value_format = "f32"}});
  ASSERT_NE(m, nullptr);
  const std::vector<test::GoldenRun> golden = test::ReadGoldenRuns();
  ASSERT_GE(golden.size(), 3u);
  for (const test::GoldenRun& g : golden) {
    std::unique_ptr<Session> s = NewSession(*m);
    ASSERT_NE(s, nullptr);
    std::vector<int32_t> want = g.ids;
    if (want.back() == 1) want.pop_back();
    const std::vector<int32_t> prompt_ids = m->Tokenize(g.prompt);
    std::string streamed;
    Result<Completion> c = s->Generate(
        g.prompt, {.max_tokens = static_cast<int32_t>(want.size() - prompt_ids.size()), .sampling = {.temperature = 0}},
        [&](int32_t, const std::string& piece) {
          streamed += piece;
          return true;
        });
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ(streamed, c->text);
    std::vector<int32_t> got = prompt_ids;
    got.insert(got.end(), c->tokens.begin(), c->tokens.end());
    EXPECT_EQ(got, want) << "prompt \"" << g.prompt << "\"";
  }
}

TEST(SessionApi, StepByStepEqualsGenerate) {
  std::unique_ptr<Model> m = LoadBundled();
  ASSERT_NE(m, nullptr);
  std::unique_ptr<Session> a = NewSession(*m), b = NewSession(*m);
  ASSERT_TRUE(a && b);
  Result<Completion> c = a->Generate("Lily and Ben", kGreedy);
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->finish, FinishReason::kLength);
  EXPECT_TRUE(b->logits().empty());
  EXPECT_FALSE(b->Sample().ok());
  ASSERT_TRUE(b->Prefill(m->Tokenize("Lily and Ben")).ok());
  for (int32_t t : c->tokens) {
    ASSERT_EQ(Argmax(b->logits()), t);
    ASSERT_TRUE(b->Decode(t).ok());
  }
  // Generate leaves the cache holding every token it ran (the last sampled one is not run).
  EXPECT_EQ(a->positions() + 1, b->positions());
  EXPECT_EQ(a->kv_bytes() * b->positions(), b->kv_bytes() * a->positions());  // f16: bytes ∝ positions
}

TEST(SessionApi, SamplerIsSeededAndGreedyAtZeroTemperature) {
  std::unique_ptr<Model> m = LoadBundled();
  ASSERT_NE(m, nullptr);
  std::unique_ptr<Session> s = NewSession(*m);
  ASSERT_TRUE(s->Prefill(m->Tokenize("Once")).ok());
  s->SetSampler({.temperature = 0});
  EXPECT_EQ(*s->Sample(), Argmax(s->logits()));
  s->SetSampler({.temperature = 1.5f, .top_k = 0, .top_p = 1, .min_p = 0, .seed = 7});
  std::vector<int32_t> first;
  for (int i = 0; i < 20; ++i) first.push_back(*s->Sample());
  s->SetSampler({.temperature = 1.5f, .top_k = 0, .top_p = 1, .min_p = 0, .seed = 7});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(*s->Sample(), first[i]) << i;
}

TEST(SessionApi, CallbackCancels) {
  std::unique_ptr<Model> m = LoadBundled();
  std::unique_ptr<Session> s = NewSession(*m);
  int calls = 0;
  Result<Completion> c = s->Generate("Once upon a time", kGreedy, [&](int32_t, const std::string&) {
    return ++calls < 5;
  });
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(calls, 5);
  EXPECT_EQ(c->tokens.size(), 5u);
  EXPECT_EQ(c->finish, FinishReason::kCancelled);
}

TEST(SessionApi, GenerateReusesTheHeldPrefix) {
  std::unique_ptr<Model> m = LoadBundled();
  std::unique_ptr<Session> s = NewSession(*m), fresh = NewSession(*m);
  Result<Completion> first = s->Generate("Once upon a time", kGreedy);
  ASSERT_TRUE(first.ok());
  const std::string follow = "Once upon a time" + first->text + " The end.";
  Result<Completion> again = s->Generate(follow, kGreedy);
  Result<Completion> want = fresh->Generate(follow, kGreedy);
  ASSERT_TRUE(again.ok() && want.ok());
  EXPECT_GT(again->n_reused, 50);
  EXPECT_EQ(want->n_reused, 0);
  EXPECT_EQ(again->tokens, want->tokens);
}

TEST(SessionApi, TruncateThenContinueEqualsAFreshRun) {
  std::unique_ptr<Model> m = LoadBundled();
  std::unique_ptr<Session> s = NewSession(*m), fresh = NewSession(*m);
  const std::vector<int32_t> ids = m->Tokenize("Once upon a time, there was a big dog named Max.");
  ASSERT_TRUE(s->Prefill(ids).ok());
  ASSERT_TRUE(s->Truncate(5).ok());
  EXPECT_EQ(s->positions(), 5);
  ASSERT_TRUE(s->Decode(ids[5]).ok());
  ASSERT_TRUE(fresh->Prefill(std::span<const int32_t>(ids).first(6)).ok());
  ASSERT_EQ(s->logits().size(), fresh->logits().size());
  for (size_t i = 0; i < s->logits().size(); ++i) ASSERT_EQ(s->logits()[i], fresh->logits()[i]) << i;
  EXPECT_FALSE(s->Truncate(7).ok());
  EXPECT_FALSE(s->Truncate(-1).ok());
  ASSERT_TRUE(s->Clear().ok());
  EXPECT_EQ(s->positions(), 0);
  EXPECT_TRUE(s->logits().empty());
}

// The chat rule (kvq chat, the page's chat in a tab): what the session holds is kept up to where
// it and the next prompt differ, never all of the prompt; the next Generate then reuses exactly that.
TEST(SessionApi, KeepCommonPrefixKeepsWhereThePromptsAgree) {
  std::unique_ptr<Model> m = LoadBundled();
  std::unique_ptr<Session> s = NewSession(*m);
  const std::vector<int32_t> ids = m->Tokenize("Once upon a time, there was a big dog named Max.");
  ASSERT_GT(ids.size(), 8u);
  const std::span<const int32_t> all(ids);
  ASSERT_TRUE(s->Prefill(all.first(8)).ok());
  // A longer prompt that extends what is held: all 8 kept, nothing truncated.
  Result<int64_t> kept = s->KeepCommonPrefix(all);
  ASSERT_TRUE(kept.ok()) << kept.status().message();
  EXPECT_EQ(*kept, 8);
  EXPECT_EQ(s->positions(), 8);
  // Exactly what is held: all but its last token (that one runs again, for the logits).
  kept = s->KeepCommonPrefix(all.first(8));
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(*kept, 7);
  EXPECT_EQ(s->positions(), 7);
  // A prompt that differs at index 5: the 5 before it.
  std::vector<int32_t> other(ids.begin(), ids.begin() + 9);
  other[5] = other[5] == 3 ? 4 : 3;
  kept = s->KeepCommonPrefix(other);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(*kept, 5);
  const std::vector<int32_t> held(s->tokens().begin(), s->tokens().end());
  EXPECT_EQ(held, std::vector<int32_t>(ids.begin(), ids.begin() + 5));
  Result<Completion> c = s->Generate(other, kGreedy);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->n_reused, 5);
  // Nothing in common: nothing kept.
  kept = s->KeepCommonPrefix(std::vector<int32_t>{ids[0] == 3 ? 4 : 3, ids[1]});
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(*kept, 0);
  EXPECT_EQ(s->positions(), 0);
}

TEST(SessionApi, PrefixSnapshotRoundTrip) {
  std::unique_ptr<Model> m = LoadBundled();
  std::unique_ptr<Session> s = NewSession(*m), restored = NewSession(*m);
  const std::string path = ::testing::TempDir() + "/kvq_session_prefix.snap";
  std::filesystem::remove(path);
  const std::vector<int32_t> ids = m->Tokenize("Lily went to the park with her mom");
  ASSERT_TRUE(s->Prefill(std::span<const int32_t>(ids).first(ids.size() - 1)).ok());
  ASSERT_TRUE(s->SavePrefix(path).ok());
  Result<int64_t> loaded = restored->LoadPrefix(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ(*loaded, static_cast<int64_t>(ids.size() - 1));
  EXPECT_TRUE(restored->logits().empty());
  ASSERT_TRUE(s->Decode(ids.back()).ok());
  ASSERT_TRUE(restored->Decode(ids.back()).ok());
  for (size_t i = 0; i < s->logits().size(); ++i) ASSERT_EQ(s->logits()[i], restored->logits()[i]) << i;
  // Another format's session refuses the file and stays as it was.
  Result<std::unique_ptr<Session>> int4 = m->NewSession({.key_format = "int4", .value_format = "int4"});
  ASSERT_TRUE(int4.ok());
  Result<int64_t> refused = (*int4)->LoadPrefix(path);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(path), std::string::npos) << refused.status().message();
  EXPECT_EQ((*int4)->positions(), 0);
  std::filesystem::remove(path);
}

TEST(SessionApi, PerLayerFormats) {
  std::unique_ptr<Model> m = LoadBundled();
  KvOptions plan;
  for (int l = 0; l < 5; ++l) plan.layers.push_back({l < 2 ? "f16" : "int8", l < 2 ? "f16" : "int4"});
  Result<std::unique_ptr<Session>> s = m->NewSession(plan);
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_TRUE((*s)->Prefill(m->Tokenize("Once upon a time")).ok());
  std::unique_ptr<Session> f16 = NewSession(*m);
  ASSERT_TRUE(f16->Prefill(m->Tokenize("Once upon a time")).ok());
  EXPECT_LT((*s)->kv_bytes(), f16->kv_bytes());
  plan.layers.pop_back();
  Result<std::unique_ptr<Session>> short_plan = m->NewSession(plan);
  ASSERT_FALSE(short_plan.ok());
  EXPECT_NE(short_plan.status().message().find("4 entries; the model has 5 layers"), std::string::npos)
      << short_plan.status().message();
}

TEST(ApiRefusals, NameWhatIsWrong) {
  auto message = [](const Status& s) { return s.ok() ? std::string("(ok)") : s.message(); };
  Result<std::unique_ptr<Model>> missing = Model::Load("/nonexistent/model.gguf");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/model.gguf"), std::string::npos);
  EXPECT_FALSE(Model::Load(kDir + "stories260K.bin", {.tokenizer_path = kDir + "tok512.bin", .threads = 2000}).ok());
  Result<std::unique_ptr<Model>> long_ctx =
      Model::Load(kDir + "stories260K.bin", {.tokenizer_path = kDir + "tok512.bin", .context = 513});
  ASSERT_FALSE(long_ctx.ok());
  EXPECT_NE(long_ctx.status().message().find("512"), std::string::npos);
  Result<std::unique_ptr<Model>> bad_kv = Model::Load(
      kDir + "stories260K.bin", {.tokenizer_path = kDir + "tok512.bin", .kv = {.key_format = "int3"}});
  ASSERT_FALSE(bad_kv.ok());
  EXPECT_NE(bad_kv.status().message().find("int3"), std::string::npos);

  std::unique_ptr<Model> m = LoadBundled({.context = 40});
  std::unique_ptr<Session> s = NewSession(*m);
  std::vector<int32_t> too_many(41, 5);
  EXPECT_NE(message(s->Prefill(too_many)).find("context is 40"), std::string::npos);
  EXPECT_EQ(s->positions(), 0);
  EXPECT_NE(message(s->Prefill(std::vector<int32_t>{1, 512})).find("outside the vocabulary"), std::string::npos);
  EXPECT_EQ(s->positions(), 0);
  // A prompt past the context is refused before the session is touched.
  ASSERT_TRUE(s->Prefill(m->Tokenize("Once upon")).ok());
  const int64_t held = s->positions();
  std::string long_prompt;
  for (int i = 0; i < 30; ++i) long_prompt += "Once upon a time ";
  Result<Completion> too_long = s->Generate(long_prompt, kGreedy);
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("context is 40"), std::string::npos) << too_long.status().message();
  EXPECT_EQ(s->positions(), held);
  EXPECT_FALSE(s->logits().empty());
  ASSERT_TRUE(s->Clear().ok());
  // Generation stops when the context is full.
  Result<Completion> c = s->Generate("Once upon a time", {.max_tokens = -1, .sampling = {.temperature = 0}});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->finish, FinishReason::kContext);
  EXPECT_EQ(s->positions(), 40);
}

TEST(LogApi, CallbackReceivesMessages) {
  std::vector<std::string> seen;
  SetLogCallback([&](LogLevel, const std::string& m) { seen.push_back(m); });
  Log(LogLevel::kWarning, "hello");
  SetLogCallback({});
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], "hello");
}

}  // namespace
}  // namespace kvq
