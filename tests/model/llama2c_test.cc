// llama2.c files: the bundled checkpoint and tokenizer load with the shape README states; damaged
// copies (truncated at many points, a wrong header) are refused with a message naming the file;
// the tokenizer round-trips text and uses byte pieces for what its vocabulary lacks.
#include "model/llama2c.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "text/tokenizer.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;
const std::string kDir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";

std::string CopyTruncated(const std::string& from, int64_t bytes, const std::string& name) {
  const std::string to = ::testing::TempDir() + "/" + name + std::to_string(getpid());
  std::ifstream in(from, std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(to, std::ios::binary).write(data.data(), std::min<int64_t>(bytes, data.size()));
  return to;
}

TEST(Llama2c, BundledModelShape) {
  Result<DecoderWeights> w = LoadLlama2c(kDir + "stories260K.bin");
  ASSERT_TRUE(w.ok()) << w.status().message();
  const DecoderConfig& c = w->config;
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.seq_len, 512);
  EXPECT_EQ(c.head_dim(), 8);
  EXPECT_EQ(w->classifier.data, w->token_embedding.data);  // shared classifier
}

TEST(Llama2c, TruncatedOrCorruptCheckpointsAreRefused) {
  const int64_t size = static_cast<int64_t>(fs::file_size(kDir + "stories260K.bin"));
  for (int64_t cut : {int64_t{0}, int64_t{3}, int64_t{27}, int64_t{28}, int64_t{100}, size / 2, size - 4, size - 1}) {
    const std::string path = CopyTruncated(kDir + "stories260K.bin", cut, "trunc.bin");
    Result<DecoderWeights> w = LoadLlama2c(path);
    EXPECT_FALSE(w.ok()) << "cut at " << cut;
    if (!w.ok()) {
      EXPECT_NE(w.status().message().find(path), std::string::npos) << w.status().message();
    }
    fs::remove(path);
  }
  // A header whose heads do not divide dim.
  const std::string path = CopyTruncated(kDir + "stories260K.bin", size, "badhead.bin");
  {
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    const int32_t seven = 7;
    f.seekp(12);
    f.write(reinterpret_cast<const char*>(&seven), 4);
  }
  Result<DecoderWeights> w = LoadLlama2c(path);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("heads"), std::string::npos) << w.status().message();
  fs::remove(path);
  EXPECT_FALSE(LoadLlama2c(kDir + "does-not-exist.bin").ok());
}

TEST(Tokenizer, EncodesLikeRunCAndRoundTrips) {
  Result<Tokenizer> t = Tokenizer::LoadLlama2c(kDir + "tok512.bin", 512);
  ASSERT_TRUE(t.ok()) << t.status().message();
  // run.c's ids for "Once upon a time" (golden-runc-ids.txt, after BOS).
  EXPECT_EQ(t->Encode("Once upon a time", true), (std::vector<int32_t>{1, 403, 407, 261, 378}));
  EXPECT_EQ(t->Encode("", true), (std::vector<int32_t>{1}));
  for (const std::string text : {"The cat sat.", "Lily's mom said, \"Hi!\"\nBye", "naïve café — 日本 🙂", "\x01\x7f"}) {
    const std::vector<int32_t> ids = t->Encode(text, true);
    std::string back;
    for (size_t i = 1; i < ids.size(); ++i) back += t->Decode(ids[i - 1], ids[i]);
    EXPECT_EQ(back, text);
  }
  // Characters outside the 512 pieces fall back to byte pieces (ids 3..258).
  const std::vector<int32_t> jp = t->Encode("日", false);
  EXPECT_EQ(jp.size(), 4u);  // the dummy-prefix space, then 3 UTF-8 bytes
  for (size_t i = 1; i < jp.size(); ++i) EXPECT_LT(jp[i], 259);
}

TEST(Tokenizer, DamagedFilesAreRefused) {
  const int64_t size = static_cast<int64_t>(fs::file_size(kDir + "tok512.bin"));
  for (int64_t cut : {int64_t{0}, int64_t{2}, int64_t{10}, size / 2, size - 1}) {
    const std::string path = CopyTruncated(kDir + "tok512.bin", cut, "tok.bin");
    Result<Tokenizer> t = Tokenizer::LoadLlama2c(path, 512);
    EXPECT_FALSE(t.ok()) << "cut at " << cut;
    if (!t.ok()) {
      EXPECT_NE(t.status().message().find(path), std::string::npos);
    }
    fs::remove(path);
  }
  EXPECT_FALSE(Tokenizer::LoadLlama2c(kDir + "tok512.bin", 600).ok());  // wrong vocabulary size
}

}  // namespace
}  // namespace kvq
