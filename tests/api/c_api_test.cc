// The C API (include/kvq.h) as a C caller sees it: NULL handles and bad buffers are errors with a
// message, the tokenize/detokenize buffer contracts, a step-by-step decode equal to generate, the
// abort callback, threads, logits at chosen positions, the version, the model info's fields and
// the struct_size checks.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kvq.h"
#include "kvq/model.h"
#include "synth/synth.h"

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
  kvq_model_info_init(&info);
  ASSERT_EQ(kvq_model_get_info(m, &info), KVQ_OK) << kvq_last_error();
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
  EXPECT_EQ(kvq_session_finish_reason(a), KVQ_FINISH_LENGTH);
  EXPECT_EQ(kvq_session_finish_reason(b), -1);  // no generate yet
  EXPECT_EQ(kvq_session_finish_reason(nullptr), -1);
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

// Stop strings and the finish reason: the text ends before the stop string, with KVQ_FINISH_STOP.
TEST(CApi, StopStringsEndWithStop) {
  kvq_model* m = LoadBundled();
  ASSERT_NE(m, nullptr);
  kvq_session* s = kvq_session_new(m, nullptr);
  ASSERT_NE(s, nullptr) << kvq_last_error();
  kvq_generate_options go;
  kvq_generate_options_init(&go);
  go.max_tokens = 40;
  go.temperature = 0;
  std::string text;
  auto append = [](int32_t, const char* piece, void* user) {
    *static_cast<std::string*>(user) += piece;
    return 1;
  };
  ASSERT_EQ(kvq_session_generate(s, "Once upon a time", &go, append, &text, nullptr), KVQ_OK) << kvq_last_error();
  const size_t cut = text.find(' ', 10);
  ASSERT_NE(cut, std::string::npos) << text;
  const std::string stop = text.substr(cut, 4);
  const char* stops[] = {stop.c_str()};
  go.stop = stops;
  go.n_stop = 1;
  std::string cut_text;
  ASSERT_EQ(kvq_session_generate(s, "Once upon a time", &go, append, &cut_text, nullptr), KVQ_OK) << kvq_last_error();
  EXPECT_EQ(cut_text, text.substr(0, text.find(stop)));
  EXPECT_EQ(kvq_session_finish_reason(s), KVQ_FINISH_STOP);
  go.stop = nullptr;
  EXPECT_EQ(kvq_session_generate(s, "Once upon a time", &go, nullptr, nullptr, nullptr), KVQ_ERROR);
  EXPECT_NE(std::string(kvq_last_error()).find("n_stop"), std::string::npos) << kvq_last_error();
  EXPECT_EQ(kvq_session_finish_reason(s), -1);  // the failed call reported nothing
  kvq_session_free(s);
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

// kvq_session_run_batch: three sessions stepped together end as each alone with
// kvq_session_prefill of the same tokens; bad arguments are errors naming the item, nothing run.
TEST(CApi, RunBatchEqualsPrefillAloneAndRefusesBadItems) {
  kvq_model* m = LoadBundled();
  ASSERT_NE(m, nullptr);
  kvq_session* batched[3];
  kvq_session* alone[3];
  for (int i = 0; i < 3; ++i) {
    batched[i] = kvq_session_new(m, nullptr);
    alone[i] = kvq_session_new(m, nullptr);
    ASSERT_TRUE(batched[i] && alone[i]) << kvq_last_error();
  }
  int32_t ids[3][16];
  int64_t n[3];
  const char* prompts[3] = {"Once upon a time", "Lily", "The big dog ran to the"};
  for (int i = 0; i < 3; ++i) n[i] = kvq_tokenize(m, prompts[i], -1, ids[i], 16);
  const int32_t* tokens[3] = {ids[0], ids[1], ids[2]};
  ASSERT_EQ(kvq_session_run_batch(batched, tokens, n, 3), KVQ_OK) << kvq_last_error();
  const int32_t next[3] = {7, 8, 9};
  const int32_t* decode[3] = {&next[0], &next[1], &next[2]};
  const int64_t ones[3] = {1, 1, 1};
  ASSERT_EQ(kvq_session_run_batch(batched, decode, ones, 3), KVQ_OK) << kvq_last_error();
  kvq_model_info info;
  kvq_model_info_init(&info);
  ASSERT_EQ(kvq_model_get_info(m, &info), KVQ_OK) << kvq_last_error();
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(kvq_session_prefill(alone[i], ids[i], n[i]), KVQ_OK);
    ASSERT_EQ(kvq_session_decode(alone[i], next[i]), KVQ_OK);
    EXPECT_EQ(kvq_session_positions(batched[i]), n[i] + 1);
    EXPECT_EQ(kvq_session_kv_bytes(batched[i]), kvq_session_kv_bytes(alone[i]));
    EXPECT_EQ(std::memcmp(kvq_session_logits(batched[i]), kvq_session_logits(alone[i]),
                          sizeof(float) * info.vocab_size),
              0)
        << "session " << i;
  }
  auto refused = [&](kvq_session* const* s, const int32_t* const* t, const int64_t* k,
                     int32_t items, const std::string& part) {
    EXPECT_EQ(kvq_session_run_batch(s, t, k, items), KVQ_ERROR);
    EXPECT_NE(std::string(kvq_last_error()).find(part), std::string::npos) << kvq_last_error();
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(kvq_session_positions(batched[i]), n[i] + 1) << kvq_last_error();
  };
  refused(batched, decode, ones, 0, "n_items must be at least 1");
  refused(nullptr, decode, ones, 3, "sessions is NULL");
  refused(batched, nullptr, ones, 3, "tokens is NULL");
  refused(batched, decode, nullptr, 3, "n_tokens is NULL");
  kvq_session* with_null[3] = {batched[0], nullptr, batched[2]};
  refused(with_null, decode, ones, 3, "item 1: the session is NULL");
  const int64_t zero[3] = {1, 1, 0};
  refused(batched, decode, zero, 3, "item 2: n_tokens is 0");
  const int32_t* null_list[3] = {decode[0], nullptr, decode[2]};
  refused(batched, null_list, ones, 3, "item 1: the token list is NULL");
  kvq_session* twice[3] = {batched[0], batched[1], batched[0]};
  refused(twice, decode, ones, 3, "items 0 and 2 are the same session");
  const int32_t outside = 512;
  const int32_t* bad[3] = {decode[0], decode[1], &outside};
  refused(batched, bad, ones, 3, "item 2: token 512");
  for (int i = 0; i < 3; ++i) {
    kvq_session_free(batched[i]);
    kvq_session_free(alone[i]);
  }
  kvq_model_free(m);
}

