// Plan files: they round-trip, and damaged files, files for another model or layer count, unknown
// specs and plans over a bits budget are refused with a message naming what was wrong.
#include "plan/kv_plan.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>

namespace kvq {
namespace {

KvPlan SamplePlan() {
  KvPlan p;
  p.model = {.n_layers = 2, .n_kv_heads = 4, .head_dim = 8, .weights_hash = 0x0123456789abcdefull};
  p.positions = 100;
  p.budget.kv_bits = 4.5;
  p.layers = {LayerFormats::Of(*ParseKvSpec("int4-kivi"), *ParseKvSpec("fp4-e2m1")),
              LayerFormats::Of(*ParseKvSpec("int2-kivi+sink4"), *ParseKvSpec("int4+rot"))};
  p.kv_bytes = 1234;
  p.bits_per_number = 4.25;
  p.predicted_kl = 0.04;
  p.measured_kl = 0.05;
  return p;
}

std::string Error(const std::string& json) {
  const Result<KvPlan> p = ParseKvPlan(json);
  return p.ok() ? "" : p.status().message();
}

TEST(KvPlanFile, RoundTrips) {
  const KvPlan p = SamplePlan();
  const std::string text = KvPlanJson(p);
  EXPECT_EQ(text.find("{\n  \"kvq_plan\": 1,"), 0u) << text;
  EXPECT_NE(text.find("\"weights_hash\": \"0123456789abcdef\""), std::string::npos) << text;
  const Result<KvPlan> q = ParseKvPlan(text);
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_EQ(q->model, p.model);
  EXPECT_EQ(q->positions, 100);
  EXPECT_EQ(q->budget.kv_bits, 4.5);
  EXPECT_EQ(q->layers, p.layers);
  EXPECT_EQ(q->kv_bytes, 1234);
  EXPECT_EQ(q->measured_kl, 0.05);
  EXPECT_TRUE(CheckKvPlanModel(*q, p.model).ok());
  KvPlan bytes = p;
  bytes.budget = {.bytes_per_token = 180};
  EXPECT_EQ(ParseKvPlan(KvPlanJson(bytes))->budget.bytes_per_token, 180);
}

TEST(KvPlanFile, DamagedFilesAreRefusedSayingWhatIsWrong) {
  const std::string good = KvPlanJson(SamplePlan());
  EXPECT_NE(Error(good.substr(0, good.size() / 2)).find("not valid JSON"), std::string::npos);
  EXPECT_NE(Error("").find("not valid JSON"), std::string::npos);
  EXPECT_NE(Error("[1, 2]").find("JSON object"), std::string::npos);
  EXPECT_NE(Error("{\"layers\": []}").find("\"kvq_plan\""), std::string::npos);
  auto edited = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return Error(s.replace(at, from.size(), to));
  };
  EXPECT_NE(edited("\"kvq_plan\": 1", "\"kvq_plan\": 2").find("version 2"), std::string::npos);
  EXPECT_NE(edited("\"n_layers\": 2", "\"n_layers\": \"2\"").find("n_layers"), std::string::npos);
  EXPECT_NE(edited("0123456789abcdef", "0123").find("weights_hash"), std::string::npos);
  EXPECT_NE(edited("0123456789abcdef", "0123456789abcdeg").find("hex"), std::string::npos);
  EXPECT_NE(edited("\"positions\": 100", "\"positions\": 0").find("positions"), std::string::npos);
  EXPECT_NE(edited("\"kv_bits\": 4.5", "\"kv_bits\": -1").find("kv_bits"), std::string::npos);
  // An unknown spec names its layer and the spec.
  const std::string unknown = edited("\"int2-kivi+sink4\"", "\"int3+sink4\"");
  EXPECT_NE(unknown.find("layers[1]"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("int3"), std::string::npos) << unknown;
  EXPECT_NE(edited("\"int4+rot\"", "\"int4+spin\"").find("spin"), std::string::npos);
  EXPECT_NE(edited("\"k\": \"int4-kivi\"", "\"key\": \"int4-kivi\"").find("\"k\""), std::string::npos);
}

TEST(KvPlanFile, AnotherModelOrLayerCountIsRefused) {
  const KvPlan p = SamplePlan();
  ModelFingerprint other = p.model;
  other.weights_hash ^= 1;
  const Status hash = CheckKvPlanModel(p, other);
  ASSERT_FALSE(hash.ok());
  EXPECT_NE(hash.message().find("another model"), std::string::npos) << hash.message();
  EXPECT_NE(hash.message().find("0123456789abcdef"), std::string::npos) << hash.message();
  other = p.model;
  other.head_dim = 16;
  EXPECT_NE(CheckKvPlanModel(p, other).message().find("head_dim 16"), std::string::npos);
  KvPlan short_list = p;
  short_list.layers.pop_back();  // the fingerprint says 2 layers, the list holds 1
  const Status layers = CheckKvPlanModel(short_list, p.model);
  ASSERT_FALSE(layers.ok());
  EXPECT_NE(layers.message().find("1 layers; the model has 2"), std::string::npos) << layers.message();
}

TEST(KvPlanFile, APlanOverABitsBudgetIsRefused) {
  KvPlan p = SamplePlan();
  const KvShape shape{.n_layers = 2, .n_kv_heads = 4, .head_dim = 8};
  const double bits = *KvBitsPerNumber(p.layers, shape, p.positions);  // recounted, not the file's 4.25
  EXPECT_TRUE(CheckKvPlanBits(p, bits).ok());
  const Status over = CheckKvPlanBits(p, bits - 0.01);
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.message().find("bits per number"), std::string::npos) << over.message();
  EXPECT_NE(over.message().find("100 positions"), std::string::npos) << over.message();
}

TEST(KvPlanFile, ReadNamesTheFile) {
  const std::string path = testing::TempDir() + "/kvq_plan_test_" + std::to_string(getpid()) + ".json";
  const KvPlan p = SamplePlan();
  ASSERT_TRUE(WriteKvPlan(path, p).ok());
  const Result<KvPlan> back = ReadKvPlan(path, p.model);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->layers, p.layers);
  ModelFingerprint other = p.model;
  other.n_layers = 3;
  const Result<KvPlan> wrong = ReadKvPlan(path, other);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().message().find(path + ": the plan is for another model"), 0u) << wrong.status().message();
  { std::ofstream(path, std::ios::trunc) << "{\"kvq_plan\": 1, \"mod"; }
  const Result<KvPlan> damaged = ReadKvPlan(path, p.model);
  ASSERT_FALSE(damaged.ok());
  EXPECT_EQ(damaged.status().message().find(path + ": not valid JSON"), 0u) << damaged.status().message();
  std::remove(path.c_str());
  EXPECT_NE(ReadKvPlan(path, p.model).status().message().find("cannot open"), std::string::npos);
}

}  // namespace
}  // namespace kvq
