// Speculative decoding (kvq/speculation.h) changes no output: for every registered KV format, with
// and without sinks and a residual, greedy and sampled generation with every draft source give
// the tokens, text and finish reason of generation without, and leave the same cache behind. The
// prompt repeats a story so that drafts are kept (counted, so the test fails if none ever is), and
// ungated long drafts make rejections (and the rollback they need) frequent.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <cstdio>
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

const std::string kDir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";

std::unique_ptr<Model> LoadBundled() {
  Result<std::unique_ptr<Model>> m =
      Model::Load(kDir + "stories260K.bin", {.tokenizer_path = kDir + "tok512.bin", .threads = 2});
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

// A story told twice: the second telling is what prompt lookup drafts from.
const std::string kStory =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
    "One day, she saw a big red ball. ";

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct Outcome {
  Completion completion;
  std::string cache;  // the session's snapshot file afterwards (SavePrefix)
};

Outcome Generate(const Model& m, const KvOptions& kv, const GenerateRequest& request, const std::string& tag) {
  Outcome out;
  std::unique_ptr<Session> s = test::NewSessionOrFail(m, kv);
  if (s == nullptr) return out;
  Result<Completion> c = s->Generate(kStory + kStory + "Once upon a time", request);
  EXPECT_TRUE(c.ok()) << c.status().message();
  if (!c.ok()) return out;
  out.completion = std::move(c).value();
  const std::string path = (fs::path(::testing::TempDir()) / ("kvq_spec_" + tag + "_" + std::to_string(::getpid()) + ".snap")).string();
  EXPECT_TRUE(s->SavePrefix(path).ok());
  out.cache = FileBytes(path);
  fs::remove(path);
  return out;
}

void ExpectSame(const Outcome& spec, const Outcome& plain, const std::string& what) {
  EXPECT_EQ(spec.completion.tokens, plain.completion.tokens) << what;
  EXPECT_EQ(spec.completion.text, plain.completion.text) << what;
  EXPECT_EQ(spec.completion.finish, plain.completion.finish) << what;
  EXPECT_TRUE(spec.cache == plain.cache) << what << ": the caches differ";
  EXPECT_EQ(plain.completion.speculation.drafted, 0) << what;
}

TEST(Speculation, EveryFormatGivesTheTokensAndCacheOfPlainDecoding) {
  std::unique_ptr<Model> m = LoadBundled();
  ASSERT_NE(m, nullptr);
  int64_t kept = 0, dropped = 0;
  for (const FormatDesc* f : Formats()) {
    for (const std::string transforms : {"", "+sink4+res16"}) {
      const std::string name = std::string(f->name) + transforms;
      SCOPED_TRACE(name);
      const KvOptions kv{.key_format = name, .value_format = name, .page_positions = 64};
      for (const bool greedy : {true, false}) {
        GenerateRequest request{.max_tokens = 120, .sampling = {.temperature = greedy ? 0.0f : 0.8f, .seed = 7}};
        const Outcome plain = Generate(*m, kv, request, "plain");
        for (const DraftSource source : DraftSources()) {
          if (source == DraftSource::kNone) continue;
          // Ungated, 8 tokens a pass: many rejected drafts, each rolled back.
          request.speculation = {.source = source, .max_draft = 8, .ungated = true};
          // The draft model: the model itself with an int8 cache, so that some drafts differ.
          request.speculation.draft_model = m.get();
          request.speculation.draft_kv = {.key_format = "int8", .value_format = "int8"};
          const Outcome spec = Generate(*m, kv, request, "spec");
          ExpectSame(spec, plain, std::string(greedy ? "greedy " : "sampled ") + DraftSourceName(source));
          const SpeculationStats& st = spec.completion.speculation;
          EXPECT_LE(st.accepted, st.drafted);
          EXPECT_EQ(st.gated, 0);
          kept += st.accepted;
          dropped += st.drafted - st.accepted;  // rolled back from the cache
        }
      }
    }
  }
  // The test means something only if drafts were both kept and rejected.
  EXPECT_GT(kept, 100);
  EXPECT_GT(dropped, 100);
  std::printf("Speculation: %lld drafted tokens kept, %lld dropped\n", static_cast<long long>(kept),
              static_cast<long long>(dropped));
}

TEST(Speculation, StopStringsEndTokensAndMaxTokensEndWhereTheyWould) {
  std::unique_ptr<Model> m = LoadBundled();
  ASSERT_NE(m, nullptr);
  for (const int32_t max_tokens : {1, 2, 17, -1}) {
    for (const std::vector<std::string>& stop : std::vector<std::vector<std::string>>{{}, {"ball"}, {"."}}) {
      GenerateRequest request{.max_tokens = max_tokens, .sampling = {.temperature = 0}, .stop = stop};
      const Outcome plain = Generate(*m, {}, request, "plain");
      for (const DraftSource source : {DraftSource::kNgram, DraftSource::kSuffix}) {
        request.speculation = {.source = source, .max_draft = 6, .ungated = true};
        const Outcome spec = Generate(*m, {}, request, "spec");
        ExpectSame(spec, plain, "max_tokens " + std::to_string(max_tokens) + " " + DraftSourceName(source));
      }
    }
  }
}

TEST(Speculation, TheGatedRunGivesTheSameTokens) {
  std::unique_ptr<Model> m = LoadBundled();
  ASSERT_NE(m, nullptr);
  GenerateRequest request{.max_tokens = 200, .sampling = {.temperature = 0}};
  const Outcome plain = Generate(*m, {.key_format = "int4-kivi", .value_format = "int4-kivi"}, request, "plain");
  request.speculation = {.source = DraftSource::kNgram};
  const Outcome spec = Generate(*m, {.key_format = "int4-kivi", .value_format = "int4-kivi"}, request, "spec");
  ExpectSame(spec, plain, "gated");
}

// A hybrid's recurrent state cannot drop tokens: before each pass with a draft the session copies
// it, and on a rejection restores it and runs the kept tokens again. Every small hybrid preset
// (Gated DeltaNet; with MoE; Qwen3-Next's layout), every per-token KV format for its attention
// layers, greedy and sampled: the tokens, text and cache of decoding without speculation. Grouped
// formats (KIVI, fp8's key groups) are refused, naming why.
TEST(Speculation, HybridModelsRestoreTheirStateAndGiveTheTokensOfPlainDecoding) {
  int64_t kept = 0, dropped = 0, models = 0;
  for (const std::string& preset : SynthPresetNames()) {
    if (!preset.starts_with("tiny-")) continue;
    Result<SynthSpec> spec = SynthPreset(preset);
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    std::unique_ptr<Model> m = test::LoadSynth(*spec, "spec_" + preset);
    ASSERT_NE(m, nullptr) << preset;
    ++models;
    for (const FormatDesc* f : Formats()) {
      const std::string name = f->name;
      SCOPED_TRACE(preset + " " + name);
      const KvOptions kv{.key_format = name, .value_format = name, .page_positions = 64};
      if (f->key.rows_per_block > 1 || f->value.rows_per_block > 1) {
        // Grouped rows cannot drop a rejected draft exactly while the state is restored: refused.
        std::unique_ptr<Session> s = test::NewSessionOrFail(*m, kv);
        ASSERT_NE(s, nullptr);
        Result<Completion> c = s->Generate(std::vector<int32_t>{1, 2, 3},
                                           {.max_tokens = 4, .speculation = {.source = DraftSource::kNgram}});
        ASSERT_FALSE(c.ok());
        EXPECT_NE(c.status().message().find("drop rows one at a time"), std::string::npos) << c.status().message();
        EXPECT_EQ(s->positions(), 0);  // refused before anything ran
        continue;
      }
      for (const bool greedy : {true, false}) {
        GenerateRequest request{.max_tokens = 48, .sampling = {.temperature = greedy ? 0.0f : 0.8f, .seed = 3}};
        const Outcome plain = Generate(*m, kv, request, "hplain");
        for (const DraftSource source : {DraftSource::kNgram, DraftSource::kSuffix}) {
          request.speculation = {.source = source, .max_draft = 4, .ungated = true};
          const Outcome fast = Generate(*m, kv, request, "hspec");
          ExpectSame(fast, plain, std::string(greedy ? "greedy " : "sampled ") + DraftSourceName(source));
          kept += fast.completion.speculation.accepted;
          dropped += fast.completion.speculation.drafted - fast.completion.speculation.accepted;
        }
      }
    }
  }
  EXPECT_EQ(models, 3);
  EXPECT_GT(dropped, 100);  // restores happened
  std::printf("Hybrid speculation: %lld drafted tokens kept, %lld dropped (each drop a restore)\n",
              static_cast<long long>(kept), static_cast<long long>(dropped));
}

TEST(Speculation, BadOptionsNameTheField) {
  EXPECT_NE(CheckSpeculation({.max_draft = 0}).message().find("max_draft"), std::string::npos);
  EXPECT_NE(CheckSpeculation({.min_ngram = 3, .max_ngram = 2}).message().find("min_ngram"), std::string::npos);
  EXPECT_NE(ParseDraftSource("eagle").status().message().find("'eagle'"), std::string::npos);
}

TEST(DraftByLookup, TakesWhatFollowedTheLongestLatestMatch) {
  const SpeculationOptions o{.source = DraftSource::kNgram, .min_ngram = 1, .max_ngram = 3};
  // "1 2 3" ends the sequence and occurred at 0, followed by 9 1 2 3 — the end of the sequence,
  // 4 tokens after the match: the draft goes on with that period (9 1 2 3 9 1 2 3).
  EXPECT_EQ(DraftByLookup(std::vector<int32_t>{1, 2, 3, 9, 1, 2, 3}, 8, o),
            (std::vector<int32_t>{9, 1, 2, 3, 9, 1, 2, 3}));
  EXPECT_EQ(DraftByLookup(std::vector<int32_t>{1, 2, 3, 9, 1, 2, 3}, 2, o), (std::vector<int32_t>{9, 1}));
  // One token again and again (greedy decoding's loop): the latest match of "4 4 4" is one token
  // back, and the draft is that token max_tokens times, not once.
  EXPECT_EQ(DraftByLookup(std::vector<int32_t>{7, 4, 4, 4, 4}, 5, o), (std::vector<int32_t>{4, 4, 4, 4, 4}));
  // A match far enough back to supply every token reads no further than max_tokens after it.
  EXPECT_EQ(DraftByLookup(std::vector<int32_t>{1, 2, 5, 6, 8, 1, 2}, 2, o), (std::vector<int32_t>{5, 6}));
  // The latest of two occurrences of the 3-gram 5 6 7 wins (followed by 8, not 4).
  EXPECT_EQ(DraftByLookup(std::vector<int32_t>{5, 6, 7, 4, 5, 6, 7, 8, 5, 6, 7}, 1, o), (std::vector<int32_t>{8}));
  // A longer match beats a later shorter one: "2 7" occurs once (then 1), "7" last at index 5 (then 3).
  EXPECT_EQ(DraftByLookup(std::vector<int32_t>{2, 7, 1, 0, 0, 7, 3, 2, 7}, 1, o), (std::vector<int32_t>{1}));
  // Nothing recurs: no draft; min_ngram 2 ignores a 1-gram match.
  EXPECT_TRUE(DraftByLookup(std::vector<int32_t>{1, 2, 3, 4}, 8, o).empty());
  const SpeculationOptions two{.source = DraftSource::kNgram, .min_ngram = 2, .max_ngram = 3};
  EXPECT_TRUE(DraftByLookup(std::vector<int32_t>{4, 1, 2, 4}, 8, two).empty());
  EXPECT_TRUE(DraftByLookup(std::vector<int32_t>{}, 8, o).empty());
}

TEST(DraftSources, EveryNameParsesBackAndAnUnknownOneListsThem) {
  for (const DraftSource s : DraftSources()) EXPECT_EQ(*ParseDraftSource(DraftSourceName(s)), s);
  const std::string why = ParseDraftSource("eagle").status().message();
  for (const DraftSource s : DraftSources()) EXPECT_NE(why.find(DraftSourceName(s)), std::string::npos) << why;
}

// The suffix tree's counts, by hand: in 1 2 3 · 1 2 4 · 1 2 3 · 1 2, "1 2" was followed by 3 twice
// and by 4 once, so the draft after "... 1 2" is 3, with share 2/3.
TEST(SuffixTree, DraftsTheMostFrequentContinuationWhileItStaysLikely) {
  const std::vector<int32_t> seq{1, 2, 3, 9, 1, 2, 4, 9, 1, 2, 3, 9, 1, 2};
  const SpeculationOptions o{.source = DraftSource::kSuffix, .min_ngram = 1, .max_ngram = 2,
                             .min_draft_probability = 0.5};
  SuffixTree tree(8);
  tree.Append(seq);
  // 3 (share 2/3), then what followed "1 2 3" both times it occurred: 9, 1, 2 (shares 1).
  EXPECT_EQ(tree.Draft(seq, 4, o), (std::vector<int32_t>{3, 9, 1, 2}));
  // Where the latest occurrence is not the most frequent, prompt lookup follows the latest (8)
  // and the tree the most frequent (7, share 2/3).
  const std::vector<int32_t> seq2{5, 6, 7, 5, 6, 7, 5, 6, 8, 5, 6};
  SuffixTree tree2(8);
  tree2.Append(seq2);
  EXPECT_EQ(tree2.Draft(seq2, 1, o), (std::vector<int32_t>{7}));
  EXPECT_EQ(DraftByLookup(seq2, 1, {.source = DraftSource::kNgram, .min_ngram = 1, .max_ngram = 2}),
            (std::vector<int32_t>{8}));
  // A continuation share of 2/3 is below 0.7: no draft.
  SpeculationOptions strict = o;
  strict.min_draft_probability = 0.7;
  EXPECT_TRUE(tree2.Draft(seq2, 4, strict).empty());
  // The depth bounds suffix + draft: a tree of depth 3 matched on 2 tokens drafts 1.
  SuffixTree shallow(3);
  shallow.Append(seq);
  EXPECT_EQ(shallow.Draft(seq, 4, o).size(), 1u);
  // An unseen suffix drafts nothing; so does max_tokens 0.
  EXPECT_TRUE(tree.Draft(std::vector<int32_t>{7, 7}, 4, o).empty());
  EXPECT_TRUE(tree.Draft(seq, 0, o).empty());
}

TEST(SuffixTree, NoSubstringSpansTwoSequences) {
  const SpeculationOptions o{.source = DraftSource::kSuffix, .min_ngram = 1, .max_ngram = 2};
  SuffixTree tree(6);
  tree.Append(std::vector<int32_t>{1, 2});
  tree.EndSequence();
  tree.Append(std::vector<int32_t>{3, 4});
  EXPECT_TRUE(tree.Draft(std::vector<int32_t>{2}, 2, o).empty());  // 2 was never followed
  EXPECT_EQ(tree.Draft(std::vector<int32_t>{3}, 2, o), (std::vector<int32_t>{4}));
  // Nodes: root, then 1, 2, "1 2" | 3, 4, "3 4".
  EXPECT_EQ(tree.nodes(), 7);
}

TEST(SpeculationGate, DraftsWhileDraftsAreKeptAndStopsWhenTheyAreNot) {
  SpeculationGate gate(8);
  // Passes cost little more with more tokens (a memory-bound decode step).
  for (int32_t k = 0; k <= 8; ++k) gate.Record(k, k, 0.010 + 0.0005 * k, false);
  EXPECT_EQ(gate.Choose(8), 8);
  EXPECT_EQ(gate.Choose(3), 3);
  EXPECT_EQ(gate.Choose(0), 0);
  // Every draft rejected: the acceptance falls and the gate stops drafting.
  for (int i = 0; i < 30; ++i) gate.Record(4, 0, 0.012, false);
  EXPECT_LT(gate.acceptance(), 0.01);
  EXPECT_EQ(gate.Choose(8), 0);
  // Passes without a draft that existed bring it back toward trying again.
  for (int i = 0; i < 400; ++i) gate.Record(0, 0, 0.010, true);
  EXPECT_GT(gate.Choose(8), 0);
}

TEST(SpeculationGate, ExpensivePassesAreNotWorthAPoorDraft) {
  SpeculationGate gate(4);
  // A pass of k + 1 tokens costs (k + 1)× one token (compute-bound), acceptance about 0.5: a
  // draft yields fewer tokens per second than no draft (1 + 0.5 + … < k + 1).
  for (int i = 0; i < 20; ++i) {
    gate.Record(0, 0, 0.01, false);
    gate.Record(2, 1, 0.03, false);
    gate.Record(4, 2, 0.05, false);
  }
  EXPECT_EQ(gate.Choose(4), 0);
}

TEST(SpeculationGate, NoDraftUntilAPassWithoutOneIsTimed) {
  // Drafted passes alone, each (k + 1)x a 1-token pass (compute-bound) with half the drafts kept:
  // drafting 4 yields 1.94 tokens per 0.05 s, 39 a second, against 100 a second plainly. Estimated
  // from the 5-token pass through the prior's slope (1 + 0.1 k), the 1-token pass would be 0.036 s,
  // 28 a second, and drafting would look better than not: so no draft until the 1-token pass ran.
  SpeculationGate gate(4);
  for (int i = 0; i < 20; ++i) gate.Record(4, 2, 0.05, false);
  EXPECT_EQ(gate.Choose(4), 0);
  gate.Record(0, 0, 0.01, true);
  EXPECT_EQ(gate.Choose(4), 0);
  // Memory-bound passes (a 5-token pass 1.1x the 1-token one) and the same acceptance: worth it.
  SpeculationGate cheap(4);
  EXPECT_EQ(cheap.Choose(4), 0);
  cheap.Record(0, 0, 0.010, false);
  EXPECT_GT(cheap.Choose(4), 0);
  for (int i = 0; i < 20; ++i) cheap.Record(4, 2, 0.011, false);
  EXPECT_GT(cheap.Choose(4), 0);
}

TEST(SpeculationGate, TokensAfterAnEndingTokenAreNotRejections) {
  // A draft of 4 whose second token ended the completion (matched 2, ended): both judged tokens
  // agreed, the last two were never judged — the acceptance moves as for a draft of 2 kept whole,
  // not as for one with a rejection (2 of 3).
  SpeculationGate ended(4), whole(4), rejected(4);
  ended.Record(4, 2, 0.01, false, true);
  whole.Record(2, 2, 0.01, false);
  rejected.Record(4, 2, 0.01, false);
  EXPECT_DOUBLE_EQ(ended.acceptance(), whole.acceptance());
  EXPECT_LT(rejected.acceptance(), ended.acceptance());
  // The first drafted token ended it: one judged, agreed.
  SpeculationGate first(4);
  first.Record(4, 1, 0.01, false, true);
  EXPECT_DOUBLE_EQ(first.acceptance(), whole.acceptance());
}

TEST(SpeculationGate, EmptyModelDraftsCountAsRejections) {
  // Memory-bound passes and the prior acceptance: the gate drafts. A draft model that is asked
  // and offers nothing (never confident enough) must turn it off; recorded as a plain pass of no
  // draft (what it was before RecordEmptyDraft) the acceptance stays at its prior and the gate
  // keeps asking, a draft-model pass per step for nothing.
  SpeculationGate asked(8, true), empty(8, true);
  for (SpeculationGate* g : {&asked, &empty}) {
    for (int32_t k = 0; k <= 8; ++k) g->Record(k, k / 2, 0.010 + 0.0005 * k, false);
  }
  for (int i = 0; i < 10; ++i) {
    asked.Record(0, 0, 0.010, false);
    empty.RecordEmptyDraft();
    empty.Record(0, 0, 0.010, false);
  }
  EXPECT_GT(asked.Choose(8), 0);
  EXPECT_EQ(empty.Choose(8), 0);
}

TEST(SpeculationGate, ADraftModelsOwnPassesCountAgainstItsDraft) {
  // Verify passes nearly as cheap for 9 tokens as for 1 and drafts kept ~80% of the time: worth
  // drafting most of 8 when drafting is free (lookups). A draft model whose token costs as much as the
  // target's 1-token pass makes every draft dearer than what it saves: 1 + 0.8 tokens for
  // 0.0105 + 0.010 s against 1 token for 0.010 s, and longer drafts worse still — the gate must not
  // draft. Where a draft token costs a tenth of a pass, drafting pays again.
  SpeculationGate free(8, true), dear(8, true), cheap(8, true);
  for (SpeculationGate* g : {&free, &dear, &cheap}) {
    for (int i = 0; i < 20; ++i) {
      for (int32_t k = 0; k <= 8; ++k) g->Record(k, k == 0 ? 0 : (k * 4) / 5, 0.010 + 0.0005 * k, false);
    }
  }
  dear.RecordDraftSeconds(4, 4 * 0.010);
  cheap.RecordDraftSeconds(4, 4 * 0.001);
  EXPECT_GE(free.Choose(8), 4);
  EXPECT_EQ(dear.Choose(8), 0) << "acceptance " << dear.acceptance();
  EXPECT_GT(cheap.Choose(8), 0);
  EXPECT_DOUBLE_EQ(dear.draft_token_seconds(), 0.010);
}

// A draft model runs the tokens it has not seen before it drafts: the first of them costs every
// drafted pass, the rest (what it missed while the gate drafted nothing) once, and a draft is then
// chosen only when the time it saves over kCatchUpHorizon tokens exceeds that. The threshold is the
// test's own arithmetic on what the gate measured: tokens per pass 1 + a + … + a^k against the
// verify pass, k drafted tokens' seconds and one caught-up token's; the best k's rate r against the
// 1-token pass's T1; saved = horizon · (T1 − 1 / r).
TEST(SpeculationGate, ACatchUpIsWeighedAgainstWhatTheDraftSavesOverTheHorizon) {
  SpeculationGate gate(8, true);
  for (int i = 0; i < 40; ++i) {
    for (int32_t k = 0; k <= 8; ++k) gate.Record(k, k == 0 ? 0 : (k * 4) / 5, 0.010 + 0.0005 * k, false);
  }
  EXPECT_EQ(gate.CatchUpSeconds(10), 0.0);  // nothing timed: no estimate
  gate.RecordDraftSeconds(4, 4 * 0.001);
  EXPECT_DOUBLE_EQ(gate.CatchUpSeconds(10), 10 * 0.001);  // a drafted token's seconds until a catch-up is timed
  gate.RecordCatchUpSeconds(20, 20 * 0.0002);  // a batched catch-up: cheaper per token than a draft pass
  EXPECT_DOUBLE_EQ(gate.CatchUpSeconds(10), 10 * 0.0002);
  gate.RecordCatchUpSeconds(0, 1.0);  // nothing caught up: ignored
  EXPECT_DOUBLE_EQ(gate.CatchUpSeconds(10), 10 * 0.0002);
  const int32_t k = gate.Choose(8, 1);
  ASSERT_GT(k, 0);
  double yield = 1, term = 1;
  for (int32_t i = 1; i <= k; ++i) yield += (term *= gate.acceptance());
  const double rate = yield / (0.010 + 0.0005 * k + k * gate.draft_token_seconds() + 0.0002);
  const double saved = SpeculationGate::kCatchUpHorizon * (0.010 - 1.0 / rate);
  ASSERT_GT(saved, 0);
  // 1 + n tokens behind: n paid once.
  const auto behind = [&](double share) { return 1 + static_cast<int64_t>(share * saved / 0.0002); };
  EXPECT_EQ(gate.Choose(8, behind(0.99)), k);
  EXPECT_EQ(gate.Choose(8, behind(1.01) + 1), 0);
  // A caught-up token dearer than four 1-token passes: no draft pays even with nothing missed.
  SpeculationGate dear_catch_up = gate;
  for (int i = 0; i < 40; ++i) dear_catch_up.RecordCatchUpSeconds(1, 0.040);
  EXPECT_GT(dear_catch_up.Choose(8, 0), 0);
  EXPECT_EQ(dear_catch_up.Choose(8, 1), 0);
}

// What a draft session must run before it drafts: the tokens after the longest prefix of the
// sequence it holds, at least the last (for the logits after it); none when it is in step.
// A drafter given a learnt gate (an earlier completion's: Drafter::gate) drafts in its first pass;
// a fresh one runs that pass plainly, to time the pass every draft is weighed against.
TEST(Drafter, ALearntGateDraftsInTheFirstPassAFreshOneDoesNot) {
  const SpeculationOptions o{.source = DraftSource::kNgram, .max_draft = 4};
  const std::vector<int32_t> sequence = {7, 8, 9, 7, 8, 9, 7, 8};  // lookup drafts 9, 7, 8, 9
  Drafter fresh(o);
  Result<Drafter::Draft> d = fresh.Next(sequence, 4, nullptr);
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->tokens.empty());
  EXPECT_TRUE(d->gated);
  fresh.Record(0, 0, 0.010, true);                                   // the plain pass, timed
  for (int i = 0; i < 4; ++i) fresh.Record(4, 4, 0.011, false);      // drafts kept, passes cheap
  Drafter resumed(o, &fresh.gate());
  d = resumed.Next(sequence, 4, nullptr);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->tokens, (std::vector<int32_t>{9, 7, 8, 9}));
  EXPECT_FALSE(d->gated);
  EXPECT_EQ(resumed.gate().acceptance(), fresh.gate().acceptance());
}