// The abort callback's user pointer: counts calls and fires on call `fire_at`.
struct AbortCount {
  int fire_at;
  int calls;
};
int CountAndAbort(void* user) {
  AbortCount* a = static_cast<AbortCount*>(user);
  return ++a->calls >= a->fire_at ? 1 : 0;
}

TEST(CApi, AbortCallbackStopsPrefillBetweenBlocksAndGenerateAsCancelled) {
  kvq_model* m = LoadBundled();
  ASSERT_NE(m, nullptr);
  kvq_session* s = kvq_session_new(m, nullptr);
  ASSERT_NE(s, nullptr) << kvq_last_error();
  EXPECT_EQ(kvq_session_set_abort_callback(nullptr, CountAndAbort, nullptr), KVQ_ERROR);
  std::vector<int32_t> ids(200);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i * 7 % 512);
  AbortCount a{.fire_at = 2, .calls = 0};
  ASSERT_EQ(kvq_session_set_abort_callback(s, CountAndAbort, &a), KVQ_OK);
  EXPECT_EQ(kvq_session_prefill(s, ids.data(), 200), KVQ_ERROR);
  EXPECT_NE(std::string(kvq_last_error()).find("aborted"), std::string::npos) << kvq_last_error();
  EXPECT_EQ(a.calls, 2);
  EXPECT_EQ(kvq_session_positions(s), 128);
  EXPECT_EQ(kvq_session_logits(s), nullptr);
  ASSERT_EQ(kvq_session_set_abort_callback(s, nullptr, nullptr), KVQ_OK);  // removed
  ASSERT_EQ(kvq_session_prefill(s, ids.data() + 128, 72), KVQ_OK) << kvq_last_error();
  EXPECT_EQ(kvq_session_positions(s), 200);

  a = {.fire_at = 1, .calls = 0};
  ASSERT_EQ(kvq_session_set_abort_callback(s, CountAndAbort, &a), KVQ_OK);
  kvq_generate_options go;
  kvq_generate_options_init(&go);
  go.temperature = 0;
  int64_t n = -1;
  ASSERT_EQ(kvq_session_generate(s, "Once upon a time", &go, nullptr, nullptr, &n), KVQ_OK) << kvq_last_error();
  EXPECT_EQ(n, 0);
  EXPECT_EQ(kvq_session_finish_reason(s), KVQ_FINISH_CANCELLED);
  kvq_session_free(s);
  kvq_model_free(m);
}

