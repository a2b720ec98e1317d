// Speculation on hybrids (Gated DeltaNet layers beside attention ones) with verify passes longer
// than a prefill block: a pass of 1 + 64 drafted tokens runs as two blocks of kPrefillBlock (64)
// and 1, its judging rows all in the first and the logits after it from the second; a rejection
// restores the recurrent state from the copy taken before the pass and runs the kept tokens again.
// For every hybrid architecture of the table (its tiny synth preset), prompts whose lengths put
// those passes across a 64-position boundary at different offsets, greedy and sampled: the tokens,
// text, finish and cache (recurrent state included) of decoding without speculation; and in kvq
// serve's engine, two such requests at once (their passes one batched step) give the text of
// Session::Generate without speculation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <thread>

#include "gguf/architectures.h"
#include "kvq/model.h"
#include "kvq/session.h"
#include "kvq/speculation.h"
#include "server/engine.h"
#include "synth/synth.h"
#include "test_util/synth_model.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

constexpr int32_t kDraft = kPrefillBlock;  // drafted tokens per pass: the pass is one block and one token
constexpr int32_t kTokens = 160;

using Outcome = test::GenerateOutcome;

Outcome Generate(const Model& m, const std::vector<int32_t>& prompt, const GenerateRequest& request) {
  return test::GenerateAndSnapshot(m, {.page_positions = 64}, prompt, request, "kvq_hybrid_spec");
}

// The tiny synth preset of `arch`; none is a failure (a hybrid architecture nobody can test).
std::unique_ptr<Model> TinyModelOf(const Architecture& arch) {
  for (const std::string& name : SynthPresetNames()) {
    if (!name.starts_with("tiny-")) continue;
    Result<SynthSpec> spec = SynthPreset(name);
    EXPECT_TRUE(spec.ok()) << spec.status().message();
    if (spec.ok() && spec->arch == arch.id) return test::LoadSynth(*spec, std::string("hspec_") + arch.name);
  }
  ADD_FAILURE() << "no tiny- synth preset of the hybrid architecture " << arch.name;
  return nullptr;
}

// n random ids past the first three (BOS, EOS and the like), the same for the same n.
std::vector<int32_t> RandomPrompt(int32_t n, int32_t vocab) {
  std::mt19937 rng(static_cast<uint32_t>(n));
  std::vector<int32_t> prompt(n);
  for (int32_t& t : prompt) t = 3 + static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab - 3));
  return prompt;
}

TEST(HybridSpeculation, VerifyPassesAcrossABlockBoundaryGiveTheTokensOfPlainDecoding) {
  int64_t hybrids = 0, long_passes = 0, kept = 0, dropped = 0;
  for (const Architecture& arch : Architectures()) {
    if (!arch.hybrid()) continue;
    SCOPED_TRACE(arch.name);
    ++hybrids;
    std::unique_ptr<Model> m = TinyModelOf(arch);
    ASSERT_NE(m, nullptr);
    const int32_t vocab = m->info().vocab_size;
    // Prompt lengths: the first pass (positions n..n+64) crosses position 64 at its 35th token,
    // its 2nd, or starts on it; later passes fall wherever acceptance puts them.
    for (const int32_t n : {30, 63, 64}) {
      const std::vector<int32_t> prompt = RandomPrompt(n, vocab);
      for (const bool greedy : {true, false}) {
        const std::string what = std::string(greedy ? "greedy" : "sampled") + ", prompt of " + std::to_string(n);
        GenerateRequest request{.max_tokens = kTokens, .sampling = {.temperature = greedy ? 0.0f : 0.8f, .seed = 5},
                                .ignore_eos = true};
        const Outcome plain = Generate(*m, prompt, request);
        ASSERT_EQ(plain.completion.tokens.size(), static_cast<size_t>(kTokens)) << what;
        // The model drafting for itself drafts a whole kDraft every pass (its least probability
        // is tiny): passes of 65 tokens. From an f16 cache, as the target's, its greedy drafts are
        // the target's own tokens (a block gives the bits of decoding token by token), so each
        // pass is kept whole and the next token comes from the second block's logits; from an
        // int8 cache it mostly, not always, agrees: rejections at rows of the first block, each a
        // restore. Prompt lookup on random text: drafts mostly rejected at once.
        for (const char* draft_kv : {"f16", "int8", ""}) {
          // Sampled, a greedy draft model is rejected at once nearly every pass (and each
          // rejection runs the hybrid draft's history again): prompt lookup only.
          if (!greedy && *draft_kv) continue;
          request.speculation = {.source = *draft_kv ? DraftSource::kModel : DraftSource::kNgram,
                                 .max_draft = kDraft, .min_draft_probability = 1e-6, .ungated = true,
                                 .draft_model = m.get(), .draft_kv = {.key_format = draft_kv, .value_format = draft_kv}};
          const Outcome fast = Generate(*m, prompt, request);
          const std::string arm = what + (*draft_kv ? std::string(", drafts from a ") + draft_kv + " cache" : ", ngram");
          EXPECT_EQ(fast.completion.tokens, plain.completion.tokens) << arm;
          EXPECT_EQ(fast.completion.text, plain.completion.text) << arm;
          EXPECT_EQ(fast.completion.finish, plain.completion.finish) << arm;
          EXPECT_TRUE(fast.cache == plain.cache) << arm << ": the caches differ";
          const SpeculationStats& st = fast.completion.speculation;
          if (*draft_kv) {
            // The first pass has room for a whole draft, and the draft model never stops short
            // (its most likely token's probability is at least 1/vocab): a pass of 65 at least.
            EXPECT_GE(st.drafted, kDraft) << arm;
            long_passes += st.passes;
            // Every drafted token accepted; the last is the completion's last (it ends it at
            // max_tokens), accepted though it never runs (DraftJudgement::matched).
            if (std::string(draft_kv) == "f16") {
              EXPECT_EQ(st.accepted, st.drafted) << arm;
            }
          }
          std::printf("%s %s: %lld passes, %lld drafted, %lld kept\n", arch.name, arm.c_str(),
                      static_cast<long long>(st.passes), static_cast<long long>(st.drafted),
                      static_cast<long long>(st.accepted));
          kept += st.accepted;
          dropped += st.drafted - st.accepted;
        }
      }
    }
  }
  EXPECT_GT(hybrids, 0);
  EXPECT_GT(kept, 10 * kDraft);   // whole long drafts kept
  EXPECT_GT(dropped, 10 * kDraft);  // and rejected ones, each a restore
  std::printf("hybrid speculation across blocks: %lld draft-model passes; %lld drafted tokens kept, %lld dropped\n",
              static_cast<long long>(long_passes), static_cast<long long>(kept), static_cast<long long>(dropped));
}