// A gate that wants no draft of any length (its drafts were rejected) makes the drafter look none
// up: the pass is gated even where the lookup would have found nothing. A suffix drafter's tree
// takes the tokens it skipped when it drafts again, and drafts what a tree kept up to date drafts.
TEST(Drafter, AGateThatWantsNoDraftLooksNoneUpAndTheSuffixTreeCatchesUp) {
  for (const DraftSource source : {DraftSource::kNgram, DraftSource::kSuffix}) {
    SCOPED_TRACE(static_cast<int>(source));
    const SpeculationOptions o{.source = source, .max_draft = 4};
    Drafter drafter(o), eager(o);  // eager: told every pass's draft is kept, so it always looks up
    drafter.Record(0, 0, 0.010, true);
    eager.Record(0, 0, 0.010, true);
    for (int i = 0; i < 8; ++i) {
      drafter.Record(4, 0, 0.030, false);  // every draft rejected, passes dear: no draft pays
      eager.Record(4, 4, 0.011, false);
    }
    ASSERT_EQ(drafter.gate().Choose(4), 0);
    ASSERT_GT(eager.gate().Choose(4), 0);
    // No token repeats: a lookup finds no draft, so only a pass that does not look is gated.
    const std::vector<int32_t> fresh = {1, 2, 3, 4, 5};
    Result<Drafter::Draft> d = drafter.Next(fresh, 4, nullptr);
    ASSERT_TRUE(d.ok());
    EXPECT_TRUE(d->tokens.empty());
    EXPECT_TRUE(d->gated);
    d = eager.Next(fresh, 4, nullptr);
    ASSERT_TRUE(d.ok());
    EXPECT_TRUE(d->tokens.empty());
    EXPECT_FALSE(d->gated);
    // The drafter skips passes as the sequence grows, then its gate wants drafts again.
    std::vector<int32_t> sequence = fresh;
    for (const int32_t t : {1, 2, 3, 9, 1, 2}) {
      sequence.push_back(t);
      ASSERT_TRUE(drafter.Next(sequence, 4, nullptr).ok());
      ASSERT_TRUE(eager.Next(sequence, 4, nullptr).ok());
    }
    for (int i = 0; i < 8; ++i) drafter.Record(4, 4, 0.011, false);
    ASSERT_GT(drafter.gate().Choose(4), 0);
    sequence.push_back(3);
    const Result<Drafter::Draft> late = drafter.Next(sequence, 4, nullptr);
    const Result<Drafter::Draft> kept_up = eager.Next(sequence, 4, nullptr);
    ASSERT_TRUE(late.ok());
    ASSERT_TRUE(kept_up.ok());
    EXPECT_FALSE(kept_up->tokens.empty());
    EXPECT_EQ(late->tokens, kept_up->tokens);
  }
}

