// The bonsai-1.7b preset end to end (issue 12): kvq synth writes a file of the real Bonsai-1.7B
// Q1_0 GGUF's shape (28 qwen3 layers, every matrix Q1_0; the byte arithmetic is in
// synth_qwen3_test.cc and docs/weight-types.md), kvq loads it and runs tokens through it, and
// truncations and corruptions of that file are refused at load with the file named. One file of
// ~236 MiB is written once and cut and patched in place, from the largest cut down.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kvq/kv_cache.h"
#include "kvq/format.h"
#include "gguf/gguf_reader.h"
#include "model/decoder.h"
#include "model/load_model.h"
#include "synth/synth.h"
#include "test_util/bundled_paths.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

const std::string kStories = test::BundledGgufPath();

// Overwrites `n` bytes at `at` of `path` and returns what was there.
std::vector<char> Patch(const std::string& path, int64_t at, const std::vector<char>& bytes) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  std::vector<char> old(bytes.size());
  f.seekg(at);
  f.read(old.data(), static_cast<std::streamsize>(old.size()));
  f.seekp(at);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return old;
}

// The offset of the first occurrence of `needle` in the file's first `limit` bytes, or −1.
int64_t Find(const std::string& path, const std::string& needle, int64_t limit) {
  std::ifstream f(path, std::ios::binary);
  std::string head(limit, '\0');
  f.read(head.data(), limit);
  const size_t at = head.find(needle);
  return at == std::string::npos ? -1 : static_cast<int64_t>(at);
}

TEST(SynthBonsai, TheFileRunsAndItsTruncationsAndCorruptionsAreRefusedNamingIt) {
  const std::string path = ::testing::TempDir() + fmt::format("/kvq_bonsai_{}.gguf", getpid());
  Result<SynthSpec> preset = SynthPreset("bonsai-1.7b");
  ASSERT_TRUE(preset.ok()) << preset.status().message();
  SynthSpec spec = *preset;
  spec.threads = 2;
  ASSERT_TRUE(WriteSynthModel(spec, kStories, path).ok());
  int64_t data_offset = 0, first_matrix_bytes = 0;
  {
    auto f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status().message();
    EXPECT_EQ(*(*f)->GetString("general.architecture"), "qwen3");
    int64_t q1_0_bytes = 0, n_q1_0 = 0;
    for (const GgufTensor& t : (*f)->tensors()) {
      if (t.dims.size() == 2) {
        EXPECT_EQ(t.type, GgmlType::kQ1_0) << t.name;
        q1_0_bytes += t.n_bytes;
        ++n_q1_0;
      }
    }
    EXPECT_EQ(n_q1_0, 1 + 28 * 7);  // tied embeddings: token_embd and 7 matrices per layer
    EXPECT_EQ(q1_0_bytes, 1720451072 / 128 * 18);
    data_offset = (*f)->data_offset();
    first_matrix_bytes = (*f)->tensors()[0].n_bytes;
  }
  const int64_t size = static_cast<int64_t>(fs::file_size(path));
  {
    // kvq runs it: the qwen3 forward over Q1_0 weights (embedding rows included), finite logits.
    Result<LoadedModel> loaded = LoadModel(path, "");
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    const DecoderConfig c = loaded->weights.config;
    EXPECT_EQ(c.head_dim(), 128);
    EXPECT_EQ(c.vocab_size, 151936);
    DecoderModel m(std::move(loaded->weights), 2);
    const FormatDesc* f16 = *FindFormat("f16");
    auto cache = KvCache::Create({.n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim(),
                                  .layers = {{f16, f16}}, .max_positions = 32, .page_positions = 32});
    ASSERT_TRUE(cache.ok()) << cache.status().message();
    std::vector<float> logits(c.vocab_size);  // [vocab]
    for (int pos = 0; pos < 3; ++pos) {
      ASSERT_TRUE(m.Forward(1000 + 40000 * pos, pos, **cache, logits.data()).ok());
    }
    for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  }
  auto expect_refused = [&](const std::string& what) {
    Result<LoadedModel> m = LoadModel(path, "");
    ASSERT_FALSE(m.ok()) << what;
    EXPECT_NE(m.status().message().find(path), std::string::npos) << what << ": " << m.status().message();
  };
  // Corruptions, each undone before the next: the magic; the first tensor's type id (Q1_0 = 41
  // -> 99, an id no ggml has; -> Q4_0 = 2, whose size would overrun the data); a key's value type.
  {
    std::vector<char> old = Patch(path, 0, {'G', 'G', 'U', 'X'});
    expect_refused("magic GGUX");
    Patch(path, 0, old);
  }
  const int64_t name_at = Find(path, "token_embd.weight", data_offset);
  ASSERT_GT(name_at, 0);
  const int64_t type_at = name_at + 17 + 4 + 2 * 8;  // name, n_dims (u32), two dims (u64), type
  {
    std::vector<char> type_bytes = Patch(path, type_at, {99, 0, 0, 0});
    ASSERT_EQ(type_bytes, (std::vector<char>{41, 0, 0, 0})) << "the layout assumed for the tensor info";
    expect_refused("tensor type 99");
    Patch(path, type_at, {2, 0, 0, 0});
    expect_refused("tensor type Q4_0");
    Patch(path, type_at, type_bytes);
  }
  ASSERT_TRUE(LoadModel(path, "").ok()) << "the patches were undone";
  // Truncations, largest first (each cut in place): one byte short, inside the last tensor, in
  // the middle, inside the first tensor, in the header.
  for (int64_t cut : {size - 1, size - 1000000, size / 2, data_offset + first_matrix_bytes / 2, data_offset / 2,
                      int64_t{100}}) {
    fs::resize_file(path, cut);
    expect_refused(fmt::format("truncated at {} of {}", cut, size));
  }
  fs::remove(path);
}

}  // namespace
}  // namespace kvq
