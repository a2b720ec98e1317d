// The Generator (kvq/generator.h) on the bundled stories260K's vocabulary, fed chosen tokens by
// hand: stop strings (split across tokens, at the very start, the earliest of several), the
// hold-back of a stop string's first bytes and of a split UTF-8 character and its release, end
// tokens with and without ignore_eos, max_tokens, a full context, cancellation, and its refusals;
// the same rules for a sequence held outside a Session.
// Then Session::Generate, which drives it, against a hand loop of Prefill/Decode/Sample/Generator
// for every KV format in the registry, and with stop strings against a run without them.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstring>

#include "kvq/format.h"
#include "kvq/generator.h"
#include "kvq/model.h"
#include "kvq/session.h"

namespace kvq {
namespace {

const std::string kDir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";

const Model& Bundled() {
  static std::unique_ptr<Model> model = [] {
    Result<std::unique_ptr<Model>> m =
        Model::Load(kDir + "stories260K.bin", {.tokenizer_path = kDir + "tok512.bin", .threads = 1, .context = 64});
    EXPECT_TRUE(m.ok()) << m.status().message();
    return std::move(m).value();
  }();
  return *model;
}

// The id whose piece is `piece` (" the": SentencePiece's U+2581 shown as a space).
int32_t Id(const std::string& piece) {
  for (int32_t id = 0; id < Bundled().info().vocab_size; ++id) {
    if (Bundled().TokenPiece(id) == piece) return id;
  }
  ADD_FAILURE() << "no token \"" << piece << "\"";
  return 0;
}
int32_t Byte(uint8_t b) { return Id(fmt::format("<0x{:02X}>", b)); }

// A session holding the prompt "Once" (BOS, "Once"): the next token's text keeps its leading space.
std::unique_ptr<Session> Prompted(const std::string& prompt = "Once") {
  Result<std::unique_ptr<Session>> s = Bundled().NewSession();
  EXPECT_TRUE(s.ok()) << s.status().message();
  EXPECT_TRUE((*s)->Prefill(Bundled().Tokenize(prompt)).ok());
  return std::move(s).value();
}

Generator Make(const Session& session, const GeneratorOptions& options) {
  Result<Generator> g = Generator::Create(session, options);
  EXPECT_TRUE(g.ok()) << g.status().message();
  return std::move(g).value();
}

TEST(Generator, TheVocabularyIsWhatTheTestsAssume) {
  const int32_t once = Bundled().Tokenize("Once").back();  // Prompted()'s last token
  EXPECT_EQ(Bundled().TokenText(once, Id(" the")), " the");
  EXPECT_EQ(Bundled().TokenText(once, Byte(0xC3)), "\xC3");
  EXPECT_TRUE(Bundled().IsEndOfGeneration(2));
  EXPECT_EQ(Bundled().info().bos, 1);
}

TEST(Generator, AStopStringSplitAcrossTokensCutsTheTextBeforeIt) {
  std::unique_ptr<Session> s = Prompted();
  Generator g = Make(*s, {.max_tokens = 10, .stop = {"e a"}});
  const GeneratorStep first = g.Next(Id(" the"));  // " the": "e" may begin "e a", held back
  EXPECT_EQ(first.text, " th");
  EXPECT_TRUE(first.kept && first.run && !first.finished);
  const GeneratorStep second = g.Next(Id(" a"));   // " the a": the stop string
  EXPECT_EQ(second.text, "");
  EXPECT_TRUE(second.finished && second.kept && !second.run);
  EXPECT_EQ(second.finish, FinishReason::kStop);
  EXPECT_EQ(g.text(), " th");
  EXPECT_EQ(g.tokens().size(), 2u);
  EXPECT_TRUE(g.finished());
  // A token after the end is refused: nothing changes.
  const GeneratorStep after = g.Next(Id(" the"));
  EXPECT_TRUE(after.finished && !after.kept && after.text.empty());
  EXPECT_EQ(g.tokens().size(), 2u);
}

TEST(Generator, AHeldPrefixThatIsNotAStopStringIsReleasedByTheNextToken) {
  std::unique_ptr<Session> s = Prompted();
  Generator g = Make(*s, {.max_tokens = 10, .stop = {"e x"}});
  EXPECT_EQ(g.Next(Id(" the")).text, " th");
  EXPECT_EQ(g.Next(Id(" a")).text, "e a");  // "e a" is not "e x": the held "e" goes out
  EXPECT_FALSE(g.finished());
  EXPECT_EQ(g.released_bytes(), g.text().size());
}

TEST(Generator, AStopStringAtTheVeryStartLeavesNoText) {
  std::unique_ptr<Session> s = Prompted();
  Generator g = Make(*s, {.stop = {" the"}});
  const GeneratorStep step = g.Next(Id(" the"));
  EXPECT_TRUE(step.finished && step.kept && !step.run);
  EXPECT_EQ(step.finish, FinishReason::kStop);
  EXPECT_EQ(step.text, "");
  EXPECT_EQ(g.text(), "");
}

TEST(Generator, TheEarliestOfSeveralStopStringsWins) {
  std::unique_ptr<Session> s = Prompted();
  Generator g = Make(*s, {.stop = {" a", "he"}});
  const GeneratorStep step = g.Next(Id(" the"));  // "he" at 2; " a" nowhere
  EXPECT_TRUE(step.finished);
  EXPECT_EQ(g.text(), " t");
  EXPECT_EQ(step.text, " t");
}

TEST(Generator, AUtf8CharacterSplitAcrossTokensIsHeldThenReleasedWhole) {
  std::unique_ptr<Session> s = Prompted();
  Generator g = Make(*s, {});
  EXPECT_EQ(g.Next(Id(" the")).text, " the");
  const GeneratorStep lead = g.Next(Byte(0xC3));  // é = C3 A9
  EXPECT_EQ(lead.text, "");
  EXPECT_TRUE(lead.run);
  EXPECT_EQ(g.Next(Byte(0xA9)).text, "\xC3\xA9");
  // A four-byte character (U+1F600 = F0 9F 98 80) over four tokens.
  EXPECT_EQ(g.Next(Byte(0xF0)).text, "");
  EXPECT_EQ(g.Next(Byte(0x9F)).text, "");
  EXPECT_EQ(g.Next(Byte(0x98)).text, "");
  EXPECT_EQ(g.Next(Byte(0x80)).text, "\xF0\x9F\x98\x80");
  EXPECT_EQ(g.text(), " the\xC3\xA9\xF0\x9F\x98\x80");
}

TEST(Generator, MaxTokensReleasesWhatWasHeld) {
  std::unique_ptr<Session> s = Prompted();
  Generator utf8 = Make(*s, {.max_tokens = 2});
  EXPECT_EQ(utf8.Next(Id(" the")).text, " the");
  const GeneratorStep cut = utf8.Next(Byte(0xC3));  // an incomplete character, but the end
  EXPECT_TRUE(cut.finished && cut.kept && !cut.run);
  EXPECT_EQ(cut.finish, FinishReason::kLength);
  EXPECT_EQ(cut.text, "\xC3");
  Generator stop = Make(*s, {.max_tokens = 1, .stop = {"e x"}});
  const GeneratorStep last = stop.Next(Id(" the"));
  EXPECT_EQ(last.finish, FinishReason::kLength);
  EXPECT_EQ(last.text, " the");  // the "e" held for "e x" goes out at the end
}

TEST(Generator, MaxTokensZeroIsFinishedAtOnce) {
  std::unique_ptr<Session> s = Prompted();
  Generator g = Make(*s, {.max_tokens = 0});
  EXPECT_TRUE(g.finished());
  EXPECT_EQ(g.finish_reason(), FinishReason::kLength);
}

TEST(Generator, EndTokensEndTheTextUnlessIgnored) {
  std::unique_ptr<Session> s = Prompted();
  for (const int32_t end : {2, 1}) {  // EOS, and BOS (a llama2.c model's next story)
    Generator g = Make(*s, {.stop = {"e x"}});
    EXPECT_EQ(g.Next(Id(" the")).text, " th");
    const GeneratorStep step = g.Next(end);
    EXPECT_TRUE(step.finished && !step.kept && !step.run) << end;
    EXPECT_EQ(step.finish, FinishReason::kStop);
    EXPECT_EQ(step.text, "e") << "the held text is released at an end token";
    EXPECT_EQ(g.tokens().size(), 1u);
    EXPECT_EQ(g.text(), " the");

    Generator ignoring = Make(*s, {.ignore_eos = true});
    const GeneratorStep kept = ignoring.Next(end);
    EXPECT_TRUE(kept.kept && kept.run && !kept.finished) << end;
    EXPECT_EQ(ignoring.tokens().size(), 1u);
  }
}

TEST(Generator, AFullContextEndsWithContextAndMaxTokensComesFirst) {
  std::unique_ptr<Session> s = Prompted("Once upon a time");  // context 64
  std::vector<int32_t> more(64 - 2 - s->positions(), Id(" the"));
  ASSERT_TRUE(s->Prefill(more).ok());
  ASSERT_EQ(s->positions(), 62);
  Generator g = Make(*s, {.max_tokens = -1});
  EXPECT_TRUE(g.Next(Id(" a")).run);   // runs at position 62
  EXPECT_TRUE(g.Next(Id(" a")).run);   // runs at position 63, the last
  const GeneratorStep full = g.Next(Id(" a"));
  EXPECT_TRUE(full.finished && full.kept && !full.run);
  EXPECT_EQ(full.finish, FinishReason::kContext);
  Generator both = Make(*s, {.max_tokens = 3});
  both.Next(Id(" a"));
  both.Next(Id(" a"));
  EXPECT_EQ(both.Next(Id(" a")).finish, FinishReason::kLength);
}

TEST(Generator, CancelEndsWithoutReleasingHeldText) {
  std::unique_ptr<Session> s = Prompted();
  Generator g = Make(*s, {.stop = {"e x"}});
  EXPECT_EQ(g.Next(Id(" the")).text, " th");
  const GeneratorStep step = g.Cancel();
  EXPECT_TRUE(step.finished && !step.run);
  EXPECT_EQ(step.finish, FinishReason::kCancelled);
  EXPECT_EQ(step.text, "");
  EXPECT_EQ(g.text(), " the");
  EXPECT_EQ(g.Cancel().finish, FinishReason::kCancelled);
  Generator done = Make(*s, {.max_tokens = 1});
  done.Next(Id(" the"));
  EXPECT_EQ(done.Cancel().finish, FinishReason::kLength) << "cancelling a finished generator changes nothing";
}

TEST(Generator, RefusalsNameWhatIsWrong) {
  const Status empty = Generator::Check({.stop = {"ok", ""}});
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.message().find("GeneratorOptions::stop[1] is empty"), std::string::npos) << empty.message();
  const Status no_text = Generator::Check({.preserved_tokens = {"[TOOL_CALLS]", ""}});
  ASSERT_FALSE(no_text.ok());
  EXPECT_EQ(no_text.message(),
            "GeneratorOptions::preserved_tokens[1] is empty (expected a control token's text, e.g. \"[TOOL_CALLS]\")");
  // A preserved text the vocabulary has no control token for is accepted (ordinary text there).
  Result<std::unique_ptr<Session>> held = Bundled().NewSession();
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE((*held)->Prefill(Bundled().Tokenize("Once upon")).ok());
  Result<Generator> plain = Generator::Create(**held, {.preserved_tokens = {"[TOOL_CALLS]"}});
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  Result<std::unique_ptr<Session>> fresh = Bundled().NewSession();
  ASSERT_TRUE(fresh.ok());
  Result<Generator> none = Generator::Create(**fresh, {});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("holds no tokens"), std::string::npos) << none.status().message();
  EXPECT_EQ(std::string(FinishReasonName(FinishReason::kContext)), "context");
  EXPECT_EQ(std::string(FinishReasonName(FinishReason::kCancelled)), "cancelled");
}

