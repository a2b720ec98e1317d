// GGUF Llama models written here with kvq's own writer: a tiny random-weight model loads and runs;
// metadata that disagrees with a tensor's shape, a missing tensor, an unsupported tensor type and
// another architecture are refused with messages naming the file and the tensor or key.
#include "model/gguf_llama.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "gguf/gguf_writer.h"
#include "model/decoder.h"
#include "weights/weight_type.h"

namespace kvq {
namespace {

constexpr int kDim = 32, kHidden = 48, kLayers = 2, kHeads = 4, kKvHeads = 2, kVocab = 40;

std::vector<uint8_t> RandomF32(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.2f);
  std::vector<uint8_t> bytes(n * 4);
  for (int64_t i = 0; i < n; ++i) {
    const float v = dist(rng);
    std::memcpy(bytes.data() + 4 * i, &v, 4);
  }
  return bytes;
}

// Writes a tiny llama GGUF; `metadata_edit` may set keys first (they win over the defaults).
std::string WriteTinyModel(const std::string& name, const std::function<void(GgufWriter&)>& metadata_edit = {},
                           const std::string& skip_tensor = "", const std::string& bad_shape_tensor = "",
                           const std::string& foreign_tensor = "") {
  GgufWriter w;
  // The edit goes first; the defaults below then fail for the keys it set (duplicates are refused).
  if (metadata_edit) metadata_edit(w);
  (void)w.SetString("general.architecture", "llama");
  (void)w.SetU32("llama.embedding_length", kDim);
  (void)w.SetU32("llama.feed_forward_length", kHidden);
  (void)w.SetU32("llama.block_count", kLayers);
  (void)w.SetU32("llama.attention.head_count", kHeads);
  (void)w.SetU32("llama.attention.head_count_kv", kKvHeads);
  (void)w.SetU32("llama.context_length", 64);
  uint32_t seed = 1;
  auto add = [&](const std::string& t, std::vector<int64_t> dims) {
    if (t == skip_tensor) return;
    if (t == bad_shape_tensor) dims[0] += 1;
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    if (t == foreign_tensor) {  // a ggml type kvq has no kernels for: n / 32 blocks of 18 bytes
      EXPECT_TRUE(w.AddTensor(t, GgmlType::kIQ4_NL, dims, std::vector<uint8_t>(n / 32 * 18, 0x11)).ok()) << t;
      return;
    }
    EXPECT_TRUE(w.AddTensor(t, GgmlType::kF32, dims, RandomF32(n, seed++)).ok()) << t;
  };
  const int kv = kDim / kHeads * kKvHeads;
  add("token_embd.weight", {kDim, kVocab});
  for (int l = 0; l < kLayers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    add(b + "attn_norm.weight", {kDim});
    add(b + "attn_q.weight", {kDim, kDim});
    add(b + "attn_k.weight", {kDim, kv});
    add(b + "attn_v.weight", {kDim, kv});
    add(b + "attn_output.weight", {kDim, kDim});
    add(b + "ffn_norm.weight", {kDim});
    add(b + "ffn_gate.weight", {kDim, kHidden});
    add(b + "ffn_down.weight", {kHidden, kDim});
    add(b + "ffn_up.weight", {kDim, kHidden});
  }
  add("output_norm.weight", {kDim});
  const std::string path = ::testing::TempDir() + "/" + name + "_" + std::to_string(getpid()) + ".gguf";
  EXPECT_TRUE(w.Write(path).ok());
  return path;
}

Result<DecoderWeights> Load(const std::string& path) {
  Result<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
  if (!f.ok()) return f.status();
  return LoadGgufLlama(std::shared_ptr<GgufFile>(std::move(f).value()));
}

TEST(GgufLlama, TinyModelLoadsAndRuns) {
  const std::string path = WriteTinyModel("tiny");
  Result<DecoderWeights> w = Load(path);
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(w->config.vocab_size, kVocab);
  EXPECT_EQ(w->config.n_kv_heads, kKvHeads);
  EXPECT_EQ(w->classifier.data, w->token_embedding.data);  // no output.weight: tied
  const FormatDesc* f16 = *FindFormat("f16");
  auto cache = KvCache::Create({.n_layers = kLayers, .n_kv_heads = kKvHeads, .head_dim = kDim / kHeads,
                                .layers = {{f16, f16}}, .max_positions = 64, .page_positions = 32});
  ASSERT_TRUE(cache.ok());
  DecoderModel model(std::move(w).value(), 1);
  std::vector<float> logits(kVocab);
  for (int pos = 0; pos < 5; ++pos) ASSERT_TRUE(model.Forward(pos % kVocab, pos, **cache, logits.data()).ok());
  for (float x : logits) EXPECT_TRUE(std::isfinite(x));
  std::remove(path.c_str());
}

TEST(GgufLlama, DisagreementsAreRefusedByName) {
  const struct {
    std::string path;
    const char* must_mention;
  } cases[] = {
      {WriteTinyModel("shape", {}, "", "blk.1.attn_k.weight"), "blk.1.attn_k.weight"},
      {WriteTinyModel("missing", {}, "blk.0.ffn_up.weight"), "blk.0.ffn_up.weight"},
      {WriteTinyModel("arch", [](GgufWriter& w) { (void)w.SetString("general.architecture", "qwen2"); }), "qwen2"},
      {WriteTinyModel("heads", [](GgufWriter& w) { (void)w.SetU32("llama.attention.head_count_kv", 3); }), "heads"},
      {WriteTinyModel("nokey", [](GgufWriter& w) { (void)w.SetU32("llama.block_count", 0); }), "llama.block_count"},
  };
  for (const auto& c : cases) {
    Result<DecoderWeights> w = Load(c.path);
    ASSERT_FALSE(w.ok()) << c.must_mention;
    EXPECT_NE(w.status().message().find(c.must_mention), std::string::npos) << w.status().message();
    EXPECT_NE(w.status().message().find(c.path), std::string::npos) << w.status().message();
    std::remove(c.path.c_str());
  }
}

// A tensor of a type outside the weight-type registry: the error names the file, the tensor, the
// type and its GGUF id, and lists the registry's types.
TEST(GgufLlama, TensorTypeOutsideTheRegistryIsRefusedByName) {
  const std::string path = WriteTinyModel("iq4_nl", {}, "", "", "blk.1.ffn_up.weight");
  Result<DecoderWeights> w = Load(path);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().message(),
            path + ": tensor 'blk.1.ffn_up.weight' has type IQ4_NL (GGUF type id 20), which kvq does not support "
                   "(supported: " + WeightTypeLabelList() + ")");
  // The labels in registry order (types registered later follow these).
  EXPECT_EQ(WeightTypeLabelList().rfind("F32, F16, BF16, Q8_0, Q4_0", 0), 0u) << WeightTypeLabelList();
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kvq