// A skipped lookup counts as gated (the gate's recovery toward its prior) at the rate the lookups
// made found a draft: on text where they found none, a closed gate stays closed, as it did when
// every pass looked and found nothing to drop.
TEST(Drafter, SkippedLookupsAreGatedAtTheRateLookupsFoundDrafts) {
  const SpeculationOptions o{.source = DraftSource::kNgram, .max_draft = 4};
  Drafter drafter(o);
  drafter.Record(0, 0, 0.010, true);
  for (int i = 0; i < 8; ++i) drafter.Record(4, 4, 0.011, false);  // open
  ASSERT_GT(drafter.gate().Choose(4), 0);
  std::vector<int32_t> sequence;
  for (int32_t t = 1; t <= 24; ++t) {  // no token repeats: every lookup finds nothing
    sequence.push_back(t);
    const Result<Drafter::Draft> d = drafter.Next(sequence, 4, nullptr);
    ASSERT_TRUE(d.ok());
    EXPECT_TRUE(d->tokens.empty());
    EXPECT_FALSE(d->gated);
  }
  for (int i = 0; i < 8; ++i) drafter.Record(4, 0, 0.030, false);  // closed
  ASSERT_EQ(drafter.gate().Choose(4), 0);
  int gated = 0;
  for (int32_t t = 25; t <= 80; ++t) {
    sequence.push_back(t);
    const Result<Drafter::Draft> d = drafter.Next(sequence, 4, nullptr);
    ASSERT_TRUE(d.ok());
    gated += d->gated ? 1 : 0;
    drafter.Record(0, 0, 0.010, d->gated);
  }
  EXPECT_EQ(gated, 0);
  EXPECT_EQ(drafter.gate().Choose(4), 0);
}

