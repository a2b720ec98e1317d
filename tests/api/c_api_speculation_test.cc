// The C API's speculative decoding (include/kvq.h: kvq_session_set_speculation,
// kvq_session_speculation_stats) as a C caller sees it: greedy generation with each draft source —
// prompt lookup, the suffix tree, and a draft model (the bundled model itself with a 2-bit draft
// cache, which mostly, not always, agrees with it) — gives the tokens, text pieces and finish
// reason of generation without, token for token, and the counts say drafts were both kept and
// rejected. Bad settings are errors naming the field, and leave the setting as it was.
#include <gtest/gtest.h>

#include <cstddef>

#include <string>
#include <vector>

#include "kvq.h"

namespace {

const std::string kDir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";

kvq_model* LoadBundled() {
  kvq_model_options o;
  kvq_model_options_init(&o);
  const std::string tok = kDir + "tok512.bin";
  o.tokenizer_path = tok.c_str();
  o.threads = 1;
  kvq_model* m = kvq_model_load((kDir + "stories260K.bin").c_str(), &o);
  EXPECT_NE(m, nullptr) << kvq_last_error();
  return m;
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::string text;
  int finish = -1;
  kvq_speculation_stats stats{};
};

int Collect(int32_t token, const char* piece, void* user) {
  Outcome* run = static_cast<Outcome*>(user);
  run->tokens.push_back(token);
  run->text += piece;
  return 1;
}

// Greedy, 96 tokens, on a fresh session with `spec` (NULL: none).
Outcome Generate(kvq_model* m, const char* prompt, const kvq_speculation_options* spec) {
  Outcome run;
  kvq_session* s = kvq_session_new(m, nullptr);
  EXPECT_NE(s, nullptr) << kvq_last_error();
  if (s == nullptr) return run;
  EXPECT_EQ(kvq_session_set_speculation(s, spec), KVQ_OK) << kvq_last_error();
  kvq_generate_options go;
  kvq_generate_options_init(&go);
  go.max_tokens = 96;
  go.temperature = 0;
  int64_t n = -1;
  EXPECT_EQ(kvq_session_generate(s, prompt, &go, Collect, &run, &n), KVQ_OK) << kvq_last_error();
  EXPECT_EQ(n, static_cast<int64_t>(run.tokens.size()));
  run.finish = kvq_session_finish_reason(s);
  kvq_speculation_stats_init(&run.stats);
  EXPECT_EQ(kvq_session_speculation_stats(s, &run.stats), KVQ_OK) << kvq_last_error();
  kvq_session_free(s);
  return run;
}

TEST(CApiSpeculation, GreedyWithEachDrafterIsGreedyWithout) {
  kvq_model* m = LoadBundled();
  ASSERT_NE(m, nullptr);
  const char* prompts[] = {
      "Once upon a time, there was a little girl named Lily. She loved to play outside. Once upon a time, there "
      "was a little girl named Lily. She loved to play outside. Once upon",
      "The sun was warm and the sky was blue"};
  for (const int32_t source : {KVQ_DRAFT_NGRAM, KVQ_DRAFT_SUFFIX, KVQ_DRAFT_MODEL}) {
    SCOPED_TRACE(source);
    kvq_speculation_options spec;
    kvq_speculation_options_init(&spec);
    spec.source = source;
    spec.max_draft = 4;
    spec.ungated = 1;  // every draft runs: many rejected
    if (source == KVQ_DRAFT_MODEL) {
      spec.draft_model = m;
      spec.draft_kv = "int2";
      spec.min_draft_probability = 1e-6;
    }
    int64_t drafted = 0, accepted = 0;
    for (const char* prompt : prompts) {
      const Outcome plain = Generate(m, prompt, nullptr);
      const Outcome drafting = Generate(m, prompt, &spec);
      EXPECT_EQ(drafting.tokens, plain.tokens) << prompt;
      EXPECT_EQ(drafting.text, plain.text) << prompt;
      EXPECT_EQ(drafting.finish, plain.finish) << prompt;
      EXPECT_EQ(plain.stats.drafted, 0);
      EXPECT_GT(drafting.stats.passes, 0);
      // Each pass keeps its drawn token and its accepted drafts: fewer passes than tokens when kept.
      EXPECT_LE(drafting.stats.passes, static_cast<int64_t>(drafting.tokens.size()) + 1);
      EXPECT_EQ(drafting.stats.gated, 0);  // ungated
      // A fresh session's draft model reads the whole prompt; other sources run no draft model.
      const int64_t prompt_tokens = kvq_tokenize(m, prompt, -1, nullptr, 0);
      ASSERT_GT(prompt_tokens, 0) << kvq_last_error();
      EXPECT_EQ(drafting.stats.draft_prompt_tokens, source == KVQ_DRAFT_MODEL ? prompt_tokens : 0) << prompt;
      drafted += drafting.stats.drafted;
      accepted += drafting.stats.accepted;
    }
    EXPECT_GT(accepted, 0);
    EXPECT_LT(accepted, drafted);
  }
  kvq_model_free(m);
}

TEST(CApiSpeculation, BadSettingsAreErrorsNamingTheField) {
  kvq_model* m = LoadBundled();
  ASSERT_NE(m, nullptr);
  kvq_session* s = kvq_session_new(m, nullptr);
  ASSERT_NE(s, nullptr);
  kvq_speculation_options spec;
  auto fails = [&](const char* field) {
    EXPECT_EQ(kvq_session_set_speculation(s, &spec), KVQ_ERROR) << field;
    EXPECT_NE(std::string(kvq_last_error()).find(field), std::string::npos) << kvq_last_error();
    kvq_speculation_options_init(&spec);
  };
  kvq_speculation_options_init(&spec);
  spec.source = 7;
  fails("options.source is 7");
  spec.source = KVQ_DRAFT_MODEL;
  fails("options.draft_model is NULL");
  spec.source = KVQ_DRAFT_MODEL;
  spec.draft_model = m;
  spec.draft_kv = "int5x";
  fails("options.draft_kv \"int5x\"");
  spec.source = KVQ_DRAFT_NGRAM;
  spec.max_draft = 0;
  fails("max_draft");
  spec.struct_size = 0;
  fails("struct_size is 0");
  EXPECT_EQ(kvq_session_set_speculation(nullptr, &spec), KVQ_ERROR);
  EXPECT_EQ(kvq_session_speculation_stats(s, nullptr), KVQ_ERROR);
  // Before any generate the counts are zeros; the refused settings left none in force.
  kvq_speculation_stats stats;
  kvq_speculation_stats_init(&stats);
  ASSERT_EQ(kvq_session_speculation_stats(s, &stats), KVQ_OK);
  EXPECT_EQ(stats.passes, 0);
  kvq_generate_options go;
  kvq_generate_options_init(&go);
  go.max_tokens = 8;
  go.temperature = 0;
  ASSERT_EQ(kvq_session_generate(s, "Once upon a time", &go, nullptr, nullptr, nullptr), KVQ_OK);
  ASSERT_EQ(kvq_session_speculation_stats(s, &stats), KVQ_OK);
  EXPECT_GT(stats.passes, 0);
  EXPECT_EQ(stats.drafted, 0);
  // A caller built before draft_prompt_tokens existed passes the first published size: taken, and
  // the field after it is not written.
  kvq_speculation_stats first;
  kvq_speculation_stats_init(&first);
  first.struct_size = offsetof(kvq_speculation_stats, draft_prompt_tokens);
  first.draft_prompt_tokens = -7;
  ASSERT_EQ(kvq_session_speculation_stats(s, &first), KVQ_OK) << kvq_last_error();
  EXPECT_EQ(first.passes, stats.passes);
  EXPECT_EQ(first.draft_prompt_tokens, -7);
  first.struct_size = offsetof(kvq_speculation_stats, draft_prompt_tokens) - 1;
  EXPECT_EQ(kvq_session_speculation_stats(s, &first), KVQ_ERROR);
  // gate_resumed: the session's next generate with the same speculation resumes the gate; a size
  // that stops before the field leaves it unwritten.
  kvq_speculation_options_init(&spec);
  spec.source = KVQ_DRAFT_NGRAM;
  ASSERT_EQ(kvq_session_set_speculation(s, &spec), KVQ_OK) << kvq_last_error();
  for (const int32_t resumed : {0, 1}) {
    ASSERT_EQ(kvq_session_generate(s, "Once upon a time", &go, nullptr, nullptr, nullptr), KVQ_OK);
    kvq_speculation_stats_init(&stats);
    stats.gate_resumed = -1;
    ASSERT_EQ(kvq_session_speculation_stats(s, &stats), KVQ_OK);
    EXPECT_EQ(stats.gate_resumed, resumed);
    first.struct_size = offsetof(kvq_speculation_stats, gate_resumed);
    first.gate_resumed = -7;
    ASSERT_EQ(kvq_session_speculation_stats(s, &first), KVQ_OK) << kvq_last_error();
    EXPECT_EQ(first.gate_resumed, -7);
    EXPECT_EQ(first.draft_prompt_tokens, 0);
  }
  kvq_session_free(s);
  kvq_model_free(m);
}

}  // namespace
