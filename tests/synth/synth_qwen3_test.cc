// kvq synth for qwen3: the qwen3-0.6b and Bonsai presets (published shapes, parameter counts,
// the tensor table and byte arithmetic of bonsai-1.7b without writing its 231 MiB), a tiny qwen3
// file's tensors and keys (q/k norms, key_length) loaded and run by kvq, and the K-quant mixes
// end to end.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "gguf/gguf_reader.h"
#include "kvq/model.h"
#include "model/decoder.h"
#include "model/load_model.h"
#include "synth/synth.h"
#include "synth/synth_weight_type.h"
#include "weights/weight_type.h"
#include "test_util/bundled_paths.h"

namespace kvq {
namespace {

const std::string kStories = test::BundledGgufPath();

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/synth_qwen3_" + std::to_string(getpid()) + "_" + name;
}

// Parameters of a qwen3 shape, counted here from the architecture: per layer two norms [dim],
// q [dim, heads·hd], k and v [dim, kv·hd], output [heads·hd, dim], three FFN matrices, and the
// q/k norms [hd]; tied embeddings once; the final norm.
int64_t Qwen3Parameters(int64_t dim, int64_t layers, int64_t heads, int64_t kv, int64_t hd, int64_t ffn,
                        int64_t vocab) {
  const int64_t layer = 2 * dim + 2 * dim * heads * hd + 2 * dim * kv * hd + 3 * dim * ffn + 2 * hd;
  return vocab * dim + layers * layer + dim;
}

TEST(SynthQwen3Presets, PublishedShapes) {
  const struct {
    const char* preset;
    int64_t dim, ffn, context;
    const char* type;
    int64_t parameters;  // Qwen3Parameters: 0.60 B ("0.6B", 0.44 B without embeddings) and 1.72 B
  } want[] = {
      {"qwen3-0.6b", 1024, 3072, 40960, "q4_0", 596049920},
      {"bonsai-1.7b", 2048, 6144, 32768, "q1_0", 1720574976},
      {"bonsai-ternary-1.7b", 2048, 6144, 32768, "q2_0", 1720574976},
  };
  for (const auto& w : want) {
    SCOPED_TRACE(w.preset);
    Result<SynthSpec> s = SynthPreset(w.preset);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->arch, SynthArch::kQwen3);
    EXPECT_EQ(s->dim, w.dim);
    EXPECT_EQ(s->n_layers, 28);
    EXPECT_EQ(s->n_heads, 16);
    EXPECT_EQ(s->kv_heads(), 8);
    EXPECT_EQ(s->head_dim(), 128);
    EXPECT_EQ(s->hidden_dim, w.ffn);
    EXPECT_EQ(s->vocab_size, 151936);
    EXPECT_EQ(s->context, w.context);
    EXPECT_EQ(s->rope_theta, 1000000.0f);
    EXPECT_EQ(s->norm_eps, 1e-6f);
    EXPECT_EQ(s->embeddings, SynthEmbeddings::kTied);
    EXPECT_FALSE(s->qkv_bias);
    EXPECT_EQ(s->type, w.type);
    EXPECT_EQ(Qwen3Parameters(w.dim, 28, 16, 8, 128, w.ffn, 151936), w.parameters);
    EXPECT_EQ(SynthParameterCount(*s), w.parameters);
  }
}

