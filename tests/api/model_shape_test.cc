// kvq/model_shape.h: a model file's shape read without loading it agrees with what Model::Load
// reports, on a dense model (GGUF and llama2.c) and a hybrid; its cache plans are a session's.
#include "kvq/model_shape.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "kvq/kv_spec.h"
#include "kvq/model.h"
#include "synth/synth.h"

namespace kvq {
namespace {

const std::string kStories = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/stories260K";

// ModelFile::Read(path)'s shape and Model::Load(path)'s info, field by field.
void ExpectShapeIsLoadedInfo(const std::string& path) {
  SCOPED_TRACE(path);
  Result<ModelFile> file = ModelFile::Read(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  Result<std::unique_ptr<Model>> model = Model::Load(path, {.threads = 1});
  ASSERT_TRUE(model.ok()) << model.status().message();
  const ModelShape& s = file->shape();
  const ModelInfo& i = (*model)->info();
  EXPECT_EQ(s.architecture, i.architecture);
  EXPECT_EQ(s.n_layers, i.n_layers);
  EXPECT_EQ(s.n_attention_layers, i.n_attention_layers);
  EXPECT_EQ(s.n_kv_heads, i.n_kv_heads);
  EXPECT_EQ(s.head_dim, i.head_dim);
  EXPECT_EQ(s.state_bytes, i.state_bytes);
  EXPECT_EQ(s.trained_context, i.trained_context);
}

// tiny-qwen35 (f32) written to a temporary file: its path, "" with a failure added.
std::string WriteHybrid() {
  Result<SynthSpec> spec = SynthPreset("tiny-qwen35");
  if (!spec.ok()) {
    ADD_FAILURE() << spec.status().message();
    return "";
  }
  spec.value().type = "f32";
  const std::string path = ::testing::TempDir() + "/kvq_model_shape_" + std::to_string(::getpid()) + ".gguf";
  if (Status s = WriteSynthModel(*spec, kStories + ".gguf", path); !s.ok()) {
    ADD_FAILURE() << s.message();
    return "";
  }
  return path;
}

TEST(ModelShape, IsWhatLoadReportsForDenseAndHybridFiles) {
  ExpectShapeIsLoadedInfo(kStories + ".gguf");
  ExpectShapeIsLoadedInfo(kStories + ".bin");
  const std::string hybrid = WriteHybrid();
  ASSERT_FALSE(hybrid.empty());
  ExpectShapeIsLoadedInfo(hybrid);
  Result<ModelFile> file = ModelFile::Read(hybrid);
  std::filesystem::remove(hybrid);
  ASSERT_TRUE(file.ok()) << file.status().message();
  // A hybrid indeed: fewer layers with KV than layers, and a recurrent state.
  EXPECT_LT(file->shape().n_attention_layers, file->shape().n_layers);
  EXPECT_GT(file->shape().state_bytes, 0);
}

TEST(ModelShape, CacheConfigIsTheModelsCacheAtAnyLength) {
  const std::string hybrid = WriteHybrid();
  ASSERT_FALSE(hybrid.empty());
  Result<ModelFile> file = ModelFile::Read(hybrid);
  std::filesystem::remove(hybrid);
  ASSERT_TRUE(file.ok()) << file.status().message();
  const ModelShape& s = file->shape();
  // Past the trained context too: a plan, not a session.
  const int64_t positions = s.trained_context + 1000;
  Result<KvCacheConfig> c = file->CacheConfig(positions, {.key_format = "int4+rot", .value_format = "int8"});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->n_layers, s.n_attention_layers);
  EXPECT_EQ(c->n_kv_heads, s.n_kv_heads);
  EXPECT_EQ(c->head_dim, s.head_dim);
  EXPECT_EQ(c->state_floats * 4, s.state_bytes);
  EXPECT_EQ(c->max_positions, positions);
  ASSERT_EQ(c->layers.size(), 1u);
  EXPECT_TRUE(c->layers[0] == LayerFormats::Of(*ParseKvSpec("int4+rot"), *ParseKvSpec("int8")));
  Result<KvTierPlan> plan = KvCache::Plan(*c);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->state_bytes, s.state_bytes);

  // The checks a session's KvOptions get: a format by field, a one-entry plan, a budget, a length.
  Result<KvCacheConfig> bad = file->CacheConfig(100, {.key_format = "int3"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("KvOptions::key_format"), std::string::npos) << bad.status().message();
  bad = file->CacheConfig(100, {.layers = {{"f16", "f16"}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("layers has 1 entry"), std::string::npos) << bad.status().message();
  bad = file->CacheConfig(100000, {.budgets = {.host_bytes = 1024}});
  EXPECT_FALSE(bad.ok());
  bad = file->CacheConfig(0, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("max_positions"), std::string::npos) << bad.status().message();
}

TEST(ModelShape, AMissingFileIsNamed) {
  Result<ModelFile> file = ModelFile::Read("/nonexistent/model.gguf");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("/nonexistent/model.gguf"), std::string::npos) << file.status().message();
}

}  // namespace
}  // namespace kvq