// Session::Generate keeps its gate for the session's next completion with the same gate key
// (SpeculationGateKey): a chat's next turn resumes it (Completion::speculation.gate_resumed), a
// fork goes on with it, other options start afresh; the tokens are plain decoding's either way.
TEST(Speculation, ASessionsNextCompletionResumesItsGate) {
  std::unique_ptr<Model> m = LoadBundled();
  ASSERT_NE(m, nullptr);
  std::unique_ptr<Session> s = test::NewSessionOrFail(*m, KvOptions{});
  ASSERT_NE(s, nullptr);
  GenerateRequest request{.max_tokens = 24, .sampling = {.temperature = 0}};
  request.speculation = {.source = DraftSource::kNgram};
  const std::string first = kStory + kStory + "Once upon a time";
  Result<Completion> c = s->Generate(first, request);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_FALSE(c->speculation.gate_resumed);
  const std::string second = first + c->text + " " + kStory;
  // The next turn's tokens, decoded plainly by a fresh session.
  std::unique_ptr<Session> plain = test::NewSessionOrFail(*m, KvOptions{});
  ASSERT_NE(plain, nullptr);
  GenerateRequest no_spec = request;
  no_spec.speculation = {};
  Result<Completion> want = plain->Generate(second, no_spec);
  ASSERT_TRUE(want.ok()) << want.status().message();
  Result<std::unique_ptr<Session>> fork = s->Fork();
  ASSERT_TRUE(fork.ok()) << fork.status().message();
  for (Session* session : {s.get(), fork->get()}) {
    c = session->Generate(second, request);
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_TRUE(c->speculation.gate_resumed) << (session == s.get() ? "the session" : "its fork");
    EXPECT_EQ(c->tokens, want->tokens) << (session == s.get() ? "the session" : "its fork");
  }
  c = s->Generate(second, no_spec);  // no speculation: the kept gate stays as it was
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->speculation.gate_resumed);
  GenerateRequest other = request;
  other.speculation.max_draft = 3;  // another gate key: a fresh gate, then that one kept
  for (const bool resumed : {false, true}) {
    c = s->Generate(second, other);
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ(c->speculation.gate_resumed, resumed);
    EXPECT_EQ(c->tokens, want->tokens);
  }
  EXPECT_NE(SpeculationGateKey(request.speculation), SpeculationGateKey(other.speculation));
}

