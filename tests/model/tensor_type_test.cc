// A tensor whose type kvq cannot run is refused when the model loads, not at the first token:
// the error names the file, the tensor, its type (ggml's name, or the id when ggml's table in
// kvq's reader does not know it) and the types kvq supports. The file is written with kvq's
// writer and one tensor's type id patched afterwards (the writer refuses ids it does not know).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gguf/gguf_writer.h"
#include "model/load_model.h"
#include "weights/weight_type.h"

namespace kvq {
namespace {

// Rewrites the type id in the tensor info of `name`: after the name (u64 length + bytes) come
// n_dims (u32), the dims (u64 each) and the type (u32).
void PatchTensorType(const std::string& path, const std::string& name, uint32_t type) {
  std::vector<char> bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::string key(8, '\0');
  const uint64_t n = name.size();
  std::memcpy(key.data(), &n, 8);
  key += name;
  const auto at = std::search(bytes.begin(), bytes.end(), key.begin(), key.end());
  ASSERT_NE(at, bytes.end()) << name;
  size_t pos = static_cast<size_t>(at - bytes.begin()) + key.size();
  uint32_t n_dims = 0;
  std::memcpy(&n_dims, bytes.data() + pos, 4);
  pos += 4 + 8 * size_t{n_dims};
  std::memcpy(bytes.data() + pos, &type, 4);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(TensorType, AnUnknownTypeIdIsRefusedAtLoadNamingTheTensorAndTheSupportedTypes) {
  GgufWriter w;
  ASSERT_TRUE(w.SetString("general.architecture", "llama").ok());
  const std::vector<uint8_t> floats(64 * 4, 0);
  ASSERT_TRUE(w.AddTensor("blk.0.attn_norm.weight", GgmlType::kF32, {64}, floats).ok());
  ASSERT_TRUE(w.AddTensor("blk.0.ffn_up.weight", GgmlType::kF32, {64}, floats).ok());
  const std::string path = ::testing::TempDir() + "/tensor_type_" + std::to_string(getpid()) + ".gguf";
  ASSERT_TRUE(w.Write(path).ok());
  PatchTensorType(path, "blk.0.ffn_up.weight", 99);  // no ggml type has id 99
  Result<LoadedModel> m = LoadModel(path, "");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(), "GGUF file '" + path + "': tensor 'blk.0.ffn_up.weight': has unknown ggml type id "
                                  "99 (kvq supports: " + WeightTypeLabelList() + ")");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kvq
