// The measurement commands on hybrid models, through the CLI as a user runs them: for every small
// hybrid preset of kvq synth (taken from the preset table, so a new hybrid is covered when it gets
// a preset), a file is written with `kvq synth`, then `eval fidelity` (the table, and a logits file
// written with --kl-divergence-base-out then read back with --kl-divergence-base), `eval
// attention`, `plan --auto` and `bench prefill` must run and print numbers that mean something:
// the f32 arm identical to the reference, a lossy one not, every position attended, one plan entry
// per attention layer, the attention's multiply-adds over the attention layers only.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "synth/synth.h"
#include "test_util/run_kvq.h"

namespace {

using kvq_test::KvqRun;
using kvq_test::RunKvq;
using kvq_test::Slurp;

std::string TempPath(const std::string& name) {
  return testing::TempDir() + "/kvq_hybrid_cli_" + std::to_string(getpid()) + "_" + name;
}

// The presets that are hybrids and small enough for a test (the tiny ones: thousands of
// parameters, not the published 35B shape).
std::vector<std::string> SmallHybridPresets() {
  std::vector<std::string> out;
  for (const std::string& name : kvq::SynthPresetNames()) {
    const kvq::Result<kvq::SynthSpec> spec = kvq::SynthPreset(name);
    if (spec.ok() && spec->is_hybrid() && kvq::SynthParameterCount(*spec) < 10'000'000)
      out.push_back(name);
  }
  return out;
}

// What the test needs to know of a written file: its path and its shape as `kvq plan -m` reads it.
struct HybridFile {
  std::string preset, path;
  int64_t layers = 0, attention_layers = 0;
  int64_t n_heads = 0, head_dim = 0;  // the preset's
};

class HybridMeasureCli : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    files_ = new std::vector<HybridFile>;
    for (const std::string& preset : SmallHybridPresets()) {
      const kvq::SynthSpec spec = *kvq::SynthPreset(preset);
      HybridFile f{.preset = preset,
                   .path = TempPath(preset + ".gguf"),
                   .n_heads = spec.n_heads,
                   .head_dim = spec.head_dim()};
      const KvqRun w = RunKvq("synth --preset " + preset + " -o " + f.path);
      ASSERT_EQ(w.exit_code, 0) << preset << ": " << w.err;
      const KvqRun shape = RunKvq("plan -m " + f.path + " --context 64 --json");
      ASSERT_EQ(shape.exit_code, 0) << preset << ": " << shape.err;
      const nlohmann::json m = nlohmann::json::parse(shape.out)["model"];
      f.layers = m["layers"];
      f.attention_layers = m["attention_layers"];
      files_->push_back(f);
    }
  }
  static void TearDownTestSuite() {
    for (const HybridFile& f : *files_) std::remove(f.path.c_str());
    delete files_;
  }
  static inline std::vector<HybridFile>* files_ = nullptr;
};

TEST_F(HybridMeasureCli, EveryHybridArchitectureHasASmallPreset) {
  // qwen35, qwen35moe and qwen3next: one small preset each, each file a hybrid (some layers
  // recurrent).
  ASSERT_GE(files_->size(), 3u);
  for (const HybridFile& f : *files_) {
    SCOPED_TRACE(f.preset);
    EXPECT_GT(f.attention_layers, 0);
    EXPECT_LT(f.attention_layers, f.layers);
  }
}

TEST_F(HybridMeasureCli, EvalFidelityComparesFormatsWithAnF32Cache) {
  for (const HybridFile& f : *files_) {
    SCOPED_TRACE(f.preset);
    const KvqRun r = RunKvq("eval fidelity -m " + f.path + " --format f32,int8,int2 --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    const int64_t positions = j["positions"];
    EXPECT_GT(positions, 100);
    EXPECT_TRUE(std::isfinite(j["reference_ppl"].get<double>()));
    EXPECT_GT(j["reference_ppl"].get<double>(), 1.0);
    ASSERT_EQ(j["formats"].size(), 3u);
    const nlohmann::json& f32 = j["formats"][0];
    EXPECT_EQ(f32["format"], "f32");
    EXPECT_EQ(f32["kl"].get<double>(), 0.0);  // the reference's own cache: the same bits
    EXPECT_EQ(f32["logit_drift"].get<double>(), 0.0);
    EXPECT_EQ(f32["top1_agree"].get<double>(), 1.0);
    const nlohmann::json& int2 = j["formats"][2];
    EXPECT_EQ(int2["format"], "int2");
    EXPECT_GT(int2["kl"].get<double>(), 0.0);  // the attention layers' KV does reach the logits
    EXPECT_LT(int2["memory_vs_f16"].get<double>(), j["formats"][1]["memory_vs_f16"].get<double>());
    // The table too: one row per format.
    const KvqRun table = RunKvq("eval fidelity -m " + f.path + " --format f32,int2");
    ASSERT_EQ(table.exit_code, 0) << table.err;
    EXPECT_NE(table.out.find("| int2 "), std::string::npos) << table.out;
  }
}

TEST_F(HybridMeasureCli, ALogitsFileReadBackAgreesWithItself) {
  for (const HybridFile& f : *files_) {
    SCOPED_TRACE(f.preset);
    const std::string base = TempPath(f.preset + ".logits");
    const KvqRun w =
        RunKvq("eval fidelity -m " + f.path + " -c 64 --kv f32 --kl-divergence-base-out " + base);
    ASSERT_EQ(w.exit_code, 0) << w.err;
    const KvqRun r =
        RunKvq("eval fidelity -m " + f.path + " --kv f32 --json --kl-divergence-base " + base);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["n_ctx"], 64);
    EXPECT_GT(j["n_chunk"].get<int64_t>(), 1);
    const nlohmann::json& c = j["comparison"];
    EXPECT_EQ(c["count"], j["positions"]);
    EXPECT_EQ(c["same_top"]["fraction"].get<double>(), 1.0);
    // Only the file's 16-bit log-probabilities separate the two (the bound of
    // kl_divergence_test.cc).
    EXPECT_LE(std::abs(c["kl"]["mean"].get<double>()), 1.3e-4);
    EXPECT_LE(c["kl"]["quantiles"]["max"].get<double>(), 1.3e-4);
    EXPECT_GE(c["kl"]["quantiles"]["min"].get<double>(), -1.3e-4);
    // Another KV spec against the same file: visibly worse.
    const KvqRun int2 =
        RunKvq("eval fidelity -m " + f.path + " --kv int2 --json --kl-divergence-base " + base);
    ASSERT_EQ(int2.exit_code, 0) << int2.err;
    EXPECT_GT(nlohmann::json::parse(int2.out)["comparison"]["kl"]["mean"].get<double>(), 1e-3);
    std::remove(base.c_str());
  }
}

