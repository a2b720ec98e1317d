// Writes the WebGPU forward test's inputs (tests/web/gpu/gpu_forward_page.js): for each model —
// the bundled stories260K (llama2.c, F32), a tiny qwen3 with Q1_0 matrices (Bonsai's architecture
// and weight type: per-head q/k RMSNorm, NeoX RoPE, head_dim · n_heads ≠ dim) and a tiny qwen3 with
// Q4_0 matrices (repacked at load: the interleaved layout) and a Q4_K_M mix (Q4_K and Q6_K, repacked
// into the K-quant groups), and models of the other weight types (Q2_K, Q3_K and Q5_K mixes, Q4_1,
// Q2_0: with them every type in kvq's registry), from kvq synth — and for 3 prompts
// × the KV specs below, native kvq's greedy run through the public API (Model, Session; one
// thread; f32 score arithmetic, as the GPU scores): the ids (BOS and prompt, then kNewTokens
// greedy ids: the first largest logit) and the logits after every id but the last. For
// stories260K the manifest also carries run.c's golden ids (golden-runc-ids.txt), which native
// kvq's f32 run reproduces. The tiny hybrids of kvq synth's presets (Q8_0) run as the others:
// tiny-qwen35 (Gated DeltaNet layers between gated attention layers), tiny-qwen35moe and
// tiny-qwen3next (the same with mixture-of-experts feed-forward layers: 6 experts, 2 chosen, and a
// gated shared expert). The qwen3 Q1_0 model with a longer context for the mixed KV mode (manifest
// "mixed") and a tiny qwen35moe in four weight types with 16 experts for the GPU's MoE ops
// (manifest "moe") are written only.
// Output: DIR/manifest.json, DIR/<model>.<prompt>.<spec>.bin ([n − 1][vocab] f32), the synth GGUFs.
// Usage: gpu_forward_fixture DIR
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <hwy/targets.h>
#include <nlohmann/json.hpp>

#include "kvq/format.h"
#include "kvq/model.h"
#include "kvq/session.h"
#include "synth/synth.h"
#include "test_util/golden_runc.h"

