// The C generator (include/kvq.h: kvq_generator_*): a C caller's own sampling loop over it gives
// exactly what kvq_session_generate gives — tokens, streamed text, the whole text and the finish
// reason — for each way a completion ends; the sequence form (a runner other than a session)
// follows the same rules; a grammar is applied through kvq_generator_constrain; bad arguments are
// errors that name what is wrong.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kvq.h"

namespace {

const std::string kDir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";
constexpr const char* kPrompt = "Once upon a time";

kvq_model* LoadBundled(int64_t context = 0) {
  kvq_model_options o;
  kvq_model_options_init(&o);
  const std::string tok = kDir + "tok512.bin";
  o.tokenizer_path = tok.c_str();
  o.threads = 1;
  o.context = context;
  kvq_model* m = kvq_model_load((kDir + "stories260K.bin").c_str(), &o);
  EXPECT_NE(m, nullptr) << kvq_last_error();
  return m;
}

// What a completion gave a C caller.
struct Completion {
  std::vector<int32_t> tokens;  // kept tokens
  std::string streamed;         // the text of every step (or callback), concatenated
  std::string text;             // the whole text
  int finish = -1;
};

Completion ThroughGenerate(kvq_model* m, const kvq_generate_options& go) {
  Completion r;
  kvq_session* s = kvq_session_new(m, nullptr);
  EXPECT_NE(s, nullptr) << kvq_last_error();
  auto collect = [](int32_t token, const char* piece, void* user) {
    Completion& run = *static_cast<Completion*>(user);
    run.tokens.push_back(token);
    run.streamed += piece;
    return 1;
  };
  EXPECT_EQ(kvq_session_generate(s, kPrompt, &go, collect, &r, nullptr), KVQ_OK) << kvq_last_error();
  r.text = r.streamed;
  r.finish = kvq_session_finish_reason(s);
  kvq_session_free(s);
  return r;
}

int32_t Argmax(const float* logits, int64_t n) { return static_cast<int32_t>(std::max_element(logits, logits + n) - logits); }

// The caller's loop: prefill, then greedy sample → kvq_generator_next → decode while it says run.
// `sequence` makes the generator with kvq_generator_new_for_sequence instead of from the session.
Completion ThroughGenerator(kvq_model* m, const kvq_generate_options& go, bool sequence) {
  Completion r;
  kvq_model_info info;
  kvq_model_info_init(&info);
  EXPECT_EQ(kvq_model_get_info(m, &info), KVQ_OK);
  kvq_session* s = kvq_session_new(m, nullptr);
  int32_t ids[32];
  const int64_t n = kvq_tokenize(m, kPrompt, -1, ids, 32);
  EXPECT_EQ(kvq_session_prefill(s, ids, n), KVQ_OK) << kvq_last_error();
  kvq_generator* g = sequence ? kvq_generator_new_for_sequence(m, ids[n - 1], n, info.context, &go)
                              : kvq_generator_new(s, &go);
  EXPECT_NE(g, nullptr) << kvq_last_error();
  if (g == nullptr) return r;
  std::vector<float> logits(static_cast<size_t>(info.vocab_size));  // [vocab] the session's, constrained
  for (int guard = 0; guard < 10000; ++guard) {
    std::copy_n(kvq_session_logits(s), logits.size(), logits.begin());
    EXPECT_EQ(kvq_generator_constrain(g, logits.data(), info.vocab_size), KVQ_OK) << kvq_last_error();
    kvq_generator_step step{.struct_size = sizeof(kvq_generator_step)};
    const int32_t token = Argmax(logits.data(), info.vocab_size);
    EXPECT_EQ(kvq_generator_next(g, token, &step), KVQ_OK) << kvq_last_error();
    EXPECT_EQ(std::string(step.text).size(), static_cast<size_t>(step.text_bytes));
    r.streamed += step.text;
    if (step.kept) r.tokens.push_back(token);
    if (step.finished) {
      r.finish = step.finish_reason;
      break;
    }
    EXPECT_EQ(step.finish_reason, -1);
    if (step.run) {
      EXPECT_EQ(kvq_session_decode(s, token), KVQ_OK) << kvq_last_error();
    }
  }
  int64_t bytes = -1;
  const char* text = kvq_generator_text(g, &bytes);
  r.text.assign(text, static_cast<size_t>(bytes));
  std::vector<int32_t> kept(static_cast<size_t>(kvq_generator_tokens(g, nullptr, 0)));
  EXPECT_EQ(kvq_generator_tokens(g, kept.data(), static_cast<int64_t>(kept.size())),
            static_cast<int64_t>(kept.size()));
  EXPECT_EQ(kept, r.tokens);
  kvq_generator_free(g);
  kvq_session_free(s);
  return r;
}

void ExpectSame(const Completion& want, const Completion& got) {
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.streamed, want.streamed);
  EXPECT_EQ(got.text, want.text);
  EXPECT_EQ(got.finish, want.finish);
}