TEST(Drafter, CatchUpTokensAreThoseTheDraftSessionMissed) {
  std::unique_ptr<Model> m = LoadBundled();
  ASSERT_NE(m, nullptr);
  std::unique_ptr<Session> draft = test::NewSessionOrFail(*m, KvOptions{});
  ASSERT_NE(draft, nullptr);
  std::vector<int32_t> sequence = m->Tokenize(kStory);
  ASSERT_GT(sequence.size(), 8u);
  EXPECT_EQ(DraftCatchUpTokens(*draft, sequence), static_cast<int64_t>(sequence.size()));
  EXPECT_EQ(DraftCatchUpTokens(*draft, {}), 0);
  Result<std::vector<int32_t>> d = DraftByModel(*draft, sequence, 1, 0.0);
  ASSERT_TRUE(d.ok()) << d.status().message();
  ASSERT_EQ(d->size(), 1u);
  // It ran the sequence and holds nothing past it (the one drafted token needs no pass).
  EXPECT_EQ(draft->positions(), static_cast<int64_t>(sequence.size()));
  EXPECT_EQ(DraftCatchUpTokens(*draft, sequence), 0);
  for (int32_t t : {5, 6, 7}) sequence.push_back(t);  // three passes the gate ran without a draft
  EXPECT_EQ(DraftCatchUpTokens(*draft, sequence), 3);
  sequence.resize(sequence.size() - 3);
  EXPECT_EQ(DraftCatchUpTokens(*draft, sequence), 0);
  sequence.back() ^= 1;  // the last token differs: it runs again from the prefix before it
  EXPECT_EQ(DraftCatchUpTokens(*draft, sequence), 1);
  sequence.resize(sequence.size() - 2);  // a prefix of what it holds: the last runs again
  EXPECT_EQ(DraftCatchUpTokens(*draft, sequence), 1);
}

