// The architecture table (gguf/architectures.h) through both of its readers: for every entry, kvq
// synth writes a small file and the GGUF loader reads it back with what the entry says (name,
// rotary pairing, biases, q/k norms, hybrid layers, experts, V-head order). A name synth or the
// loader knows that the table lacks cannot exist: both look names up in it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "gguf/architectures.h"
#include "model/load_model.h"
#include "synth/synth.h"
#include "test_util/bundled_paths.h"

namespace kvq {
namespace {

const std::string kStories = test::BundledGgufPath();

// A small file of `a`: the tiny preset for a hybrid (its only shape with the recurrent layers' keys),
// else a dense shape of two layers.
SynthSpec SmallSpec(const Architecture& a) {
  if (a.hybrid()) {
    Result<SynthSpec> preset = SynthPreset(std::string("tiny-") + a.name);
    EXPECT_TRUE(preset.ok()) << a.name << ": " << preset.status().message();
    SynthSpec s = preset.ok() ? *preset : SynthSpec{};
    s.type = "f32";
    return s;
  }
  return SynthSpec{.name = std::string("arch-") + a.name,
                   .arch = a.id,
                   .dim = 64,
                   .n_layers = 2,
                   .n_heads = 4,
                   .n_kv_heads = 2,
                   .hidden_dim = 96,
                   .context = 256,
                   .qkv_bias = a.qkv_bias,
                   .type = "f32"};
}

TEST(Architectures, SynthWritesEveryEntryAndTheLoaderReadsItBack) {
  ASSERT_FALSE(Architectures().empty());
  for (const Architecture& a : Architectures()) {
    SCOPED_TRACE(a.name);
    EXPECT_EQ(&ArchitectureOf(a.id), &a);
    const SynthSpec spec = SmallSpec(a);
    ASSERT_EQ(spec.arch, a.id);
    const std::string path = ::testing::TempDir() + "/architectures_" + std::to_string(getpid()) +
                             "_" + a.name + ".gguf";
    ASSERT_TRUE(WriteSynthModel(spec, kStories, path).ok());
    Result<LoadedModel> loaded = LoadModel(path, "");
    std::filesystem::remove(path);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    const DecoderConfig& c = loaded->weights.config;
    // The file names the entry it is written as (mistral as llama), and the loader took that
    // entry's rules.
    const Architecture* read = FindArchitecture(c.arch);
    ASSERT_NE(read, nullptr) << c.arch;
    EXPECT_EQ(c.arch, a.written_as);
    EXPECT_EQ(c.rope_pairing, a.pairing);
    EXPECT_EQ(c.qkv_bias, a.qkv_bias);
    EXPECT_EQ(c.qk_norm, a.qk_norm);
    EXPECT_EQ(c.moe.n_experts > 0, a.moe);
    EXPECT_EQ(c.n_attention_layers() < c.n_layers, a.hybrid());
    if (a.hybrid()) {
      EXPECT_EQ(c.delta_net.v_head_map, a.v_heads_grouped ? VHeadMap::kDivide : VHeadMap::kModulo);
    }
  }
}

TEST(Architectures, SynthTakesEveryNameAndListsThemWhenRefusing) {
  for (const Architecture& a : Architectures()) {
    Result<SynthArch> parsed = ParseSynthArch(a.name);
    ASSERT_TRUE(parsed.ok()) << a.name;
    EXPECT_EQ(*parsed, a.id);
    EXPECT_STREQ(SynthArchName(a.id), a.name);
    EXPECT_STREQ(SynthGgufArch(a.id), a.written_as);
  }
  Result<SynthArch> bad = ParseSynthArch("gemma");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "unknown architecture 'gemma' (expected one of " + ArchitectureNames() + ")");
  for (const Architecture& a : Architectures()) {
    EXPECT_NE(ArchitectureNames().find(a.name), std::string::npos) << a.name;
  }
}

}  // namespace
}  // namespace kvq