// A sequence held outside a Session (the page's WebGPU runner) gets the same rules from the
// model, its last token and its positions: the same steps, token for token, as the session's
// generator over the same prompt, up to the full context; bad inputs are refused, named.
TEST(Generator, ASequenceOutsideASessionFollowsTheSameRules) {
  std::unique_ptr<Session> s = Prompted("Once upon a time");
  const GeneratorOptions options{.max_tokens = -1, .stop = {"e x"}};
  Generator from_session = Make(*s, options);
  Result<Generator> made = Generator::Create(Bundled(), s->tokens().back(), s->positions(), s->context(), options);
  ASSERT_TRUE(made.ok()) << made.status().message();
  Generator& outside = made.value();
  const int32_t tokens[] = {Id(" the"), Byte(0xC3), Byte(0xA9), Id(" a")};
  for (int i = 0; !from_session.finished(); ++i) {
    const int32_t token = tokens[i % 4];
    const GeneratorStep a = from_session.Next(token), b = outside.Next(token);
    ASSERT_EQ(a.text, b.text) << "step " << i;
    ASSERT_EQ(a.kept, b.kept) << "step " << i;
    ASSERT_EQ(a.run, b.run) << "step " << i;
    ASSERT_EQ(a.finished, b.finished) << "step " << i;
    ASSERT_EQ(a.finish, b.finish) << "step " << i;
  }
  EXPECT_TRUE(outside.finished());
  EXPECT_EQ(outside.finish_reason(), FinishReason::kContext);
  EXPECT_EQ(outside.text(), from_session.text());
  const struct { int32_t last; int64_t positions, context; const char* says; } bad[] = {
      {-1, 5, 64, "outside the vocabulary"}, {512, 5, 64, "outside the vocabulary"},
      {1, 0, 64, "0 positions held"}, {1, 65, 64, "65 positions held in a context of 64"}};
  for (const auto& b : bad) {
    Result<Generator> refused = Generator::Create(Bundled(), b.last, b.positions, b.context, {});
    ASSERT_FALSE(refused.ok()) << b.says;
    EXPECT_NE(refused.status().message().find(b.says), std::string::npos) << refused.status().message();
  }
  Result<Generator> empty_stop = Generator::Create(Bundled(), 1, 5, 64, {.stop = {""}});
  ASSERT_FALSE(empty_stop.ok());
  EXPECT_NE(empty_stop.status().message().find("stop[0] is empty"), std::string::npos);
}

