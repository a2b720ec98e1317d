// kvq synth for the hybrids (qwen35, qwen35moe, qwen3next): the qwen3.5-35b-a3b preset (its
// published shape, parameter count and tensor table, without writing its ~20 GB), and the tiny
// presets written in F32 and Q8_0, loaded as `kvq run` loads them (repacked), run block and token
// by token, and driven through the public API (a session's cache holds the attention layers and
// the recurrent state; a second generation of the same prompt starts the state again; a prefix
// snapshot restores it).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "kvq/model.h"
#include "kvq/session.h"
#include "gguf/gguf_reader.h"
#include "model/cache_config.h"
#include "model/decoder.h"
#include "model/load_model.h"
#include "synth/synth.h"
#include "test_util/bundled_paths.h"

namespace kvq {
namespace {

const std::string kStories = test::BundledGgufPath();

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/synth_hybrid_" + std::to_string(getpid()) + "_" + name;
}

TEST(SynthHybridPresets, Qwen35MoeShape) {
  Result<SynthSpec> s = SynthPreset("qwen3.5-35b-a3b");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->arch, SynthArch::kQwen35Moe);
  EXPECT_EQ(s->n_layers, 40);
  EXPECT_EQ(s->head_dim(), 256);
  EXPECT_EQ(s->rope_dims, 64);
  int n_attention = 0;
  for (int l = 0; l < 40; ++l) n_attention += s->is_recurrent(l) ? 0 : 1;
  EXPECT_EQ(n_attention, 10);
  // Parameters counted here from the architecture (docs/hybrid_models_spec.md §3): per layer two
  // norms [E]; a Gated DeltaNet layer qkv [E, 8192], gate [E, 4096], beta and alpha [E, 32],
  // conv [4, 8192], dt_bias, a [32], ssm_norm [128], out [4096, E]; an attention layer q [E, 8192],
  // k, v [E, 512], out [4096, E], q/k norms [256]; every layer's router [E, 256], 256 experts of
  // three [E, 512] matrices, the shared gate [E] and expert (three [E, 512]); separate embeddings.
  const int64_t E = 2048;
  const int64_t delta = 8192 * E + 4096 * E + 2 * 32 * E + 4 * 8192 + 2 * 32 + 128 + 4096 * E;
  const int64_t attention = 8192 * E + 2 * 512 * E + 4096 * E + 2 * 256;
  const int64_t moe = 256 * E + 256 * 3 * 512 * E + E + 3 * 512 * E;
  const int64_t want = 2 * 248320 * E + E + 30 * delta + 10 * attention + 40 * (2 * E + moe);
  EXPECT_EQ(SynthParameterCount(*s), want);
  EXPECT_GT(want, 34'000'000'000);  // "35B"
  EXPECT_LT(want, 36'000'000'000);
  Result<std::vector<SynthTensorPlan>> plan = PlanSynthTensors(*s);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  bool found = false;
  for (const SynthTensorPlan& t : *plan) {
    if (t.name != "blk.39.ffn_down_exps.weight") continue;
    found = true;
    EXPECT_EQ(t.dims, (std::vector<int64_t>{512, 2048, 256}));
    EXPECT_EQ(t.type, "q4_0");
    EXPECT_EQ(t.bytes, int64_t{512} / 32 * 18 * 2048 * 256);
  }
  EXPECT_TRUE(found);
}

TEST(SynthHybrid, TinyPresetsLoadAndRun) {
  for (const char* preset : {"tiny-qwen35", "tiny-qwen35moe", "tiny-qwen3next"}) {
    for (const char* type : {"f32", "q8_0"}) {
      SCOPED_TRACE(std::string(preset) + " " + type);
      SynthSpec spec = *SynthPreset(preset);
      spec.type = type;
      const std::string path = TempPath(std::string(preset) + "_" + type + ".gguf");
      ASSERT_TRUE(WriteSynthModel(spec, kStories, path).ok());
      Result<LoadedModel> loaded = LoadModel(path, "");  // repacks Q8_0 matrices, as kvq run does
      ASSERT_TRUE(loaded.ok()) << loaded.status().message();
      const DecoderConfig c = loaded->weights.config;
      EXPECT_EQ(c.arch, SynthGgufArch(spec.arch));
      EXPECT_EQ(c.n_attention_layers(), 2);
      EXPECT_EQ(c.rope_dims, 16);
      EXPECT_EQ(c.moe.n_experts, spec.moe() ? 6 : 0);
      EXPECT_EQ(c.delta_net.v_head_map,
                spec.arch == SynthArch::kQwen3Next ? VHeadMap::kDivide : VHeadMap::kModulo);
      DecoderModel m(std::move(loaded->weights), 2);
      const FormatDesc* f16 = *FindFormat("f16");
      auto cache = [&] { return CreateModelCache(c, 64, {.layers = {{f16, f16}}, .page_positions = 32}); };
      auto a = cache(), b = cache();
      ASSERT_TRUE(a.ok() && b.ok());
      std::vector<int32_t> tokens;
      for (int i = 0; i < 9; ++i) tokens.push_back(i * 37 % c.vocab_size);
      std::vector<float> by_token(c.vocab_size), by_block(c.vocab_size);
      for (int pos = 0; pos < 9; ++pos)
        ASSERT_TRUE(m.Forward(tokens[pos], pos, **a, by_token.data()).ok());
      ASSERT_TRUE(m.ForwardBlock(tokens.data(), 9, 0, **b, by_block.data()).ok());
      EXPECT_EQ(by_token, by_block);
      for (float x : by_token) ASSERT_TRUE(std::isfinite(x));
      std::filesystem::remove(path);
    }
  }
}

// llama.cpp refuses a qwen35 or qwen35moe file without its multimodal RoPE sections; Qwen3-Next has
// none. The sections split the rotated pairs as Qwen3.5's [11, 11, 10] of 32 does (padded to 4).
TEST(SynthHybrid, Qwen35FilesCarryTheirRopeSections) {
  for (const std::string& preset : SynthPresetNames()) {
    SynthSpec spec = *SynthPreset(preset);
    if (!spec.is_hybrid() || SynthParameterCount(spec) > 10'000'000) continue;
    SCOPED_TRACE(preset);
    const std::string path = TempPath(preset + "_sections.gguf");
    ASSERT_TRUE(WriteSynthModel(spec, kStories, path).ok());
    Result<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status().message();
    const std::string key = std::string(SynthGgufArch(spec.arch)) + ".rope.dimension_sections";
    if (spec.arch == SynthArch::kQwen3Next) {
      EXPECT_FALSE((*file)->Has(key));
    } else {
      Result<const GgufArray*> sections = (*file)->GetArray(key);
      ASSERT_TRUE(sections.ok()) << sections.status().message();
      ASSERT_EQ((*sections)->size, 4);
      EXPECT_EQ((*sections)->element_type, GgufValueType::kInt32);
      std::vector<double> got;
      for (int64_t i = 0; i < 4; ++i) got.push_back((*sections)->NumberAt(i));
      EXPECT_EQ(got, (std::vector<double>{3, 3, 2, 0}));  // the 8 pairs of 16 rotated dims
    }
    std::filesystem::remove(path);
  }
  // Qwen3.5's 64 rotated dims of 256 (a tiny model with those heads): its own [11, 11, 10, 0].
  SynthSpec wide = *SynthPreset("tiny-qwen35");
  wide.head_dim_override = 256;
  wide.rope_dims = 64;
  const std::string path = TempPath("wide_sections.gguf");
  ASSERT_TRUE(WriteSynthModel(wide, kStories, path).ok());
  Result<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  Result<const GgufArray*> sections = (*file)->GetArray("qwen35.rope.dimension_sections");
  ASSERT_TRUE(sections.ok()) << sections.status().message();
  std::vector<double> got;
  for (int64_t i = 0; i < (*sections)->size; ++i) got.push_back((*sections)->NumberAt(i));
  EXPECT_EQ(got, (std::vector<double>{11, 11, 10, 0}));
  // kvq reads its own file back (the sections agree with rope.dimension_count).
  EXPECT_TRUE(LoadModel(path, "").ok());
  std::filesystem::remove(path);
}

TEST(SynthHybrid, SessionsRunAHybridAndStartTheStateAgain) {
  const std::string path = TempPath("session.gguf");
  ASSERT_TRUE(WriteSynthModel(*SynthPreset("tiny-qwen3next"), kStories, path).ok());
  Result<std::unique_ptr<Model>> model = Model::Load(path, {.threads = 1});
  ASSERT_TRUE(model.ok()) << model.status().message();
  Result<std::unique_ptr<Session>> session = (*model)->NewSession();
  ASSERT_TRUE(session.ok()) << session.status().message();
  GenerateRequest request{.max_tokens = 8};
  request.sampling.temperature = 0;
  Result<Completion> first = (*session)->Generate("Once upon a time", request);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_EQ(first->tokens.size(), 8u);
  // The same prompt again: the cache cannot keep a prefix (the state holds every position), so
  // the session starts again and gives the same greedy tokens.
  Result<Completion> second = (*session)->Generate("Once upon a time", request);
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_EQ(first->tokens, second->tokens);
  // A prefix snapshot carries the state: another session restored from it decodes the same
  // tokens with the same logits, bit for bit (hybrid_forward_test shows a zeroed state would not).
  const std::string snapshot = TempPath("prefix.kvqs");
  ASSERT_TRUE((*session)->SavePrefix(snapshot).ok());
  Result<std::unique_ptr<Session>> restored = (*model)->NewSession();
  ASSERT_TRUE(restored.ok()) << restored.status().message();
  Result<int64_t> loaded = (*restored)->LoadPrefix(snapshot);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ(*loaded, (*session)->positions());
  for (const int32_t t : {5, 9, 2, 31}) {
    ASSERT_TRUE((*session)->Decode(t).ok());
    ASSERT_TRUE((*restored)->Decode(t).ok());
    const std::span<const float> a = (*session)->logits(), b = (*restored)->logits();
    ASSERT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << "after token " << t;
  }
  std::filesystem::remove(snapshot);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kvq
