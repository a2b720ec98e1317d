// `kvq plan --auto`'s measurement on the bundled stories260K and text: every (layer, K|V,
// candidate) is measured, the plan fits its budget exactly as counted, its predicted KL is the sum
// of its tensors' KLs, its measured KL is a plain fidelity run of it, and at 4.5 bits per number it
// is damaged less than every candidate used alone for the whole cache within that budget.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "measure/kv_plan_auto.h"
#include "model/load_model.h"

namespace kvq {
namespace {

const std::string kModelDir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";
const std::string kText = std::string(KVQ_SOURCE_DIR) + "/data/eval/tinystories-eval.txt";

TEST(AutoPlan, BeatsEveryUniformSpecWithinItsBudget) {
  Result<LoadedModel> loaded = LoadModel(kModelDir + "stories260K.bin", kModelDir + "tok512.bin");
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  std::ifstream in(kText, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  const std::vector<int32_t> tokens =
      MakeFidelityInput(loaded->tokenizer, text.str(), loaded->weights.config.seq_len).tokens;
  const ModelFingerprint fingerprint = Fingerprint(loaded->weights);
  DecoderModel model(std::move(loaded.value().weights), 1);
  const DecoderConfig& c = model.config();
  const KvShape shape{.n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim()};
  const int64_t n = static_cast<int64_t>(tokens.size());

  AutoPlanConfig config{.budget = {.kv_bits = 4.5}};
  for (const char* s : {"int2", "int2-kivi", "int4-kivi", "fp4-e2m1", "int4+rot"}) config.candidates.push_back(*ParseKvSpec(s));
  const Result<AutoPlanResult> r = AutoPlan(model, tokens, fingerprint, config, {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  const KvPlan& plan = r->plan;
  ASSERT_EQ(r->costs.size(), static_cast<size_t>(2 * c.n_layers) * config.candidates.size());
  ASSERT_EQ(plan.layers.size(), static_cast<size_t>(c.n_layers));
  EXPECT_EQ(plan.model, fingerprint);
  EXPECT_EQ(plan.positions, n);
  EXPECT_TRUE(r->exact);
  // The budget, counted exactly at n positions: ⌊4.5 · numbers / 8⌋ bytes.
  EXPECT_EQ(r->budget_bytes, static_cast<int64_t>(4.5 * 2 * c.n_layers * n * shape.row().elems() / 8));
  EXPECT_EQ(plan.kv_bytes, *KvBytesForContext(plan.layers, shape, n));
  EXPECT_LE(plan.kv_bytes, r->budget_bytes);
  EXPECT_LE(plan.bits_per_number, 4.5);
  // Predicted: the chosen tensors' own KLs, summed layer by layer, K before V.
  double predicted = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (const bool value : {false, true}) {
      const KvSpec chosen = value ? plan.layers[l].Value() : plan.layers[l].Key();
      int found = 0;
      for (const KvTensorCost& cost : r->costs) {
        if (cost.layer == l && cost.value == value && cost.spec == chosen) {
          predicted += cost.kl;
          ++found;
        }
      }
      EXPECT_EQ(found, 1) << "layer " << l << (value ? " V" : " K");
    }
  }
  EXPECT_EQ(plan.predicted_kl, predicted);
  // Measured: the same as a fidelity run of the plan beside the uniform candidates.
  FidelityConfig uniform;
  for (const KvSpec& s : config.candidates) uniform.arms.push_back(FidelityArm::Uniform(s));
  uniform.arms.push_back({.name = "plan", .layers = plan.layers});
  const Result<FidelityReport> f = RunFidelity(model, tokens, uniform, {});
  ASSERT_TRUE(f.ok()) << f.status().message();
  const FidelityRow& plan_row = f->formats.back();
  EXPECT_EQ(plan_row.kl, plan.measured_kl);
  EXPECT_EQ(plan_row.kl, r->measured.kl);
  int within_budget = 0;
  for (size_t i = 0; i + 1 < f->formats.size(); ++i) {
    const FidelityRow& u = f->formats[i];
    if (u.bits_per_number > 4.5) continue;
    ++within_budget;
    EXPECT_LT(plan_row.kl, u.kl) << u.format << " at " << u.bits_per_number << " bits";
  }
  EXPECT_GE(within_budget, 2);  // int2 (4 bits) and fp4-e2m1 (4.5) at least
  // The file round-trips and belongs to this model.
  const Result<KvPlan> back = ParseKvPlan(KvPlanJson(plan));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->layers, plan.layers);
  EXPECT_TRUE(CheckKvPlanModel(*back, fingerprint).ok());
  EXPECT_TRUE(CheckKvPlanBits(*back, 4.5).ok());
}

TEST(AutoPlan, RefusesABudgetNoChoiceFits) {
  Result<LoadedModel> loaded = LoadModel(kModelDir + "stories260K.bin", kModelDir + "tok512.bin");
  ASSERT_TRUE(loaded.ok());
  const ModelFingerprint fingerprint = Fingerprint(loaded->weights);
  DecoderModel model(std::move(loaded.value().weights), 1);
  const std::vector<int32_t> tokens = {1, 403, 407, 261, 378, 39, 261, 410};
  AutoPlanConfig config{.candidates = {*ParseKvSpec("int2")}, .budget = {.kv_bits = 3}};  // int2 is 4 bits
  const Result<AutoPlanResult> r = AutoPlan(model, tokens, fingerprint, config, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no choice fits"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("3 bits per number"), std::string::npos) << r.status().message();
  config.budget = {};
  EXPECT_FALSE(AutoPlan(model, tokens, fingerprint, config, {}).ok());  // no budget
}

}  // namespace
}  // namespace kvq