// A prompt longer than a prefill block, so the hand loop's cut (blocks of 64, then the last token
// alone) is exercised past one block.
std::string LongPrompt() {
  std::string p;
  for (int i = 0; i < 6; ++i) p += "Once upon a time, there was a little girl named Lily. ";
  return p + "One day";
}

// Session::Generate is Prefill(prompt but its last token), Decode(last token), then Sample →
// Generator → Decode: the same tokens, text, logits and cache bytes as that loop by hand, for
// every KV format (and for sampling with a seed, not only greedy).
TEST(SessionGenerate, EqualsTheHandLoopForEveryFormat) {
  Result<std::unique_ptr<Model>> loaded =
      Model::Load(kDir + "stories260K.bin", {.tokenizer_path = kDir + "tok512.bin", .threads = 1});
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  const Model& m = **loaded;
  const std::vector<int32_t> prompt = m.Tokenize(LongPrompt());
  ASSERT_GT(prompt.size(), 64u + 2);
  const SamplerOptions sampling{.temperature = 0.9f, .seed = 11};
  const GenerateRequest request{.max_tokens = 40, .sampling = sampling};
  int formats = 0;
  for (const FormatDesc* f : Formats()) {
    SCOPED_TRACE(f->name);
    Result<std::unique_ptr<Session>> a = m.NewSession({.key_format = f->name, .value_format = f->name});
    Result<std::unique_ptr<Session>> b = m.NewSession({.key_format = f->name, .value_format = f->name});
    ASSERT_TRUE(a.ok() && b.ok()) << (a.ok() ? b : a).status().message();
    ++formats;
    Result<Completion> c = (*a)->Generate(prompt, request);
    ASSERT_TRUE(c.ok()) << c.status().message();

    Session& hand = **b;
    const std::span<const int32_t> ids(prompt);
    ASSERT_TRUE(hand.Prefill(ids.first(ids.size() - 1)).ok());
    ASSERT_TRUE(hand.Decode(ids.back()).ok());
    hand.SetSampler(sampling);
    Result<Generator> made = Generator::Create(hand, {.max_tokens = request.max_tokens});
    ASSERT_TRUE(made.ok());
    Generator& g = made.value();
    std::string streamed;
    while (!g.finished()) {
      const int32_t token = *hand.Sample();
      const GeneratorStep step = g.Next(token);
      streamed += step.text;
      if (step.run) ASSERT_TRUE(hand.Decode(token).ok());
    }
    EXPECT_EQ(c->tokens, std::vector<int32_t>(g.tokens().begin(), g.tokens().end()));
    EXPECT_EQ(c->text, g.text());
    EXPECT_EQ(streamed, g.text());
    EXPECT_EQ(c->finish, g.finish_reason());
    ASSERT_EQ((*a)->positions(), hand.positions());
    EXPECT_EQ((*a)->kv_bytes(), hand.kv_bytes());
    ASSERT_EQ((*a)->logits().size(), hand.logits().size());
    EXPECT_EQ(std::memcmp((*a)->logits().data(), hand.logits().data(), hand.logits().size() * sizeof(float)), 0)
        << "the logits differ in some bit";
  }
  EXPECT_EQ(formats, static_cast<int>(Formats().size()));
}

