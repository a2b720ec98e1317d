// kvq synth's layer cut and --layer-output-scale (SynthLayerOutputScale): a file's first N layers,
// embeddings, output norm and classifier are the same bytes as the same seed's --layers N file;
// the option scales only the output projections of the layers from FROM on; at SCALE 0 the target's
// logits are its FROM-layer cut's bit for bit, for a dense llama and for a hybrid (Gated DeltaNet,
// experts), so the cut as a draft model has every drafted token kept and the output is decoding's
// without speculation. The unscaled target is checked to differ from its cut in each of these, so
// each test fails if the option is ignored. Bad values are refused naming the flag.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "kvq/model.h"
#include "kvq/session.h"
#include "kvq/speculation.h"
#include "synth/synth.h"
#include "test_util/bundled_paths.h"
#include "test_util/synth_model.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

// A dense llama of `n_layers` in Q4_0 (zero blocks have scale 0 there too); seed 5.
SynthSpec TinyLlama(int64_t n_layers) {
  return {.arch = SynthArch::kLlama, .dim = 64, .n_layers = n_layers, .n_heads = 4, .n_kv_heads = 2,
          .hidden_dim = 128, .vocab_size = 512, .context = 1024, .type = "q4_0", .seed = 5};
}

// A preset with `n_layers` (the tiny hybrids have 4: full attention at layers 1 and 3).
SynthSpec Preset(const char* name, int64_t n_layers) {
  SynthSpec s = *SynthPreset(name);
  s.n_layers = n_layers;
  s.seed = 5;
  return s;
}

SynthSpec Scaled(SynthSpec s, int64_t from_layer, float scale) {
  s.layer_output_scale = SynthLayerOutputScale{.from_layer = from_layer, .scale = scale};
  return s;
}

std::string TempPath(const std::string& name) {
  return (fs::path(::testing::TempDir()) / ("kvq_los_" + std::to_string(::getpid()) + "_" + name)).string();
}

// ---- the flag's value ----

TEST(SynthLayerOutputScale, ParsesFromAndScale) {
  Result<SynthLayerOutputScale> a = ParseSynthLayerOutputScale("2:0.05");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->from_layer, 2);
  EXPECT_EQ(a->scale, 0.05f);
  Result<SynthLayerOutputScale> b = ParseSynthLayerOutputScale("0:0");
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b->from_layer, 0);
  EXPECT_EQ(b->scale, 0.0f);
  Result<SynthLayerOutputScale> c = ParseSynthLayerOutputScale("13:1e-3");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->scale, 1e-3f);
}

