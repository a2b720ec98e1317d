// A llama2.c model with a small character vocabulary and no byte pieces (written here: random
// weights, dim 16, 2 layers; test_util/llama2c_runc.h) loads through LoadModel and, greedy with an
// f32 KV cache, gives token for token what run.c gives: run.c's encode and generation loop
// written out in the test over the run.c-style scalar forward (test_util/reference_forward.h).
// Every prompt's characters have pieces, so run.c's ids are well defined; a character without a
// piece is tokenizer_char_vocab_test.cc's subject.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "kvq/model.h"
#include "kvq/session.h"
#include "model/load_model.h"
#include "test_util/llama2c_runc.h"
#include "test_util/reference_forward.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

class CharVocabModel : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("kvq-char-vocab-model-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    vocab_ = test::CharacterVocab();
    shape_.vocab_size = static_cast<int32_t>(vocab_.pieces.size());
    // Seed and scale: a fixed draw whose greedy runs are varied (not one token repeated) and whose
    // top-1 margins are all far above the f32 rounding between the two forwards (asserted below).
    test::WriteLlama2cCheckpoint(model_path(), shape_, /*seed=*/4, /*scale=*/0.5f);
    test::WriteLlama2cTokenizer(tokenizer_path(), vocab_.pieces, vocab_.scores);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string model_path() const { return (dir_ / "chars.bin").string(); }
  std::string tokenizer_path() const { return (dir_ / "chars-tok.bin").string(); }

  fs::path dir_;
  test::CharVocab vocab_;
  test::Llama2cShape shape_;
};

TEST_F(CharVocabModel, GreedyOutputEqualsRunC) {
  Result<LoadedModel> loaded = LoadModel(model_path(), tokenizer_path());
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  const Tokenizer& tok = loaded->tokenizer;
  EXPECT_FALSE(tok.has_byte_pieces());
  ASSERT_EQ(tok.vocab_size(), shape_.vocab_size);
  // The same files through the public API, which generates.
  Result<std::unique_ptr<Model>> model = Model::Load(
      model_path(), {.tokenizer_path = tokenizer_path(), .threads = 2,
                     .kv = {.key_format = "f32", .value_format = "f32", .page_positions = 32}});
  ASSERT_TRUE(model.ok()) << model.status().message();

  constexpr int32_t kSteps = 40;  // run.c's -n: positions, BOS included
  int32_t generated_total = 0;
  for (const std::string prompt : {"the cat and the dog.", "in the end, were her hen ran!\nthen", "a", ""}) {
    SCOPED_TRACE("prompt \"" + prompt + "\"");
    const std::vector<int32_t> ids = test::RunCEncode(vocab_.pieces, vocab_.scores, prompt, true);
    ASSERT_EQ(tok.Encode(prompt, true), ids);

    test::ReferenceForward reference(loaded->weights);
    std::vector<float> margins;
    std::vector<int32_t> want = test::RunCGreedy(
        [&](int32_t token, int32_t pos) { return reference.Forward(token, pos); }, ids, kSteps, &margins);
    // The two forwards differ by f32 rounding only (reference_forward_test.cc bounds it by 1e-3 on
    // the bundled model's logits; these sums are shorter): a top-1 margin above twice that cannot
    // flip, so a different id below is a real difference.
    for (size_t i = 0; i < margins.size(); ++i) ASSERT_GT(margins[i], 2e-3f) << "generated token " << i;
    // kvq stops at EOS (id 2) as well as at BOS (kvq/generator.h); run.c goes on past EOS. Compare up
    // to where kvq stops.
    const auto eos = std::find(want.begin() + static_cast<int64_t>(ids.size()), want.end(), 2);
    want.erase(eos, want.end());
    generated_total += static_cast<int32_t>(want.size() - ids.size());

    Result<std::unique_ptr<Session>> session = (*model)->NewSession();
    ASSERT_TRUE(session.ok()) << session.status().message();
    Result<Completion> r = (*session)->Generate(
        prompt, {.max_tokens = kSteps + 1 - static_cast<int32_t>(ids.size()), .sampling = {.temperature = 0}});
    ASSERT_TRUE(r.ok()) << r.status().message();
    std::vector<int32_t> got = ids;
    got.insert(got.end(), r->tokens.begin(), r->tokens.end());
    EXPECT_EQ(got, want);
    std::string text;  // run.c's decode() of each generated id after its predecessor
    for (size_t i = ids.size(); i < want.size(); ++i) text += tok.Decode(want[i - 1], want[i]);
    EXPECT_EQ(r->text, text);
  }
  // The comparison is about generated tokens, not only the forced prompt.
  EXPECT_GE(generated_total, 60);
}

}  // namespace
}  // namespace kvq