// bonsai-1.7b's tensor table: 1 + 28 · 11 + 1 tensors (tied: no output.weight). Q1_0 stores 128
// weights in 18 bytes (f16 d, 16 bytes of signs), Q2_0 64 in 18 (f16 d, 16 bytes of 2-bit codes);
// the vectors are F32. Every size is a multiple of GGUF's 32-byte alignment, so the data section
// is their sum: Q1_0 242,434,048 bytes (231.2 MiB, the 0.24 GB of the model card), Q2_0
// 484,372,480.
TEST(SynthQwen3Presets, BonsaiTensorTableAndBytes) {
  SynthSpec shape = *SynthPreset("bonsai-1.7b");
  shape.type = "q8_0";  // the same table in a type registered today, for the shapes
  Result<std::vector<SynthTensorPlan>> plan = PlanSynthTensors(shape);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_EQ(plan->size(), 1u + 28 * 11 + 1);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> first = {
      {"token_embd.weight", {2048, 151936}},    {"blk.0.attn_norm.weight", {2048}},
      {"blk.0.attn_q.weight", {2048, 2048}},    {"blk.0.attn_q_norm.weight", {128}},
      {"blk.0.attn_k.weight", {2048, 1024}},    {"blk.0.attn_k_norm.weight", {128}},
      {"blk.0.attn_v.weight", {2048, 1024}},    {"blk.0.attn_output.weight", {2048, 2048}},
      {"blk.0.ffn_norm.weight", {2048}},        {"blk.0.ffn_gate.weight", {2048, 6144}},
      {"blk.0.ffn_up.weight", {2048, 6144}},    {"blk.0.ffn_down.weight", {6144, 2048}}};
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ((*plan)[i].name, first[i].first);
    EXPECT_EQ((*plan)[i].dims, first[i].second) << first[i].first;
  }
  EXPECT_EQ(plan->back().name, "output_norm.weight");
  int64_t matrix_weights = 0, vector_bytes = 0;
  for (const SynthTensorPlan& t : *plan) {
    if (t.dims.size() == 2) {
      matrix_weights += t.dims[0] * t.dims[1];
      EXPECT_EQ(t.type, "q8_0") << t.name;
    } else {
      vector_bytes += t.dims[0] * 4;
      EXPECT_EQ(t.type, "f32") << t.name;
    }
  }
  // Per layer 50,331,648 matrix weights (q 4,194,304, k and v 2,097,152 each, output 4,194,304,
  // FFN 3 · 12,582,912), plus token_embd 311,164,928.
  EXPECT_EQ(matrix_weights, 28 * int64_t{50331648} + 311164928);
  EXPECT_EQ(vector_bytes, 28 * (2 * 2048 + 2 * 128) * 4 + 2048 * 4);
  const int64_t q1_0_bytes = matrix_weights / 128 * 18 + vector_bytes;
  const int64_t q2_0_bytes = matrix_weights / 64 * 18 + vector_bytes;
  EXPECT_EQ(q1_0_bytes, 242434048);  // 1,720,451,072 / 128 · 18 + 495,616
  EXPECT_EQ(q2_0_bytes, 484372480);  // 1,720,451,072 / 64 · 18 + 495,616

  // The presets themselves: the plan's bytes.
  for (const auto& [preset, type, bytes] : {std::tuple{"bonsai-1.7b", "q1_0", q1_0_bytes},
                                            std::tuple{"bonsai-ternary-1.7b", "q2_0", q2_0_bytes}}) {
    SCOPED_TRACE(preset);
    const SynthSpec s = *SynthPreset(preset);
    Result<std::vector<SynthTensorPlan>> p = PlanSynthTensors(s);
    Result<const WeightTypeDesc*> registered = SynthWeightTypeByName(type);
    ASSERT_TRUE(registered.ok()) << registered.status().message();
    EXPECT_EQ((*registered)->block_elems, std::string(type) == "q1_0" ? 128 : 64);
    EXPECT_EQ((*registered)->block_bytes, 18);
    ASSERT_TRUE(p.ok()) << p.status().message();
    int64_t total = 0;
    for (const SynthTensorPlan& t : *p) {
      total += t.bytes;
      EXPECT_EQ(t.type, t.dims.size() == 2 ? type : "f32") << t.name;
    }
    EXPECT_EQ(total, bytes);
  }
}

// A tiny qwen3 (head_dim 32 with dim 64 and 4 heads: n_heads · head_dim = 128 ≠ dim).
SynthSpec TinyQwen3(const std::string& type) {
  return SynthSpec{.arch = SynthArch::kQwen3, .dim = 64, .n_layers = 2, .n_heads = 4, .head_dim_override = 32,
                   .n_kv_heads = 2, .hidden_dim = 128, .context = 256, .norm_eps = 1e-6f, .type = type, .seed = 7};
}