TEST(SynthLayerOutputScale, BadValuesAreRefusedNamingTheFlag) {
  const struct {
    const char* value;
    const char* must_mention;
  } cases[] = {
      {"2", "FROM:SCALE"},          {"2:", "SCALE"},           {":0.5", "FROM"},
      {"x:0.5", "FROM"},            {"1.5:0.5", "FROM"},       {"-1:0.5", "0 or more"},
      {"2:abc", "SCALE"},           {"2:0.5x", "SCALE"},       {"2:-0.5", ">= 0"},
      {"2:nan", "finite"},          {"2:inf", "finite"},       {"2:1e99", "finite"},
      {"2:+1", "SCALE"},
  };
  for (const auto& c : cases) {
    Result<SynthLayerOutputScale> r = ParseSynthLayerOutputScale(c.value);
    ASSERT_FALSE(r.ok()) << c.value;
    EXPECT_NE(r.status().message().find("--layer-output-scale"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(c.must_mention), std::string::npos) << r.status().message();
  }
}

TEST(SynthLayerOutputScale, FromMustBeALayerOfTheModel) {
  for (const int64_t from : {4, 9}) {
    const Status s = ValidateSynthSpec(Scaled(TinyLlama(4), from, 0.0f));
    ASSERT_FALSE(s.ok()) << from;
    EXPECT_NE(s.message().find("--layer-output-scale"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("--layers 4"), std::string::npos) << s.message();
  }
  EXPECT_TRUE(ValidateSynthSpec(Scaled(TinyLlama(4), 3, 0.0f)).ok());
  // Set directly (not parsed): still checked.
  const Status negative = ValidateSynthSpec(Scaled(TinyLlama(4), 2, -1.0f));
  EXPECT_NE(negative.message().find("SCALE"), std::string::npos) << negative.message();
  const Status nan = ValidateSynthSpec(Scaled(TinyLlama(4), 2, std::nanf("")));
  EXPECT_NE(nan.message().find("finite"), std::string::npos) << nan.message();
}

// ---- the bytes ----

// Each tensor of the file at `path`: its name and bytes.
std::vector<std::pair<std::string, std::string>> TensorBytes(const std::string& path) {
  std::vector<std::pair<std::string, std::string>> out;
  Result<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status().message();
  if (!f.ok()) return out;
  for (const GgufTensor& t : (*f)->tensors()) {
    out.emplace_back(t.name, std::string(reinterpret_cast<const char*>(t.data), static_cast<size_t>(t.n_bytes)));
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> Written(const SynthSpec& spec, const std::string& name) {
  const std::string path = TempPath(name);
  const Status s = WriteSynthModel(spec, test::BundledGgufPath(), path);
  EXPECT_TRUE(s.ok()) << s.message();
  auto out = TensorBytes(path);
  fs::remove(path);
  return out;
}

// The output projections: what --layer-output-scale scales.
bool IsOutputProjection(const std::string& name) {
  for (const char* suffix : {".attn_output.weight", ".ffn_down.weight", ".ssm_out.weight",
                             ".ffn_down_exps.weight", ".ffn_down_shexp.weight"}) {
    if (name.ends_with(suffix)) return true;
  }
  return false;
}

int64_t LayerOf(const std::string& name) {
  return name.starts_with("blk.") ? std::stoll(name.substr(4)) : -1;
}

// A 2-layer cut's tensors are the 4-layer file's of the same names, byte for byte, with and without
// the scale; the scale changes exactly the output projections of layers 2 and 3.
void ExpectCutAndScale(const SynthSpec& four_layers, const SynthSpec& two_layers) {
  const auto full = Written(four_layers, "full.gguf");
  const auto scaled = Written(Scaled(four_layers, 2, 0.05f), "scaled.gguf");
  const auto cut = Written(two_layers, "cut.gguf");
  ASSERT_EQ(full.size(), scaled.size());
  std::set<std::string> changed;
  for (size_t i = 0; i < full.size(); ++i) {
    ASSERT_EQ(full[i].first, scaled[i].first);
    if (full[i].second != scaled[i].second) changed.insert(full[i].first);
  }
  std::set<std::string> expected;
  for (const auto& [name, bytes] : full) {
    if (IsOutputProjection(name) && LayerOf(name) >= 2) expected.insert(name);
  }
  EXPECT_EQ(changed, expected);
  EXPECT_GE(expected.size(), 4u);  // two layers, two or more projections each
  size_t matched = 0;
  for (const auto& [name, bytes] : cut) {
    EXPECT_LT(LayerOf(name), 2) << name;
    for (const auto* file : {&full, &scaled}) {
      for (const auto& [other_name, other_bytes] : *file) {
        if (other_name != name) continue;
        EXPECT_TRUE(other_bytes == bytes) << name;
        ++matched;
      }
    }
  }
  EXPECT_EQ(matched, 2 * cut.size());  // every tensor of the cut is in both files
}

TEST(SynthLayerOutputScale, ACutIsTheFirstLayersOfTheSameSeedsFile) {
  {
    SCOPED_TRACE("llama");
    ExpectCutAndScale(TinyLlama(4), TinyLlama(2));
  }
  for (const char* preset : {"tiny-qwen35", "tiny-qwen35moe", "tiny-qwen3next"}) {
    SCOPED_TRACE(preset);
    ExpectCutAndScale(Preset(preset, 4), Preset(preset, 2));
  }
}

// ---- the models ----

bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

// The logits after every token of `prompt` ([prompt.size()][vocab]), from one Prefill.
std::vector<float> PromptLogits(const Model& m, std::span<const int32_t> prompt) {
  std::unique_ptr<Session> s = test::NewSessionOrFail(m);
  if (s == nullptr) return {};
  std::vector<int32_t> at(prompt.size());
  for (size_t i = 0; i < at.size(); ++i) at[i] = static_cast<int32_t>(i);
  const Status st = s->Prefill(prompt, at);
  EXPECT_TRUE(st.ok()) << st.message();
  return {s->chosen_logits().begin(), s->chosen_logits().end()};
}

Completion Greedy(const Model& m, std::span<const int32_t> prompt, const Model* draft) {
  GenerateRequest request{.max_tokens = 48, .sampling = {.temperature = 0}, .ignore_eos = true};
  if (draft != nullptr) {
    // Every drafted token offered (any probability), drafts of 4, no gate: each token is tested.
    request.speculation = {.source = DraftSource::kModel, .max_draft = 4, .min_draft_probability = 1e-9,
                           .ungated = true, .draft_model = draft};
  }
  std::unique_ptr<Session> s = test::NewSessionOrFail(m);
  if (s == nullptr) return {};
  Result<Completion> c = s->Generate(prompt, request);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? std::move(c).value() : Completion{};
}

// A 4-layer target scaled from layer 2 by 0, the same 4 layers unscaled (what ignoring the option
// writes) and the 2-layer cut.
void ExpectTheCutAgrees(const SynthSpec& four_layers, const SynthSpec& two_layers, const std::string& tag) {
  std::unique_ptr<Model> target = test::LoadSynth(Scaled(four_layers, 2, 0.0f), tag + "_target");
  std::unique_ptr<Model> unscaled = test::LoadSynth(four_layers, tag + "_unscaled");
  std::unique_ptr<Model> cut = test::LoadSynth(two_layers, tag + "_cut");
  ASSERT_TRUE(target && unscaled && cut);
  ASSERT_TRUE(CheckDraftVocabulary(*target, *cut).ok());
  const std::vector<std::vector<int32_t>> prompts = {
      target->Tokenize("Once upon a time, there was a little girl named Lily."),
      test::RandomIds(40, target->info().vocab_size, 17)};
  for (const std::vector<int32_t>& prompt : prompts) {
    SCOPED_TRACE(prompt.size());
    const std::vector<float> cut_logits = PromptLogits(*cut, prompt);
    ASSERT_EQ(cut_logits.size(), prompt.size() * static_cast<size_t>(cut->info().vocab_size));
    EXPECT_TRUE(SameBits(PromptLogits(*target, prompt), cut_logits));
    EXPECT_FALSE(SameBits(PromptLogits(*unscaled, prompt), cut_logits));

    // Decoding: the same tokens; with the cut as the draft model, every drafted token kept.
    const Completion plain = Greedy(*target, prompt, nullptr);
    EXPECT_EQ(plain.tokens, Greedy(*cut, prompt, nullptr).tokens);
    const Completion drafted = Greedy(*target, prompt, cut.get());
    EXPECT_EQ(drafted.tokens, plain.tokens);
    const SpeculationStats& st = drafted.speculation;
    EXPECT_GE(st.drafted, 32);  // 48 tokens in passes of up to 5: most of them drafted
    EXPECT_EQ(st.accepted, st.drafted);
    // The unscaled target rejects some of the cut's drafts (and still gives its own output).
    const Completion unscaled_drafted = Greedy(*unscaled, prompt, cut.get());
    EXPECT_EQ(unscaled_drafted.tokens, Greedy(*unscaled, prompt, nullptr).tokens);
    EXPECT_LT(unscaled_drafted.speculation.accepted, unscaled_drafted.speculation.drafted);
  }
}

TEST(SynthLayerOutputScale, AtScaleZeroTheCutIsAnExactDraftOfADenseTarget) {
  ExpectTheCutAgrees(TinyLlama(4), TinyLlama(2), "los_llama");
}

TEST(SynthLayerOutputScale, AtScaleZeroTheCutIsAnExactDraftOfAHybridTarget) {
  for (const char* preset : {"tiny-qwen35", "tiny-qwen35moe"}) {
    SCOPED_TRACE(preset);
    ExpectTheCutAgrees(Preset(preset, 4), Preset(preset, 2), std::string("los_") + preset);
  }
}

}  // namespace
}  // namespace kvq
