// RunPrefillBench on tiny synth models: its prefill leaves the logits the test's own ForwardBlock
// calls leave (bit for bit), the phase shares tile the measured time, the multiply-add counts and
// ceilings match a hand count, and bad configurations and flags are refused with clear errors.
#include "measure/prefill_bench.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "kvq/kv_cache.h"
#include "model/load_model.h"
#include "synth/synth.h"
#include "test_util/run_kvq.h"
#include "weights/weight_type.h"
#include "test_util/bundled_paths.h"

namespace kvq {
namespace {

const std::string kStories = test::BundledGgufPath();

// dim 64, 2 layers, 4 heads of 16 over 2 KV heads, FFN 128, vocab 512 (stories260K's), context 256.
SynthSpec Tiny(const std::string& type) {
  return SynthSpec{.arch = SynthArch::kLlama, .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                   .hidden_dim = 128, .context = 256, .type = type, .seed = 7};
}

// A file for this test (CTest runs each test in its own process, perhaps at once with others).
std::string TestFile(const std::string& stem) {
  return testing::TempDir() + "/prefill_bench_" + testing::UnitTest::GetInstance()->current_test_info()->name() +
         "_" + stem;
}

// The tiny synth model of `type`, or null with the failure recorded.
std::unique_ptr<DecoderModel> TinyModel(const std::string& type, int32_t threads) {
  const std::string path = TestFile(type + ".gguf");
  const Status written = WriteSynthModel(Tiny(type), kStories, path);
  EXPECT_TRUE(written.ok()) << written.message();
  if (!written.ok()) return nullptr;
  Result<LoadedModel> loaded = LoadModel(path, "");
  std::remove(path.c_str());  // (a mapped file stays readable until unmapped)
  EXPECT_TRUE(loaded.ok()) << loaded.status().message();
  if (!loaded.ok()) return nullptr;
  return std::make_unique<DecoderModel>(std::move(loaded->weights), threads);
}

// Peaks with round numbers, so every ceiling is a hand-checkable quotient.
ComputeRoofline FakeRoofline() {
  ComputeRoofline r;
  r.best_f32_gmacs = 2.0;
  r.best_int8_gmacs = 8.0;
  r.best_f32_instruction = "vfmadd231ps zmm";
  r.best_int8_instruction = "vpdpbusd zmm";
  return r;
}

// A prompt that is not one token repeated: 1 (BOS), then 2, 3, ..., wrapping inside the vocabulary.
std::vector<int32_t> Prompt(int64_t n, int32_t vocab) {
  std::vector<int32_t> text;
  for (int32_t t = 2; t < 2 + 97; ++t) text.push_back(t % vocab);
  return RepeatPrompt(1, text, n);
}

TEST(PrefillBench, RepeatPromptIsBosThenTheTextCycled) {
  EXPECT_EQ(RepeatPrompt(1, {5, 6, 7}, 8), (std::vector<int32_t>{1, 5, 6, 7, 5, 6, 7, 5}));
  EXPECT_EQ(RepeatPrompt(1, {5, 6, 7}, 1), (std::vector<int32_t>{1}));
  EXPECT_TRUE(RepeatPrompt(1, {5}, 0).empty());
}

TEST(PrefillBench, MacCountsMatchAHandCount) {
  const std::unique_ptr<DecoderModel> q4 = TinyModel("q4_0", 1);
  const std::unique_ptr<DecoderModel> f16 = TinyModel("f16", 1);
  ASSERT_NE(q4, nullptr);
  ASSERT_NE(f16, nullptr);
  // Per layer: wq 64·64, wk and wv 32·64 each, wo 64·64, w1 and w3 128·64 each, w2 64·128
  // = 4096 + 4096 + 4096 + 24576 = 36864; two layers 73728. Classifier 512·64 = 32768.
  const WeightMacs m4 = CountWeightMacs(q4->weights());
  EXPECT_EQ(m4.int8_per_token, 73728);
  EXPECT_EQ(m4.f32_per_token, 0);
  EXPECT_EQ(m4.int8_classifier, 32768);
  EXPECT_EQ(m4.f32_classifier, 0);
  EXPECT_EQ(m4.ForPrompt(10), 10 * 73728 + 32768);
  const WeightMacs m16 = CountWeightMacs(f16->weights());
  EXPECT_EQ(m16.f32_per_token, 73728) << "F16 runs f32 FMAs, not integer dots";
  EXPECT_EQ(m16.int8_per_token, 0);
  EXPECT_EQ(m16.f32_classifier, 32768);

  // Attention at 3 tokens: positions attend to 1, 2 and 3 positions = 6, each 2 · 4 heads · 16
  // = 128 multiply-adds, in 2 layers: 1536. At 256: 2 · (256·257/2) · 128 = 8,421,376.
  EXPECT_EQ(PrefillAttentionMacs(q4->config(), 3), 1536);
  EXPECT_EQ(PrefillAttentionMacs(q4->config(), 256), 8421376);

  const ComputeRoofline roof = FakeRoofline();
  EXPECT_DOUBLE_EQ(WeightsCeilingSeconds(m4, roof, 10), (10.0 * 73728 + 32768) / 8e9);
  EXPECT_DOUBLE_EQ(WeightsCeilingSeconds(m16, roof, 10), (10.0 * 73728 + 32768) / 2e9);
  EXPECT_EQ(WeightsCeilingInstruction(m4, roof), "vpdpbusd zmm");
  EXPECT_EQ(WeightsCeilingInstruction(m16, roof), "vfmadd231ps zmm");
  const WeightMacs mixed{.int8_per_token = 100, .f32_per_token = 10, .int8_classifier = 0, .f32_classifier = 7};
  EXPECT_DOUBLE_EQ(WeightsCeilingSeconds(mixed, roof, 3), 300 / 8e9 + 37 / 2e9);
  EXPECT_EQ(WeightsCeilingInstruction(mixed, roof), "vpdpbusd zmm + vfmadd231ps zmm");
}

TEST(PrefillBench, LogitsAreThoseOfForwardBlockAndSharesTileTheTime) {
  const std::unique_ptr<DecoderModel> bench_model = TinyModel("q4_0", 2);
  const std::unique_ptr<DecoderModel> own_model = TinyModel("q4_0", 2);
  ASSERT_NE(bench_model, nullptr);
  ASSERT_NE(own_model, nullptr);
  const DecoderConfig& c = bench_model->config();
  // 150 = two whole blocks of 64 and a partial one of 22; 40: a single partial block.
  PrefillBenchConfig config{.formats = {*FindFormat("f16"), *FindFormat("int4")}, .lengths = {150, 40},
                            .prompt = Prompt(150, c.vocab_size), .reps = 2, .roofline = FakeRoofline()};
  Result<std::vector<PrefillBenchRow>> rows = RunPrefillBench(*bench_model, config, {});
  ASSERT_TRUE(rows.ok()) << rows.status().message();
  ASSERT_EQ(rows->size(), 4u);
  const WeightMacs macs = CountWeightMacs(bench_model->weights());
  for (size_t i = 0; i < rows->size(); ++i) {
    const PrefillBenchRow& r = (*rows)[i];
    SCOPED_TRACE(fmt::format("{} at {}", r.format, r.length));
    EXPECT_EQ(r.length, i < 2 ? 150 : 40);
    EXPECT_EQ(r.format, KvSpecName(config.formats[i % 2]));

    // The test's own prefill: ForwardBlock over blocks of 64 into a fresh cache of the format.
    const FormatDesc* f = config.formats[i % 2].format;
    KvCacheConfig cc{.n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim(),
                     .layers = {{f, f}}, .max_positions = r.length, .page_positions = 256};
    Result<std::unique_ptr<KvCache>> cache = KvCache::Create(cc);
    ASSERT_TRUE(cache.ok()) << cache.status().message();
    std::vector<float> logits(c.vocab_size);  // [vocab]
    for (int64_t pos = 0; pos < r.length; pos += 64) {
      const int32_t n = static_cast<int32_t>(std::min<int64_t>(64, r.length - pos));
      ASSERT_TRUE(own_model->ForwardBlock(config.prompt.data() + pos, n, pos, **cache, logits.data()).ok());
    }
    ASSERT_EQ(r.logits.size(), logits.size());
    for (size_t v = 0; v < logits.size(); ++v) ASSERT_EQ(r.logits[v], logits[v]) << "logit " << v;

    // The phases are timed inside each ForwardBlock call, so they never exceed the total. How much
    // of the total they leave out (the call's entry and return) is a wall-clock quantity a preempted
    // thread can stretch at will on a shared machine: it is printed by `kvq bench prefill`, not bounded here.
    const double phases = r.weights_s + r.attention_s + r.rest_s;
    EXPECT_GT(r.weights_s, 0.0);
    EXPECT_GT(r.attention_s, 0.0);
    EXPECT_GT(r.rest_s, 0.0);
    EXPECT_LE(phases, r.total_s);
    EXPECT_DOUBLE_EQ(r.weights_share + r.attention_share + r.rest_share, phases / r.total_s);

    EXPECT_LE(r.s_min, r.s_median);
    EXPECT_GE(r.s_max, r.s_median);
    EXPECT_DOUBLE_EQ(r.tokens_per_second, r.length / r.s_median);
    // The ceilings from the fake peaks: all Q4_0, so the int8 peak of 8 G/s.
    EXPECT_EQ(r.weight_macs, r.length * 73728 + 32768);
    EXPECT_EQ(r.attention_macs, PrefillAttentionMacs(c, r.length));
    EXPECT_DOUBLE_EQ(r.weights_ceiling_tps, r.length / (r.weight_macs / 8e9));
    EXPECT_DOUBLE_EQ(r.pct_of_weights_ceiling, 100 * r.tokens_per_second / r.weights_ceiling_tps);
    EXPECT_DOUBLE_EQ(r.weights_phase_pct, 100 * WeightsCeilingSeconds(macs, config.roofline, r.length) *
                                              config.reps / r.weights_s);
    EXPECT_DOUBLE_EQ(r.attention_ceiling_s, r.attention_macs / 2e9);
    EXPECT_DOUBLE_EQ(r.attention_phase_pct, 100 * r.attention_ceiling_s * config.reps / r.attention_s);
  }
  // The arms really used their own caches: f16 and int4 keys give different logits.
  EXPECT_NE((*rows)[0].logits, (*rows)[1].logits);
}

TEST(PrefillBench, BadConfigurationsAreRefused) {
  const std::unique_ptr<DecoderModel> model = TinyModel("q4_0", 1);
  ASSERT_NE(model, nullptr);
  const PrefillBenchConfig good{.formats = {*FindFormat("int8")}, .lengths = {8},
                                .prompt = Prompt(300, 512), .reps = 1, .roofline = FakeRoofline()};
  auto error = [&](PrefillBenchConfig config) {
    Result<std::vector<PrefillBenchRow>> rows = RunPrefillBench(*model, config, {});
    return rows.ok() ? std::string("ok") : rows.status().message();
  };
  EXPECT_EQ(error(good), "ok");
  PrefillBenchConfig past = good;
  past.lengths = {257};
  EXPECT_EQ(error(past), "prompt length 257 is outside 1..256, the model's context");
  PrefillBenchConfig zero_reps = good;
  zero_reps.reps = 0;
  EXPECT_EQ(error(zero_reps), "prefill bench: reps must be at least 1 (got 0)");
  PrefillBenchConfig short_prompt = good;
  short_prompt.prompt.resize(5);
  EXPECT_EQ(error(short_prompt), "prompt length 8 is longer than the 5 prompt tokens given");
  PrefillBenchConfig no_formats = good;
  no_formats.formats.clear();
  EXPECT_EQ(error(no_formats), "prefill bench: no formats");
}

TEST(PrefillBenchCli, BadFlagsAreRefusedWithClearErrors) {
  const std::string path = TestFile("cli.gguf");
  ASSERT_TRUE(WriteSynthModel(Tiny("q4_0"), kStories, path).ok());
  const std::string m = "bench prefill -m " + path + " ";
  kvq_test::KvqRun r = kvq_test::RunKvq(m + "--prompt-len 64,257");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--prompt-len 257: past the model's context of 256 positions"), std::string::npos) << r.err;
  r = kvq_test::RunKvq(m + "--format f16,nosuch");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("nosuch"), std::string::npos) << r.err;
  r = kvq_test::RunKvq(m + "--reps 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--reps must be in 1..1000 (got 0)"), std::string::npos) << r.err;
  r = kvq_test::RunKvq(m + "--prompt-len 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--prompt-len"), std::string::npos) << r.err;
  r = kvq_test::RunKvq(m + "-f /nonexistent/prompt.txt");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("-f /nonexistent/prompt.txt: cannot read the prompt file"), std::string::npos) << r.err;

  // The defaults past this model's context of 256 are skipped with a reason, and it runs.
  r = kvq_test::RunKvq(m + "--format int4 --reps 1 --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("skipping prompt length 512: past the model's context of 256"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("\"length\": 256"), std::string::npos) << r.out;
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kvq
