// A GGUF file's header alone (the page's GPU path reads the weights from the file itself, so the
// WebAssembly heap never holds them): GgufFile::HeaderBytes finds the header's length from a
// prefix, OpenHeader reads that header with every tensor placed as Open places it but without
// bytes, and a model loaded from it has its shape and vocabulary but refuses the CPU forward.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "api/api_internal.h"
#include "gguf/gguf_reader.h"
#include "model/load_model.h"
#include "test_util/file_bytes.h"
#include "test_util/bundled_paths.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

const std::string kStories = test::BundledGgufPath();

// The first `n` bytes of `bytes` written to a file in a fresh directory; its path.
std::string WritePrefix(const Bytes& bytes, size_t n, const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("kvq_gguf_header_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(n));
  return path;
}

TEST(GgufHeader, HeaderBytesIsTheDataOffsetOnceThePrefixHoldsTheHeader) {
  const Bytes file = test::ReadFileBytes(kStories);
  ASSERT_GT(file.size(), 0u);
  auto whole = GgufFile::Open(kStories);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  const int64_t data = (*whole)->data_offset();
  const auto size = static_cast<int64_t>(file.size());
  // Every prefix that ends inside the header asks for more; from the header's end on (the tensor
  // table's last byte, before the alignment padding) the answer is the data section's offset.
  int64_t first_known = -1;
  for (int64_t n = 0; n <= data; ++n) {
    Result<int64_t> h = GgufFile::HeaderBytes(std::span<const uint8_t>(file.data(), static_cast<size_t>(n)), size,
                                              "stories");
    ASSERT_TRUE(h.ok()) << n << ": " << h.status().message();
    if (*h != 0) {
      EXPECT_EQ(*h, data) << n;
      if (first_known < 0) first_known = n;
    } else {
      EXPECT_LT(first_known, 0) << "a longer prefix asked for more after a shorter one was enough: " << n;
    }
  }
  EXPECT_GT(first_known, data - static_cast<int64_t>((*whole)->alignment())) << "the header ends before its padding";
  Result<int64_t> all = GgufFile::HeaderBytes(file, size, "stories");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, data);
}

TEST(GgufHeader, HeaderBytesNamesADamagedFileOnceAllOfItIsGiven) {
  Bytes file = test::ReadFileBytes(kStories);
  file[0] = 'X';
  const auto size = static_cast<int64_t>(file.size());
  Result<int64_t> part = GgufFile::HeaderBytes(std::span<const uint8_t>(file.data(), 1024), size, "bad.gguf");
  ASSERT_TRUE(part.ok());
  EXPECT_EQ(*part, 0);  // a part of a file: read more
  Result<int64_t> all = GgufFile::HeaderBytes(file, size, "bad.gguf");
  ASSERT_FALSE(all.ok());
  EXPECT_NE(all.status().message().find("'bad.gguf' is not a GGUF file"), std::string::npos) << all.status().message();
  // A prefix longer than the file it is said to start.
  EXPECT_FALSE(GgufFile::HeaderBytes(file, size - 1, "bad.gguf").ok());
}

TEST(GgufHeader, OpenHeaderPlacesEveryTensorAsOpenWithoutItsBytes) {
  const Bytes file = test::ReadFileBytes(kStories);
  auto whole = GgufFile::Open(kStories);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  const int64_t data = (*whole)->data_offset();
  const std::string path = WritePrefix(file, static_cast<size_t>(data), "stories_header.gguf");
  auto header = GgufFile::OpenHeader(path, static_cast<int64_t>(file.size()));
  ASSERT_TRUE(header.ok()) << header.status().message();
  EXPECT_TRUE((*header)->header_only());
  EXPECT_FALSE((*whole)->header_only());
  EXPECT_EQ((*header)->file_bytes(), static_cast<int64_t>(file.size()));
  EXPECT_EQ((*header)->data_offset(), data);
  ASSERT_EQ((*header)->tensors().size(), (*whole)->tensors().size());
  for (size_t i = 0; i < (*whole)->tensors().size(); ++i) {
    const GgufTensor& h = (*header)->tensors()[i];
    const GgufTensor& w = (*whole)->tensors()[i];
    EXPECT_EQ(h.name, w.name);
    EXPECT_EQ(h.offset, w.offset) << h.name;
    EXPECT_EQ(h.n_bytes, w.n_bytes) << h.name;
    EXPECT_EQ(h.data, nullptr) << h.name;
  }
  EXPECT_EQ(*(*header)->GetU32("llama.block_count"), 5u);
  // Tensor extents are checked against the whole file's size as Open checks them.
  auto short_file = GgufFile::OpenHeader(path, static_cast<int64_t>(file.size()) - 4);
  ASSERT_FALSE(short_file.ok());
  EXPECT_NE(short_file.status().message().find("extends past the end of the file"), std::string::npos)
      << short_file.status().message();
  fs::remove_all(fs::path(path).parent_path());
}

TEST(GgufHeader, AModelFromItsHeaderHasItsShapeAndVocabularyAndRefusesTheCpuForward) {
  const Bytes file = test::ReadFileBytes(kStories);
  auto whole = GgufFile::Open(kStories);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  const std::string path = WritePrefix(file, static_cast<size_t>((*whole)->data_offset()), "stories_header.gguf");
  Result<std::unique_ptr<Model>> full = Model::Load(kStories, {.threads = 1});
  ASSERT_TRUE(full.ok()) << full.status().message();
  Result<std::unique_ptr<Model>> head = Model::Impl::Load(path, {.threads = 1}, static_cast<int64_t>(file.size()));
  ASSERT_TRUE(head.ok()) << head.status().message();
  EXPECT_TRUE((*head)->impl().header_only);
  EXPECT_FALSE((*full)->impl().header_only);
  const ModelInfo& h = (*head)->info();
  const ModelInfo& f = (*full)->info();
  EXPECT_EQ(h.n_layers, f.n_layers);
  EXPECT_EQ(h.dim, f.dim);
  EXPECT_EQ(h.vocab_size, f.vocab_size);
  EXPECT_EQ(h.parameters, f.parameters);
  EXPECT_EQ(h.weight_types, f.weight_types);
  EXPECT_EQ((*head)->Tokenize("Once upon a time", AddBos::kYes), (*full)->Tokenize("Once upon a time", AddBos::kYes));
  // No matrix has bytes, none was repacked.
  const DecoderWeights& w = (*head)->impl().weights;
  EXPECT_EQ(w.token_embedding.data, nullptr);
  EXPECT_EQ(w.layers[0].wq.data, nullptr);
  EXPECT_EQ(w.layers[0].wq.layout, MatrixLayout::kRowMajor);
  EXPECT_EQ(w.final_norm, nullptr);
  Result<std::unique_ptr<Session>> session = (*head)->NewSession();
  ASSERT_FALSE(session.ok());
  EXPECT_NE(session.status().message().find("loaded from its header alone"), std::string::npos)
      << session.status().message();
  EXPECT_TRUE((*full)->NewSession().ok());
  fs::remove_all(fs::path(path).parent_path());
}

}  // namespace
}  // namespace kvq