TEST(CApi, SetThreadsChangesNoBitAndRefusesBadCounts) {
  kvq_model* m = LoadBundled();  // 1 thread
  ASSERT_NE(m, nullptr);
  kvq_session* one = kvq_session_new(m, nullptr);
  kvq_session* three = kvq_session_new(m, nullptr);
  ASSERT_TRUE(one && three) << kvq_last_error();
  EXPECT_EQ(kvq_session_set_threads(nullptr, 2), KVQ_ERROR);
  EXPECT_EQ(kvq_session_set_threads(three, 0), KVQ_ERROR);
  EXPECT_NE(std::string(kvq_last_error()).find("1..1024 (got 0)"), std::string::npos) << kvq_last_error();
  ASSERT_EQ(kvq_session_set_threads(three, 3), KVQ_OK) << kvq_last_error();
  int32_t ids[100];
  for (int i = 0; i < 100; ++i) ids[i] = (i * 13 + 5) % 512;
  ASSERT_EQ(kvq_session_prefill(one, ids, 100), KVQ_OK);
  ASSERT_EQ(kvq_session_prefill(three, ids, 100), KVQ_OK);
  kvq_model_info info;
  kvq_model_info_init(&info);
  ASSERT_EQ(kvq_model_get_info(m, &info), KVQ_OK) << kvq_last_error();
  EXPECT_EQ(std::memcmp(kvq_session_logits(one), kvq_session_logits(three),
                        sizeof(float) * info.vocab_size),
            0);
  kvq_session_free(one);
  kvq_session_free(three);
  kvq_model_free(m);
}

TEST(CApi, PrefillLogitsAtEqualsDecodingOneAtATime) {
  kvq_model* m = LoadBundled();
  ASSERT_NE(m, nullptr);
  kvq_model_info info;
  kvq_model_info_init(&info);
  ASSERT_EQ(kvq_model_get_info(m, &info), KVQ_OK) << kvq_last_error();
  kvq_session* block = kvq_session_new(m, nullptr);
  kvq_session* step = kvq_session_new(m, nullptr);
  ASSERT_TRUE(block && step) << kvq_last_error();
  int32_t ids[100];
  for (int i = 0; i < 100; ++i) ids[i] = (i * 31 + 2) % 512;
  const int32_t at[3] = {3, 64, 99};
  int64_t rows = -1;
  EXPECT_EQ(kvq_session_chosen_logits(block, &rows), nullptr);
  EXPECT_EQ(rows, 0);
  const int32_t bad[2] = {7, 7};
  EXPECT_EQ(kvq_session_prefill_logits_at(block, ids, 100, bad, 2), KVQ_ERROR);
  EXPECT_NE(std::string(kvq_last_error()).find("logits_at[1] is 7"), std::string::npos) << kvq_last_error();
  EXPECT_EQ(kvq_session_prefill_logits_at(block, ids, 100, nullptr, 2), KVQ_ERROR);
  ASSERT_EQ(kvq_session_prefill_logits_at(block, ids, 100, at, 3), KVQ_OK) << kvq_last_error();
  const float* chosen = kvq_session_chosen_logits(block, &rows);
  ASSERT_NE(chosen, nullptr);
  ASSERT_EQ(rows, 3);
  for (int i = 0, j = 0; i < 100; ++i) {
    ASSERT_EQ(kvq_session_decode(step, ids[i]), KVQ_OK);
    if (j < 3 && at[j] == i) {
      EXPECT_EQ(std::memcmp(chosen + j * info.vocab_size, kvq_session_logits(step),
                            sizeof(float) * info.vocab_size),
                0)
          << "row " << j;
      ++j;
    }
  }
  ASSERT_EQ(kvq_session_decode(block, 1), KVQ_OK);
  EXPECT_EQ(kvq_session_chosen_logits(block, &rows), nullptr);  // a later call names none
  kvq_session_free(block);
  kvq_session_free(step);
  kvq_model_free(m);
}