TEST(SynthQwen3, TinyFileHasQwen3TensorsAndKeysAndKvqRunsIt) {
  const std::string path = TempPath("tiny.gguf");
  ASSERT_TRUE(WriteSynthModel(TinyQwen3("q8_0"), kStories, path).ok());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(*(*f)->GetString("general.architecture"), "qwen3");
  EXPECT_EQ(*(*f)->GetU32("qwen3.attention.key_length"), 32u);
  EXPECT_EQ(*(*f)->GetU32("qwen3.attention.value_length"), 32u);
  EXPECT_EQ(*(*f)->GetU32("qwen3.rope.dimension_count"), 32u);
  EXPECT_EQ(*(*f)->GetU32("general.file_type"), 7u);  // MOSTLY_Q8_0
  const struct { const char* name; GgmlType type; std::vector<int64_t> dims; } want[] = {
      {"blk.1.attn_q.weight", GgmlType::kQ8_0, {64, 128}},  {"blk.1.attn_q_norm.weight", GgmlType::kF32, {32}},
      {"blk.1.attn_k.weight", GgmlType::kQ8_0, {64, 64}},   {"blk.1.attn_k_norm.weight", GgmlType::kF32, {32}},
      {"blk.1.attn_output.weight", GgmlType::kQ8_0, {128, 64}}};
  for (const auto& w : want) {
    Result<const GgufTensor*> t = (*f)->FindTensor(w.name);
    ASSERT_TRUE(t.ok()) << w.name;
    EXPECT_EQ((*t)->type, w.type) << w.name;
    EXPECT_EQ((*t)->dims, w.dims) << w.name;
  }
  EXPECT_FALSE((*f)->FindTensor("blk.0.attn_q.bias").ok());
  EXPECT_TRUE((*f)->FindTensor("output.weight").ok());  // SynthSpec's default: separate
  // The API reports and sizes the cache by the file's head_dim.
  Result<std::unique_ptr<Model>> model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status().message();
  EXPECT_EQ((*model)->info().head_dim, 32);
  EXPECT_EQ((*model)->info().n_heads, 4);
  Result<LoadedModel> loaded = LoadModel(path, "");
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_TRUE(loaded->weights.config.qk_norm);
  const DecoderConfig c = loaded->weights.config;
  DecoderModel m(std::move(loaded->weights), 1);
  const FormatDesc* f16 = *FindFormat("f16");
  auto cache = KvCache::Create({.n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim(),
                                .layers = {{f16, f16}}, .max_positions = 64, .page_positions = 32});
  ASSERT_TRUE(cache.ok());
  std::vector<float> logits(c.vocab_size);
  for (int pos = 0; pos < 6; ++pos) ASSERT_TRUE(m.Forward(pos * 37 % c.vocab_size, pos, **cache, logits.data()).ok());
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  std::filesystem::remove(path);
}

TEST(SynthQwen3, MixesEndToEndWithTheTypesRegisteredToday) {
  // q6_k at dim 64 / ffn 128: no row is a whole 256-block, so llama.cpp's fallback makes every
  // matrix Q8_0 (the classifier too); the file says MOSTLY_Q6_K (18), as llama-quantize writes it.
  const std::string path = TempPath("q6_k.gguf");
  ASSERT_TRUE(WriteSynthModel(TinyQwen3("q6_k"), kStories, path).ok());
  {
    auto f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status().message();
    EXPECT_EQ(*(*f)->GetU32("general.file_type"), 18u);
    for (const GgufTensor& t : (*f)->tensors()) {
      EXPECT_EQ(t.type, t.dims.size() == 2 ? GgmlType::kQ8_0 : GgmlType::kF32) << t.name;
    }
    ASSERT_TRUE(LoadModel(path, "").ok());
  }
  std::filesystem::remove(path);
  // q4_k_m there: the (untied) token_embd would be Q4_K but its rows of 64 are not whole
  // 256-blocks, so llama.cpp's fallback makes it Q5_0; the other matrices fall back the same way.
  const std::string mixed = TempPath("q4_k_m.gguf");
  ASSERT_TRUE(WriteSynthModel(TinyQwen3("q4_k_m"), kStories, mixed).ok());
  {
    auto f = GgufFile::Open(mixed);
    ASSERT_TRUE(f.ok()) << f.status().message();
    EXPECT_EQ(*(*f)->GetU32("general.file_type"), 15u);  // MOSTLY_Q4_K_M
    Result<const GgufTensor*> embd = (*f)->FindTensor("token_embd.weight");
    ASSERT_TRUE(embd.ok());
    EXPECT_EQ((*embd)->type, GgmlType::kQ5_0);
    Result<LoadedModel> loaded = LoadModel(mixed, "");
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  }
  std::filesystem::remove(mixed);
}

}  // namespace
}  // namespace kvq