namespace {

constexpr int kNewTokens = 4;  // few: each model's test stays near a minute on SwiftShader
// The KV specs every model runs with: f32 and the common compact formats, a transform among them.
const char* const kSpecs[] = {"f32", "int8", "int4", "int4-kivi", "int4+rot"};

int Fail(const std::string& what) {
  fmt::print(stderr, "gpu_forward_fixture: {}\n", what);
  return 1;
}

// First index of the largest value: the GPU's argmax rule.
int32_t Argmax(std::span<const float> x) {
  size_t best = 0;
  for (size_t i = 1; i < x.size(); ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fmt::print(stderr, "usage: gpu_forward_fixture DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  // The GPU scores queries against dequantised keys in f32: native runs with the same arithmetic
  // (the default, integer scores for int8/int4 keys, rounds the query to int8 first).
  kvq::SetScoreArithmetic(kvq::ScoreArithmetic::kF32);
  const std::string stories = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";
  struct ModelCase {
    std::string name, path, tokenizer, served;  // served: the page's URL path of the file
    std::vector<std::string> prompts;
    size_t n_specs = std::size(kSpecs);  // the first n_specs of kSpecs
    std::vector<std::string> more_specs = {};  // then these
  };
  std::vector<ModelCase> cases;
  std::vector<std::string> golden_prompts;
  nlohmann::json golden = nlohmann::json::array();
  for (const kvq::test::GoldenRun& run : kvq::test::ReadGoldenRuns()) {
    golden_prompts.push_back(run.prompt);
    golden.push_back({{"prompt", run.prompt}, {"ids", run.ids}});
  }
  if (golden_prompts.size() < 3) return Fail("fewer than 3 golden runs in " + stories + "golden-runc-ids.txt");
  golden_prompts.resize(3);
  cases.push_back({"stories260K", stories + "stories260K.bin", stories + "tok512.bin", "/models/stories260K.bin",
                   golden_prompts});
  // Issue 31's spec (KIVI keys, 4 sinks, 64 residual rows), which the page runs resident.
  cases.back().more_specs = {"int2-kivi+sink4+res64"};
  for (const char* type : {"q1_0", "q4_0"}) {
    kvq::SynthSpec spec{.name = fmt::format("tiny-qwen3-{}", type), .arch = kvq::SynthArch::kQwen3, .dim = 128,
                        .n_layers = 2, .n_heads = 4, .head_dim_override = 64, .n_kv_heads = 2, .hidden_dim = 256,
                        .context = 256};
    spec.type = type;  // (set apart: g++ 12 warns on the braced form's strings)
    const std::string file = fmt::format("qwen3-{}.gguf", type);
    if (kvq::Status s = kvq::WriteSynthModel(spec, stories + "stories260K.gguf", (dir / file).string()); !s.ok())
      return Fail(s.message());
    cases.push_back({fmt::format("qwen3-{}", type), (dir / file).string(), "", "/fixture/" + file,
                     {"Once upon a time", "The cat", "A little dog ran"}});
    // The seeds' model (Bonsai: qwen3, Q1_0) with issue 31's spec too.
    if (std::string_view(type) == "q1_0") cases.back().more_specs = {"int2-kivi+sink4+res64"};
  }
  // A Q4_K_M mix (llama.cpp's: Q4_K matrices, Q6_K for the classifier and some layers' attn_v and
  // ffn_down), repacked at load into the K-quant groups; K-quant rows hold multiples of 256.
  {
    kvq::SynthSpec spec{.name = "tiny-qwen3-q4_k_m", .arch = kvq::SynthArch::kQwen3, .dim = 256, .n_layers = 2,
                        .n_heads = 4, .head_dim_override = 64, .n_kv_heads = 2, .hidden_dim = 512, .context = 256};
    spec.type = "q4_k_m";
    if (kvq::Status s = kvq::WriteSynthModel(spec, stories + "stories260K.gguf", (dir / "qwen3-q4_k_m.gguf").string());
        !s.ok())
      return Fail(s.message());
    // f32 and int8 KV only: with int4 KV the GPU's logits part from native's by up to 0.24 at one
    // position (an int4 code one apart after the activations' last bits differ), over the page's
    // empirical bound for block-quantised models (0.17); f32 and int8 stay within it (0.06, 0.07).
    cases.push_back({"qwen3-q4_k_m", (dir / "qwen3-q4_k_m.gguf").string(), "", "/fixture/qwen3-q4_k_m.gguf",
                     {"Once upon a time", "The cat", "A little dog ran"}, 2});
  }
  // The hybrids of kvq synth's presets, each run on the GPU path (its recurrent state and, for the
  // MoE ones, its routing on the GPU).
  for (const char* preset : {"tiny-qwen35", "tiny-qwen35moe", "tiny-qwen3next"}) {
    kvq::Result<kvq::SynthSpec> spec = kvq::SynthPreset(preset);
    if (!spec.ok()) return Fail(spec.status().message());
    const std::string name = std::string(preset).substr(5);  // "qwen35", "qwen35moe", "qwen3next"
    const std::string file = name + ".gguf";
    if (kvq::Status s = kvq::WriteSynthModel(*spec, stories + "stories260K.gguf", (dir / file).string()); !s.ok())
      return Fail(s.message());
    cases.push_back({name, (dir / file).string(), "", "/fixture/" + file,
                     {"Once upon a time", "The cat", "A little dog ran"}});
  }
  // The other weight types a Bonsai, Qwen3, Llama or Qwen2 GGUF uses, each in at least one model
  // (f32 and int8 KV, as the Q4_K_M mix: the KV formats are the models above's to cover):
  //   q2_k mix      Q2_K (q, k, gate, up), Q3_K (v, o, down), Q6_K (classifier)
  //   q3_k_m mix    Q3_K, Q5_K (v), Q4_K (o), and Q5_0 for ffn_down: its 288 columns are not
  //                 whole K-quant blocks, so llama.cpp's fallback takes Q4_K's 32-block stand-in
  //   q5_k_m mix    Q5_K, Q6_K, and for ffn_down's 288 columns Q5_1 (layer 0, Q5_K's stand-in)
  //                 and Q8_0 (layer 1, Q6_K's)
  //   q4_1, q2_0    every matrix that type (Q2_0: the ternary type of PrismML's Bonsai files)
  struct TypeModel {
    const char* type;
    int64_t dim, hidden_dim;
  };
  for (const TypeModel& tm : {TypeModel{"q2_k", 256, 512}, TypeModel{"q3_k_m", 256, 288}, TypeModel{"q5_k_m", 256, 288},
                              TypeModel{"q4_1", 128, 256}, TypeModel{"q2_0", 128, 256}}) {
    kvq::SynthSpec spec{.name = fmt::format("tiny-qwen3-{}", tm.type), .arch = kvq::SynthArch::kQwen3, .dim = tm.dim,
                        .n_layers = 2, .n_heads = 4, .head_dim_override = 64, .n_kv_heads = 2,
                        .hidden_dim = tm.hidden_dim, .context = 256};
    spec.type = tm.type;
    const std::string file = fmt::format("qwen3-{}.gguf", tm.type);
    if (kvq::Status s = kvq::WriteSynthModel(spec, stories + "stories260K.gguf", (dir / file).string()); !s.ok())
      return Fail(s.message());
    cases.push_back({fmt::format("qwen3-{}", tm.type), (dir / file).string(), "", "/fixture/" + file,
                     {"Once upon a time", "The cat", "A little dog ran"}, 2});
  }
  // The Bonsai-shaped qwen3 Q1_0 model again with a context of 512 positions, for the mixed KV
  // mode (tests/web/gpu/gpu_kv_mixed_page.js): 16 pages of 32 per layer, so a device budget of
  // 2 streaming slots and one resident page per layer is 1/8 of the context (no native run: the
  // page compares its GPU paths with each other, bit for bit).
  // And with a context of 2048 (manifest "mixed_rows") for the sinkN / resN specs there, whose f32
  // rows on the GPU (a ring of them per layer) outweigh the 512-position context's pages.
  for (const int context : {512, 2048}) {
    kvq::SynthSpec spec{.name = fmt::format("tiny-qwen3-q1_0-ctx{}", context), .arch = kvq::SynthArch::kQwen3, .dim = 128,
                        .n_layers = 2, .n_heads = 4, .head_dim_override = 64, .n_kv_heads = 2, .hidden_dim = 256,
                        .context = context};
    spec.type = "q1_0";
    const std::string file = (dir / fmt::format("qwen3-q1_0-ctx{}.gguf", context)).string();
    if (kvq::Status s = kvq::WriteSynthModel(spec, stories + "stories260K.gguf", file); !s.ok()) return Fail(s.message());
  }
  // The mixture-of-experts hybrid (tiny-qwen35moe with 16 experts, 4 chosen per token) in four
  // weight types, for the GPU's MoE ops against the module's (tests/web/gpu/gpu_moe_page.js):
  // F32 (its weights read as they are), Q8_0 and Q4_0, repacked at load, and Q4_1 (rows: a type
  // with a min, whose expert matvec sums Σq at each rank's offset).
  nlohmann::json moe_models = nlohmann::json::array();
  for (const char* type : {"f32", "q8_0", "q4_0", "q4_1"}) {
    kvq::Result<kvq::SynthSpec> preset = kvq::SynthPreset("tiny-qwen35moe");
    if (!preset.ok()) return Fail(preset.status().message());
    kvq::SynthSpec spec = *preset;
    spec.n_experts = 16;
    spec.n_experts_used = 4;
    spec.type = type;
    const std::string file = fmt::format("qwen35moe-{}.gguf", type);
    if (kvq::Status s = kvq::WriteSynthModel(spec, stories + "stories260K.gguf", (dir / file).string()); !s.ok())
      return Fail(s.message());
    moe_models.push_back("/fixture/" + file);
  }
  // kvq's best SIMD target here (what native runs on) and its lowest one.
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  if (targets.size() < 2) return Fail("this build has one SIMD target: no second arithmetic order to compare");
  const int64_t alt_target = targets.back();
  nlohmann::json models = nlohmann::json::array();
  for (const ModelCase& mc : cases) {
    kvq::Result<std::unique_ptr<kvq::Model>> model =
        kvq::Model::Load(mc.path, {.tokenizer_path = mc.tokenizer, .threads = 1});
    if (!model.ok()) return Fail(model.status().message());
    const int32_t vocab = (*model)->info().vocab_size;
    nlohmann::json runs = nlohmann::json::array();
    for (size_t pi = 0; pi < mc.prompts.size(); ++pi) {
      const std::vector<int32_t> prompt = (*model)->Tokenize(mc.prompts[pi]);
      if (prompt.empty()) return Fail(mc.name + ": prompt \"" + mc.prompts[pi] + "\" gave no tokens");
      std::vector<std::string> specs(kSpecs, kSpecs + mc.n_specs);
      specs.insert(specs.end(), mc.more_specs.begin(), mc.more_specs.end());
      for (const std::string& spec_name : specs) {
        const char* spec = spec_name.c_str();
        kvq::Result<std::unique_ptr<kvq::Session>> session = (*model)->NewSession({.key_format = spec, .value_format = spec});
        if (!session.ok()) return Fail(session.status().message());
        kvq::Session& s = **session;
        std::vector<int32_t> all(prompt.size());
        for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int32_t>(i);
        if (kvq::Status st = s.Prefill(prompt, all); !st.ok()) return Fail(st.message());
        std::vector<float> logits(s.chosen_logits().begin(), s.chosen_logits().end());  // [n_prompt][vocab]
        std::vector<int32_t> ids = prompt;
        for (int i = 0; i < kNewTokens; ++i) {
          ids.push_back(Argmax(s.logits()));
          if (i + 1 == kNewTokens) break;  // the last id is not run
          if (kvq::Status st = s.Decode(ids.back()); !st.ok()) return Fail(st.message());
          logits.insert(logits.end(), s.logits().begin(), s.logits().end());
        }
        // The same ids (teacher-forced) on kvq's lowest SIMD target: the spread between two of
        // kvq's own arithmetic orders, which the page's bound for this model and spec builds on.
        hwy::SetSupportedTargetsForTest(alt_target);
        double spread = 0;
        {
          kvq::Result<std::unique_ptr<kvq::Session>> alt = (*model)->NewSession({.key_format = spec, .value_format = spec});
          if (!alt.ok()) return Fail(alt.status().message());
          const std::vector<int32_t> run_ids(ids.begin(), ids.end() - 1);
          std::vector<int32_t> every(run_ids.size());
          for (size_t i = 0; i < every.size(); ++i) every[i] = static_cast<int32_t>(i);
          if (kvq::Status st = (*alt)->Prefill(run_ids, every); !st.ok()) return Fail(st.message());
          const std::span<const float> l = (*alt)->chosen_logits();
          for (size_t i = 0; i < l.size(); ++i) spread = std::max(spread, std::abs(double{l[i]} - logits[i]));
        }
        hwy::SetSupportedTargetsForTest(0);
        const std::string file = fmt::format("{}.{}.{}.bin", mc.name, pi, spec);
        std::ofstream(dir / file, std::ios::binary | std::ios::trunc)
            .write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * 4));
        runs.push_back({{"prompt", mc.prompts[pi]}, {"spec", spec}, {"ids", ids},
                        {"n_prompt", prompt.size()}, {"file", file}, {"target_spread", spread}});
      }
    }
    nlohmann::json m{{"name", mc.name}, {"model", mc.served}, {"vocab", vocab}, {"runs", runs},
                     {"architecture", (*model)->info().architecture}};
    if (!mc.tokenizer.empty()) m["tokenizer"] = "/models/tok512.bin";
    if (mc.name == "stories260K") m["golden"] = golden;
    models.push_back(std::move(m));
  }
  std::ofstream(dir / "manifest.json", std::ios::trunc)
      << nlohmann::json{{"models", models},
                        {"mixed", "/fixture/qwen3-q1_0-ctx512.gguf"},
                        {"mixed_rows", "/fixture/qwen3-q1_0-ctx2048.gguf"},
                        {"moe", moe_models},
                        {"targets", {hwy::TargetName(targets.front()), hwy::TargetName(alt_target)}}}
             .dump()
      << "\n";
  fmt::print("gpu_forward_fixture: {} models x 3 prompts x up to {} KV specs in {}\n", models.size(), std::size(kSpecs),
             dir.string());
  return 0;
}