TEST(CApi, VersionIsTheCliVersion) {
  const std::string v = kvq_version();
  int major = -1, minor = -1, patch = -1;
  ASSERT_EQ(std::sscanf(v.c_str(), "%d.%d.%d", &major, &minor, &patch), 3) << v;
  EXPECT_EQ(v, kvq::Version());
  FILE* p = popen((std::string(KVQ_BINARY) + " --version").c_str(), "r");
  ASSERT_NE(p, nullptr);
  char line[128] = {};
  ASSERT_NE(std::fgets(line, sizeof(line), p), nullptr);
  pclose(p);
  EXPECT_EQ(std::string(line), "kvq " + v + "\n");
}

TEST(CApi, ModelInfoHasAttentionLayersStateAndChatTemplate) {
  kvq_model* m = LoadBundled();  // llama2.c: every layer attends, no template
  ASSERT_NE(m, nullptr);
  kvq_model_info info;
  kvq_model_info_init(&info);
  ASSERT_EQ(kvq_model_get_info(m, &info), KVQ_OK) << kvq_last_error();
  EXPECT_EQ(info.n_attention_layers, info.n_layers);
  EXPECT_EQ(info.state_bytes, 0);
  ASSERT_NE(info.chat_template, nullptr);
  EXPECT_STREQ(info.chat_template, "");
  kvq_model_free(m);

  // A hybrid: 2 of its 4 layers attend, the others hold a recurrent state.
  const std::string path = ::testing::TempDir() + "/kvq_c_api_hybrid_" + std::to_string(::getpid()) + ".gguf";
  kvq::Result<kvq::SynthSpec> spec = kvq::SynthPreset("tiny-qwen35");
  ASSERT_TRUE(spec.ok());
  spec.value().type = "f32";
  ASSERT_TRUE(kvq::WriteSynthModel(*spec, kDir + "stories260K.gguf", path).ok());
  kvq_model* h = kvq_model_load(path.c_str(), nullptr);
  kvq::Result<std::unique_ptr<kvq::Model>> cpp = kvq::Model::Load(path);
  std::filesystem::remove(path);
  ASSERT_NE(h, nullptr) << kvq_last_error();
  ASSERT_TRUE(cpp.ok()) << cpp.status().message();
  ASSERT_EQ(kvq_model_get_info(h, &info), KVQ_OK) << kvq_last_error();
  EXPECT_EQ(info.n_layers, 4);
  EXPECT_EQ(info.n_attention_layers, 2);
  EXPECT_GT(info.state_bytes, 0);
  EXPECT_EQ(info.state_bytes, (*cpp)->info().state_bytes);
  EXPECT_EQ(std::string(info.chat_template), (*cpp)->info().chat_template);
  kvq_model_free(h);
}