TEST_F(HybridMeasureCli, EvalAttentionMeasuresTheAttentionLayers) {
  for (const HybridFile& f : *files_) {
    SCOPED_TRACE(f.preset);
    const KvqRun r =
        RunKvq("eval attention -m " + f.path + " --format f32,int4 --contexts 16,64,200 --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["shape"]["layers"], f.attention_layers);
    ASSERT_EQ(j["results"].size(), 6u);  // 2 formats x 3 contexts
    for (const nlohmann::json& row : j["results"]) {
      SCOPED_TRACE(row.dump());
      EXPECT_EQ(row["positions_attended"], row["context"]);
      EXPECT_FALSE(row["top1_changed"].is_null());
      EXPECT_GT(row["reference_mean_abs"].get<double>(), 0.0);
      if (row["format"] == "f32") {
        EXPECT_EQ(row["max_abs_error"].get<double>(), 0.0);
        EXPECT_EQ(row["top1_changed"], false);  // the substituted output is the model's own
      } else {
        EXPECT_GT(row["mean_abs_error"].get<double>(), 0.0);
      }
    }
    // A recurrent layer has no KV to measure: refused, naming the layers that attend.
    const KvqRun recurrent = RunKvq("eval attention -m " + f.path + " --layer 0 --contexts 16");
    EXPECT_EQ(recurrent.exit_code, 2) << recurrent.err;
    EXPECT_NE(recurrent.err.find("--layer 0: the model's layers with attention"), std::string::npos)
        << recurrent.err;
  }
}

TEST_F(HybridMeasureCli, PlanAutoPlansOneEntryPerAttentionLayer) {
  for (const HybridFile& f : *files_) {
    SCOPED_TRACE(f.preset);
    const std::string plan = TempPath(f.preset + ".plan.json");
    const KvqRun r = RunKvq("plan --auto -m " + f.path +
                            " -c 96 --kv-bits 4.5 --candidates int2,int8 -o " + plan + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["plan"]["model"]["n_layers"], f.attention_layers);
    EXPECT_EQ(j["plan"]["layers"].size(), static_cast<size_t>(f.attention_layers));
    EXPECT_EQ(j["sensitivity"].size(),
              static_cast<size_t>(2 * 2 * f.attention_layers));  // K|V x 2 candidates
    EXPECT_LE(j["plan"]["bits_per_number"].get<double>(), 4.5);
    EXPECT_GT(j["measured"]["kl"].get<double>(), 0.0);
    // The plan file is an arm of eval fidelity on the same model.
    const KvqRun arm = RunKvq("eval fidelity -m " + f.path + " --kv-plan " + plan + " --json");
    ASSERT_EQ(arm.exit_code, 0) << arm.err;
    EXPECT_EQ(nlohmann::json::parse(arm.out)["formats"].size(), 1u);
    std::remove(plan.c_str());
  }
}

TEST_F(HybridMeasureCli, BenchPrefillTimesAPrompt) {
  for (const HybridFile& f : *files_) {
    SCOPED_TRACE(f.preset);
    const KvqRun r =
        RunKvq("bench prefill -m " + f.path + " --format f16,int4 --prompt-len 64 --reps 1 --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    ASSERT_EQ(j["results"].size(), 2u);
    for (const nlohmann::json& row : j["results"]) {
      SCOPED_TRACE(row.dump());
      EXPECT_EQ(row["length"], 64);
      EXPECT_GT(row["tokens_per_second"].get<double>(), 0.0);
      EXPECT_GT(row["attention_share"].get<double>(), 0.0);
      // The attention layers only: each of 64 positions p attends p + 1 positions, per query head.
      const int64_t per_layer = 64 * 65 / 2 * 2 * f.n_heads * f.head_dim;
      EXPECT_EQ(row["attention_macs"], f.attention_layers * per_layer);
    }
  }
}

}  // namespace