TEST(Drafter, ADraftModelThatNeverDraftsIsAskedLessAndLess) {
  // The bundled model drafting for itself with a least probability of 1 (its most likely token is
  // never certain): each ask is a pass of the draft model and offers nothing. Session::Generate's
  // loop, reduced to the drafter: ask, record the 1-token pass, count the asks.
  std::unique_ptr<Model> m = LoadBundled();
  ASSERT_NE(m, nullptr);
  std::unique_ptr<Session> draft = test::NewSessionOrFail(*m, KvOptions{});
  ASSERT_NE(draft, nullptr);
  Drafter drafter({.source = DraftSource::kModel, .min_draft_probability = 1.0, .draft_model = m.get()});
  std::vector<int32_t> sequence = m->Tokenize(kStory);
  int asks = 0;
  for (int step = 0; step < 64; ++step) {
    bool gated = false;
    if (drafter.ModelDraftLength(8, &gated, DraftCatchUpTokens(*draft, sequence)) > 0) ++asks;
    Result<Drafter::Draft> d = drafter.Next(sequence, 8, draft.get());
    ASSERT_TRUE(d.ok()) << d.status().message();
    EXPECT_TRUE(d->tokens.empty());
    drafter.Record(0, 0, 0.010, d->gated);
    sequence.push_back(static_cast<int32_t>(3 + step % 7));  // the token the target drew
  }
  // Off after a few asks, then an ask now and then as the gate tries again (kRecovery): far fewer
  // than one per step (64 without RecordEmptyDraft).
  EXPECT_LE(asks, 64 / 4) << asks << " of 64 steps ran the draft model for nothing";
  EXPECT_GE(asks, 1);
}