TEST(CApiGenerator, AHandLoopEqualsGenerateForEveryWayACompletionEnds) {
  kvq_model* m = LoadBundled();
  ASSERT_NE(m, nullptr);
  kvq_generate_options go;
  kvq_generate_options_init(&go);
  go.temperature = 0;
  go.max_tokens = 40;
  const Completion length = ThroughGenerate(m, go);
  ASSERT_EQ(length.finish, KVQ_FINISH_LENGTH);
  ASSERT_EQ(length.tokens.size(), 40u);
  for (bool sequence : {false, true}) ExpectSame(length, ThroughGenerator(m, go, sequence));

  // A stop string taken from the middle of the greedy text.
  const size_t cut = length.text.find(' ', 10);
  ASSERT_NE(cut, std::string::npos) << length.text;
  const std::string stop = length.text.substr(cut, 4);
  const char* stops[] = {stop.c_str()};
  go.stop = stops;
  go.n_stop = 1;
  const Completion stopped = ThroughGenerate(m, go);
  ASSERT_EQ(stopped.finish, KVQ_FINISH_STOP);
  ASSERT_EQ(stopped.text, length.text.substr(0, length.text.find(stop)));
  for (bool sequence : {false, true}) ExpectSame(stopped, ThroughGenerator(m, go, sequence));
  go.stop = nullptr;
  go.n_stop = 0;

  // Until the end token (stories260K ends its stories) or the context.
  go.max_tokens = -1;
  const Completion open = ThroughGenerate(m, go);
  ASSERT_NE(open.finish, KVQ_FINISH_LENGTH);
  for (bool sequence : {false, true}) ExpectSame(open, ThroughGenerator(m, go, sequence));
  kvq_model_free(m);

  // A context of 24 positions fills first.
  kvq_model* small = LoadBundled(24);
  ASSERT_NE(small, nullptr);
  go.ignore_eos = 1;
  const Completion full = ThroughGenerate(small, go);
  ASSERT_EQ(full.finish, KVQ_FINISH_CONTEXT);
  for (bool sequence : {false, true}) ExpectSame(full, ThroughGenerator(small, go, sequence));
  kvq_model_free(small);
}

TEST(CApiGenerator, AGrammarAppliedThroughConstrainEqualsGenerateWithIt) {
  kvq_model* m = LoadBundled();
  ASSERT_NE(m, nullptr);
  kvq_generate_options go;
  kvq_generate_options_init(&go);
  go.temperature = 0;
  go.max_tokens = 30;
  go.grammar = "root ::= \"The \" [a-z]+ (\" \" [a-z]+)* \".\"";
  const Completion want = ThroughGenerate(m, go);
  ASSERT_EQ(want.text.rfind("The ", 0), 0u) << want.text;
  const Completion plain = [&] {
    kvq_generate_options p = go;
    p.grammar = nullptr;
    return ThroughGenerate(m, p);
  }();
  EXPECT_NE(want.tokens, plain.tokens);  // the grammar changed the greedy text
  for (bool sequence : {false, true}) ExpectSame(want, ThroughGenerator(m, go, sequence));
  kvq_model_free(m);
}

TEST(CApiGenerator, BadArgumentsAreErrorsThatSayWhatIsWrong) {
  kvq_model* m = LoadBundled();
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(kvq_generator_new(nullptr, nullptr), nullptr);
  EXPECT_NE(std::string(kvq_last_error()).find("session is NULL"), std::string::npos) << kvq_last_error();
  kvq_session* s = kvq_session_new(m, nullptr);
  EXPECT_EQ(kvq_generator_new(s, nullptr), nullptr);  // holds no tokens yet
  EXPECT_NE(std::string(kvq_last_error()).find("kvq_generator_new"), std::string::npos) << kvq_last_error();
  EXPECT_EQ(kvq_generator_new_for_sequence(m, 512, 1, 10, nullptr), nullptr);
  EXPECT_NE(std::string(kvq_last_error()).find("vocabulary"), std::string::npos) << kvq_last_error();
  EXPECT_EQ(kvq_generator_new_for_sequence(m, 1, 11, 10, nullptr), nullptr);
  kvq_generate_options go;
  kvq_generate_options_init(&go);
  go.grammar = "root ::= (";
  EXPECT_EQ(kvq_generator_new_for_sequence(m, 1, 1, 10, &go), nullptr);
  EXPECT_NE(std::string(kvq_last_error()).find("options->grammar"), std::string::npos) << kvq_last_error();
  kvq_generator* g = kvq_generator_new_for_sequence(m, 1, 1, 10, nullptr);
  ASSERT_NE(g, nullptr) << kvq_last_error();
  float logits[4] = {};
  EXPECT_EQ(kvq_generator_constrain(g, logits, 4), KVQ_ERROR);
  EXPECT_NE(std::string(kvq_last_error()).find("logits[512]"), std::string::npos) << kvq_last_error();
  kvq_generator_step step{.struct_size = 8};
  EXPECT_EQ(kvq_generator_next(g, 5, &step), KVQ_ERROR);
  EXPECT_NE(std::string(kvq_last_error()).find("kvq_generator_step"), std::string::npos) << kvq_last_error();
  EXPECT_EQ(kvq_generator_next(g, 5, nullptr), KVQ_ERROR);
  step.struct_size = sizeof step;
  EXPECT_EQ(kvq_generator_cancel(g, &step), KVQ_OK);
  EXPECT_EQ(step.finished, 1);
  EXPECT_EQ(step.finish_reason, KVQ_FINISH_CANCELLED);
  EXPECT_EQ(kvq_generator_tokens(g, nullptr, -1), -1);
  kvq_generator_free(g);
  kvq_generator_free(nullptr);
  kvq_session_free(s);
  kvq_model_free(m);
}

}  // namespace