// Every options and info struct is read only at a struct_size the library knows: a missing size
// (0), a smaller one and a larger one (a newer kvq.h) are errors naming the call, the struct and
// both sizes, and nothing is loaded, made or written.
TEST(CApi, StructSizesTheLibraryDoesNotKnowAreErrors) {
  const std::string model = kDir + "stories260K.bin", tok = kDir + "tok512.bin";
  kvq_model_options mo;
  kvq_model_options_init(&mo);
  EXPECT_EQ(mo.struct_size, sizeof(kvq_model_options));
  mo.tokenizer_path = tok.c_str();
  // Below the first version's size (the fields before `repack`, appended later) is refused.
  const size_t first = offsetof(kvq_model_options, repack);
  for (const size_t bad : {size_t{0}, first - 8, sizeof(kvq_model_options) + 8}) {
    mo.struct_size = bad;
    EXPECT_EQ(kvq_model_load(model.c_str(), &mo), nullptr);
    const std::string e = kvq_last_error();
    EXPECT_NE(e.find("kvq_model_load: options: struct_size is " + std::to_string(bad)), std::string::npos) << e;
    EXPECT_NE(e.find("kvq_model_options (" + std::to_string(sizeof(kvq_model_options)) + " bytes"),
              std::string::npos) << e;
    if (bad < first) {
      EXPECT_NE(e.find("or " + std::to_string(first) + " as first published"), std::string::npos) << e;
    }
    EXPECT_EQ(e.find("newer kvq.h") != std::string::npos, bad > sizeof(kvq_model_options)) << e;
  }
  // A caller built before `repack` was appended: its struct ends there, and the rest is defaulted
  // (a bad repack value past its size is never read).
  mo.struct_size = first;
  mo.repack = 7;
  kvq_model* old = kvq_model_load(model.c_str(), &mo);
  ASSERT_NE(old, nullptr) << kvq_last_error();
  kvq_model_free(old);
  mo.struct_size = sizeof(kvq_model_options);
  EXPECT_EQ(kvq_model_load(model.c_str(), &mo), nullptr);
  EXPECT_NE(std::string(kvq_last_error()).find("options->repack must be KVQ_REPACK_AUTO"), std::string::npos)
      << kvq_last_error();
  mo.repack = KVQ_REPACK_NONE;
  kvq_model* m = kvq_model_load(model.c_str(), &mo);
  ASSERT_NE(m, nullptr) << kvq_last_error();

  mo.struct_size = 0;
  EXPECT_EQ(kvq_session_new(m, &mo), nullptr);
  EXPECT_NE(std::string(kvq_last_error()).find("kvq_session_new: kv_override: struct_size is 0"), std::string::npos)
      << kvq_last_error();

  kvq_model_info info;
  kvq_model_info_init(&info);
  EXPECT_EQ(info.struct_size, sizeof(kvq_model_info));
  info.struct_size = sizeof(kvq_model_info) + 1;
  info.n_layers = -7;
  EXPECT_EQ(kvq_model_get_info(m, &info), KVQ_ERROR);
  EXPECT_NE(std::string(kvq_last_error()).find("kvq_model_get_info: info: struct_size is"), std::string::npos);
  EXPECT_EQ(info.n_layers, -7);  // nothing written

  kvq_session* s = kvq_session_new(m, nullptr);
  ASSERT_NE(s, nullptr) << kvq_last_error();
  kvq_generate_options go;
  kvq_generate_options_init(&go);
  EXPECT_EQ(go.struct_size, sizeof(kvq_generate_options));
  go.struct_size = 4;
  int64_t n = -1;
  EXPECT_EQ(kvq_session_generate(s, "Once", &go, nullptr, nullptr, &n), KVQ_ERROR);
  EXPECT_NE(std::string(kvq_last_error()).find("kvq_session_generate: options: struct_size is 4"), std::string::npos)
      << kvq_last_error();
  EXPECT_EQ(n, 0);
  EXPECT_EQ(kvq_session_positions(s), 0);  // nothing ran
  kvq_session_free(s);
  kvq_model_free(m);
}

}  // namespace
