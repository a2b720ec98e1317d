// The C API (include/kvq.h) as a C caller sees it: NULL handles and bad buffers are errors with a
// message, the tokenize/detokenize buffer contracts, a step-by-step decode equal to generate.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvq.h"

namespace {

const std::string kDir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";

kvq_model* LoadBundled() {
  kvq_model_options o;
  kvq_model_options_init(&o);
  const std::string tok = kDir + "tok512.bin";
  o.tokenizer_path = tok.c_str();
  o.threads = 1;
  kvq_model* m = kvq_model_load((kDir + "stories260K.bin").c_str(), &o);
  EXPECT_NE(m, nullptr) << kvq_last_error();
  return m;
}

TEST(CApi, NullHandlesAreErrorsNotCrashes) {
  EXPECT_EQ(kvq_model_load(nullptr, nullptr), nullptr);
  EXPECT_NE(std::string(kvq_last_error()).find("path is NULL"), std::string::npos);
  EXPECT_EQ(kvq_session_new(nullptr, nullptr), nullptr);
  EXPECT_NE(std::string(kvq_last_error()).find("model is NULL"), std::string::npos);
  EXPECT_EQ(kvq_session_decode(nullptr, 1), KVQ_ERROR);
  EXPECT_EQ(kvq_session_prefill(nullptr, nullptr, 0), KVQ_ERROR);
  EXPECT_EQ(kvq_session_logits(nullptr), nullptr);
  EXPECT_EQ(kvq_session_positions(nullptr), -1);
  EXPECT_EQ(kvq_tokenize(nullptr, "x", -1, nullptr, 0), -1);
  int64_t n = 7;
  EXPECT_EQ(kvq_session_generate(nullptr, "x", nullptr, nullptr, nullptr, &n), KVQ_ERROR);
  EXPECT_EQ(n, 0);
  kvq_model_free(nullptr);
  kvq_session_free(nullptr);
  EXPECT_EQ(kvq_model_load("/nonexistent/m.gguf", nullptr), nullptr);
  EXPECT_NE(std::string(kvq_last_error()).find("/nonexistent/m.gguf"), std::string::npos);
}

TEST(CApi, TokenizeAndDetokenizeBufferContracts) {
  kvq_model* m = LoadBundled();
  ASSERT_NE(m, nullptr);
  const char* text = "Once upon a time";
  const int64_t n = kvq_tokenize(m, text, -1, nullptr, 0);  // ask for the size
  ASSERT_GT(n, 2);
  std::vector<int32_t> ids(n);
  EXPECT_EQ(kvq_tokenize(m, text, -1, ids.data(), 2), n);  // too small: the count, 2 ids written
  EXPECT_EQ(kvq_tokenize(m, text, -1, ids.data(), n), n);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(kvq_tokenize(m, text, 0, ids.data(), n), n - 1);  // without BOS
  ASSERT_EQ(kvq_tokenize(m, text, 1, ids.data(), n), n);
  char buf[64];
  EXPECT_EQ(kvq_detokenize(m, ids.data(), n, buf, sizeof buf), static_cast<int64_t>(std::string(text).size()));
  EXPECT_EQ(std::string(buf), text);
  char small[5];
  EXPECT_EQ(kvq_detokenize(m, ids.data(), n, small, sizeof small), 16);  // cut: 4 bytes + NUL
  EXPECT_EQ(std::string(small), "Once");
  const int32_t bad = 512;
  EXPECT_EQ(kvq_detokenize(m, &bad, 1, buf, sizeof buf), -1);
  EXPECT_NE(std::string(kvq_last_error()).find("outside the vocabulary"), std::string::npos);
  kvq_model_info info;
  kvq_model_get_info(m, &info);
  EXPECT_EQ(info.vocab_size, 512);
  EXPECT_EQ(std::string(info.architecture), "llama");
  kvq_model_free(m);
}

TEST(CApi, StepByStepEqualsGenerate) {
  kvq_model* m = LoadBundled();
  ASSERT_NE(m, nullptr);
  kvq_session* a = kvq_session_new(m, nullptr);
  kvq_session* b = kvq_session_new(m, nullptr);
  ASSERT_TRUE(a && b) << kvq_last_error();
  kvq_generate_options go;
  kvq_generate_options_init(&go);
  go.max_tokens = 30;
  go.temperature = 0;
  std::vector<int32_t> generated;
  auto collect = [](int32_t token, const char*, void* user) {
    static_cast<std::vector<int32_t>*>(user)->push_back(token);
    return 1;
  };
  int64_t n = 0;
  ASSERT_EQ(kvq_session_generate(a, "Lily and Ben", &go, collect, &generated, &n), KVQ_OK) << kvq_last_error();
  ASSERT_EQ(n, 30);
  EXPECT_EQ(kvq_session_logits(b), nullptr);
  EXPECT_EQ(kvq_session_sample(b), -1);
  int32_t ids[16];
  const int64_t n_prompt = kvq_tokenize(m, "Lily and Ben", -1, ids, 16);
  ASSERT_EQ(kvq_session_prefill(b, ids, n_prompt), KVQ_OK);
  kvq_session_set_sampler(b, &go);  // temperature 0: greedy
  for (int32_t want : generated) {
    ASSERT_EQ(kvq_session_sample(b), want);
    ASSERT_EQ(kvq_session_decode(b, want), KVQ_OK);
  }
  EXPECT_EQ(kvq_session_positions(b), n_prompt + 30);
  EXPECT_EQ(kvq_session_truncate(b, n_prompt + 31), KVQ_ERROR);
  EXPECT_EQ(kvq_session_truncate(b, 3), KVQ_OK);
  EXPECT_EQ(kvq_session_positions(b), 3);
  kvq_session_free(a);
  kvq_session_free(b);
  kvq_model_free(m);
}

TEST(CApi, PerLayerFormatsAndRefusals) {
  kvq_model* m = LoadBundled();
  ASSERT_NE(m, nullptr);
  const char* keys[5] = {"f16", "f16", "int8", "int8", "int8"};
  const char* values[5] = {"f16", "f16", "int4", "int4", "int4"};
  kvq_model_options kv;
  kvq_model_options_init(&kv);
  kv.n_kv_layers = 5;
  kv.kv_layer_key_formats = keys;
  kv.kv_layer_value_formats = values;
  kvq_session* planned = kvq_session_new(m, &kv);
  kvq_session* f16 = kvq_session_new(m, nullptr);
  ASSERT_TRUE(planned && f16) << kvq_last_error();
  int32_t ids[16];
  const int64_t n = kvq_tokenize(m, "Once upon a time", -1, ids, 16);
  ASSERT_EQ(kvq_session_prefill(planned, ids, n), KVQ_OK);
  ASSERT_EQ(kvq_session_prefill(f16, ids, n), KVQ_OK);
  EXPECT_LT(kvq_session_kv_bytes(planned), kvq_session_kv_bytes(f16));
  kv.n_kv_layers = 4;  // not one per layer
  EXPECT_EQ(kvq_session_new(m, &kv), nullptr);
  EXPECT_NE(std::string(kvq_last_error()).find("5 layers"), std::string::npos) << kvq_last_error();
  kv.n_kv_layers = 5;
  keys[3] = "int3";
  EXPECT_EQ(kvq_session_new(m, &kv), nullptr);
  EXPECT_NE(std::string(kvq_last_error()).find("layers[3].key"), std::string::npos) << kvq_last_error();
  kvq_session_free(planned);
  kvq_session_free(f16);
  kvq_model_free(m);
}

}  // namespace