// kvq serve's engine: a decode step's segment is the sampled token and a 64-token draft, judged
// row by row (AdvanceDrafted), the state restored and the kept tokens run again on a rejection;
// the prompts are prefilled in 64-token chunks interleaved with the other request's passes.
TEST(HybridSpeculation, TheEnginesLongPassesGiveTheTextOfPlainDecoding) {
  int64_t hybrids = 0;
  for (const Architecture& arch : Architectures()) {
    if (!arch.hybrid()) continue;
    SCOPED_TRACE(arch.name);
    ++hybrids;
    std::unique_ptr<Model> m = TinyModelOf(arch);
    ASSERT_NE(m, nullptr);
    const std::vector<std::vector<int32_t>> prompts = {RandomPrompt(30, m->info().vocab_size),
                                                       RandomPrompt(63, m->info().vocab_size)};
    std::vector<std::string> alone;
    for (const std::vector<int32_t>& p : prompts) {
      alone.push_back(Generate(*m, p, {.max_tokens = kTokens, .sampling = {.temperature = 0}, .ignore_eos = true})
                          .completion.text);
    }
    for (const char* draft_kv : {"f16", "int8"}) {
      SCOPED_TRACE(draft_kv);
      const SpeculationOptions spec = {.source = DraftSource::kModel, .max_draft = kDraft,
                                       .min_draft_probability = 1e-6, .ungated = true, .draft_model = m.get(),
                                       .draft_kv = {.key_format = draft_kv, .value_format = draft_kv}};
      server::Metrics metrics;
      Result<std::unique_ptr<server::Engine>> engine =
          server::Engine::Create(*m, {.parallel = 2, .kv = {.page_positions = 64}, .speculation = spec}, &metrics);
      ASSERT_TRUE(engine.ok()) << engine.status().message();
      std::vector<std::shared_ptr<server::Job>> jobs;
      for (const std::vector<int32_t>& p : prompts) {
        auto job = (*engine)->Submit({.prompt = p, .max_tokens = kTokens, .sampling = {.temperature = 0},
                                      .ignore_eos = true, .speculation = spec});
        ASSERT_TRUE(std::holds_alternative<std::shared_ptr<server::Job>>(job));
        jobs.push_back(std::get<std::shared_ptr<server::Job>>(job));
      }
      for (size_t i = 0; i < jobs.size(); ++i) {
        std::string text;
        server::Job::News news;
        do {
          news = jobs[i]->Wait(std::chrono::seconds(60));
          text += news.text;
        } while (!news.finished);
        EXPECT_FALSE(news.error.has_value()) << news.error->message;
        EXPECT_EQ(news.usage.completion_tokens, kTokens) << i;
        EXPECT_EQ(text, alone[i]) << "prompt " << i;
      }
      // Long drafts ran; from the f16 cache all were kept, from the int8 one some were not.
      EXPECT_GE(metrics.spec_draft_tokens.load(), 2 * kDraft);
      if (std::string(draft_kv) == "int8") {
        EXPECT_LT(metrics.spec_accepted_tokens.load(), metrics.spec_draft_tokens.load());
      }
      std::printf("%s engine, drafts from a %s cache: %lld drafts, %lld drafted, %lld kept\n", arch.name, draft_kv,
                  static_cast<long long>(metrics.spec_drafts.load()),
                  static_cast<long long>(metrics.spec_draft_tokens.load()),
                  static_cast<long long>(metrics.spec_accepted_tokens.load()));
    }
  }
  EXPECT_GT(hybrids, 0);
}

}  // namespace
}  // namespace kvq