// JudgeDraft on hand-made logits (vocabulary 4, each row's largest entry drawn): a draft kept
// while it equals the drawn token; the first that differs is returned to run next; a drafted
// token that ends the completion is matched (the draft was right) but not kept.
TEST(JudgeDraft, KeepsAgreeingTokensReturnsTheFirstOtherAndCountsAnEndingMatch) {
  constexpr int32_t kVocab = 4;
  const std::vector<float> logits = {  // [3 drafted positions, vocab]: draws 2, 3, 1
      0, 0, 9, 0,  //
      0, 0, 0, 9,  //
      0, 9, 0, 0};
  const DrawToken argmax = [](std::span<const float> row, int64_t) -> Result<int32_t> {
    return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
  };
  std::vector<int32_t> taken;
  auto take_until = [&](int32_t end) {
    taken.clear();
    return TakeToken([&taken, end](int32_t token, std::span<const float>, int32_t) {
      taken.push_back(token);
      return token != end;
    });
  };
  // All three agree.
  Result<DraftJudgement> j = JudgeDraft(std::vector<int32_t>{5, 2, 3, 1}, logits, kVocab, argmax, take_until(-1));
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->accepted, 3);
  EXPECT_EQ(j->drawn, -1);
  EXPECT_FALSE(j->ended);
  EXPECT_EQ(j->matched(), 3);
  EXPECT_EQ(taken, (std::vector<int32_t>{2, 3, 1}));
  // The second differs: 3 is drawn there and not taken.
  j = JudgeDraft(std::vector<int32_t>{5, 2, 0, 1}, logits, kVocab, argmax, take_until(-1));
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->accepted, 1);
  EXPECT_EQ(j->drawn, 3);
  EXPECT_FALSE(j->ended);
  EXPECT_EQ(j->matched(), 1);
  EXPECT_EQ(taken, (std::vector<int32_t>{2}));
  // The second agrees and ends the completion: matched, not kept, the third never judged.
  j = JudgeDraft(std::vector<int32_t>{5, 2, 3, 1}, logits, kVocab, argmax, take_until(3));
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->accepted, 1);
  EXPECT_EQ(j->drawn, -1);
  EXPECT_TRUE(j->ended);
  EXPECT_EQ(j->matched(), 2);
  EXPECT_EQ(taken, (std::vector<int32_t>{2, 3}));
  // Too few logits for the pass: an error naming the counts.
  j = JudgeDraft(std::vector<int32_t>{5, 2, 3, 1, 0}, logits, kVocab, argmax, take_until(-1));
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.status().message().find("12 logits for a pass of 5 tokens"), std::string::npos)
      << j.status().message();
}

}  // namespace
}  // namespace kvq
