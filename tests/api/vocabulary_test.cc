// kvq::Vocabulary (kvq/vocabulary.h): a vocabulary opened on its own answers exactly as the
// loaded Model over the same file does (every token's piece and text, ids and text of a few
// strings); a vocabulary-only GGUF, which Model::Load cannot read, gives llama.cpp's known ids;
// errors name the file.
#include "kvq/vocabulary.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kvq/model.h"

namespace kvq {
namespace {

const std::string kStoriesGguf = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/stories260K.gguf";
const std::string kGpt2Vocab = std::string(KVQ_SOURCE_DIR) + "/tests/testdata/vocab/ggml-vocab-gpt-2.gguf";

TEST(Vocabulary, AnswersAsTheModelOverTheSameFile) {
  Result<std::unique_ptr<Vocabulary>> v = Vocabulary::OpenGguf(kStoriesGguf);
  ASSERT_TRUE(v.ok()) << v.status().message();
  Result<std::unique_ptr<Model>> m = Model::Load(kStoriesGguf, {.threads = 1});
  ASSERT_TRUE(m.ok()) << m.status().message();
  const Vocabulary& vocab = **v;
  const Model& model = **m;
  ASSERT_EQ(vocab.size(), model.info().vocab_size);
  EXPECT_EQ(vocab.Description(), "SentencePiece");
  int byte_tokens = 0;
  for (int32_t t = 0; t < vocab.size(); ++t) {
    EXPECT_EQ(vocab.TokenPiece(t), model.TokenPiece(t)) << t;
    for (const int32_t previous : {0, 1, 2}) EXPECT_EQ(vocab.TokenText(previous, t), model.TokenText(previous, t)) << t;
    if (vocab.IsByteToken(t)) {
      ++byte_tokens;
      const std::vector<int32_t> one = {t};
      Result<std::string> text = vocab.Detokenize(one);
      ASSERT_TRUE(text.ok());
      EXPECT_EQ(text->size(), 1u) << t;  // a byte piece's text is its byte
    }
  }
  EXPECT_EQ(byte_tokens, 256);  // llama2.c's SentencePiece vocabularies carry <0x00>..<0xFF>
  EXPECT_FALSE(vocab.IsByteToken(-1));
  EXPECT_FALSE(vocab.IsByteToken(vocab.size()));
  for (const std::string text : {"Once upon a time", " two  spaces\nand a line", "caf\xC3\xA9 \xF0\x9F\x98\x80"}) {
    for (const AddBos bos : {AddBos::kModelDefault, AddBos::kYes, AddBos::kNo}) {
      const std::vector<int32_t> ids = vocab.Tokenize(text, bos);
      EXPECT_EQ(ids, model.Tokenize(text, bos)) << text;
      Result<std::string> back = vocab.Detokenize(ids);
      Result<std::string> model_back = model.Detokenize(ids);
      ASSERT_TRUE(back.ok() && model_back.ok());
      EXPECT_EQ(*back, *model_back);
    }
  }
  const std::vector<int32_t> out_of_range = {1, vocab.size()};
  Result<std::string> bad = vocab.Detokenize(out_of_range);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), model.Detokenize(out_of_range).status().message());
}

TEST(Vocabulary, OpensAVocabularyOnlyGguf) {
  // The first case of llama.cpp's test-tokenizer-0 files for GPT-2 (ggml-vocab-gpt-2.gguf.inp
  // and .out): "ied 4 ½ months" -> 798 604 25208 1933. No weights: Model::Load refuses the file.
  Result<std::unique_ptr<Vocabulary>> v = Vocabulary::OpenGguf(kGpt2Vocab);
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ((*v)->Tokenize("ied 4 \xC2\xBD months", AddBos::kNo), (std::vector<int32_t>{798, 604, 25208, 1933}));
  EXPECT_EQ((*v)->Description(), "byte-level BPE, pre-tokenizer gpt-2");
  EXPECT_FALSE(Model::Load(kGpt2Vocab).ok());
}

TEST(Vocabulary, ErrorsNameTheFile) {
  const std::string missing = testing::TempDir() + "/no_such_vocabulary.gguf";
  Result<std::unique_ptr<Vocabulary>> v = Vocabulary::OpenGguf(missing);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find(missing), std::string::npos) << v.status().message();
  Result<std::unique_ptr<Vocabulary>> json = Vocabulary::OpenHfTokenizerJson(testing::TempDir() + "/no_tokenizer.json");
  ASSERT_FALSE(json.ok());
  EXPECT_NE(json.status().message().find("no_tokenizer.json"), std::string::npos) << json.status().message();
}

}  // namespace
}  // namespace kvq