// Stop strings through Session::Generate: the text is a run without them cut before the first,
// the stream is that text, and the session can go on.
TEST(SessionGenerate, StopStringsCutTheStreamedText) {
  Result<std::unique_ptr<Session>> s = Bundled().NewSession();
  ASSERT_TRUE(s.ok());
  const GenerateRequest greedy{.max_tokens = 40, .sampling = {.temperature = 0}};
  Result<Completion> full = (*s)->Generate("Once upon a time", greedy);
  ASSERT_TRUE(full.ok()) << full.status().message();
  const size_t cut = full->text.find(' ', 10);
  ASSERT_NE(cut, std::string::npos) << full->text;
  const std::string stop = full->text.substr(cut, 4);
  GenerateRequest with_stop = greedy;
  with_stop.stop = {stop, "never appears in a story \x01"};
  std::string streamed;
  Result<Completion> c = (*s)->Generate("Once upon a time", with_stop, [&](int32_t, const std::string& text) {
    streamed += text;
    return true;
  });
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->text, full->text.substr(0, full->text.find(stop)));
  EXPECT_EQ(streamed, c->text);
  EXPECT_EQ(c->finish, FinishReason::kStop);
  EXPECT_LT(c->tokens.size(), full->tokens.size());
  with_stop.stop = {""};
  Result<Completion> bad = (*s)->Generate("Once upon a time", with_stop);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("stop[0]"), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace kvq
