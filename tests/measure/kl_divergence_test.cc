// kvq against a llama.cpp logits file on the bundled stories260K: kvq writes one and reads it
// back — KL within the bound the uint16 encoding allows, 100% same top token, Δp within its bound
// — while another KV spec shows real damage against it; the chunking is llama-perplexity's.
#include "measure/kl_divergence.h"

#include <fmt/core.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>

#include "measure/fidelity.h"
#include "model/load_model.h"

namespace kvq {
namespace {

const std::string kModelDir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";
const std::string kText = std::string(KVQ_SOURCE_DIR) + "/data/eval/tinystories-eval.txt";
constexpr int32_t kCtx = 128;  // the bundled text (about 450 tokens) gives 3 chunks

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Bundled {
  std::unique_ptr<DecoderModel> model;
  std::vector<int32_t> text_tokens;  // the whole text, BOS first
  int32_t bos = -1;
};

Bundled Load() {
  Result<LoadedModel> loaded = LoadModel(kModelDir + "stories260K.bin", kModelDir + "tok512.bin");
  EXPECT_TRUE(loaded.ok()) << loaded.status().message();
  if (!loaded.ok()) return {};
  Bundled b;
  b.text_tokens = MakeFidelityInput(loaded->tokenizer, Slurp(kText), -1).tokens;
  b.bos = loaded->tokenizer.add_bos() ? loaded->tokenizer.bos() : -1;
  b.model = std::make_unique<DecoderModel>(std::move(loaded.value().weights), 1);
  return b;
}

const FormatDesc* Format(const char* name) { return *FindFormat(name); }

double QuantileValue(const std::vector<Quantile>& qs, const std::string& name) {
  for (const Quantile& q : qs) {
    if (q.name == name) return q.value;
  }
  ADD_FAILURE() << "no quantile " << name;
  return 0;
}

TEST(KlDivergence, ChunksAreLlamaPerplexitys) {
  const std::vector<int32_t> ids = {7, 1, 2, 3, 4, 5, 6, 8, 9, 10};
  EXPECT_EQ(LlamaChunkTokens(ids, 4), (std::vector<int32_t>{7, 1, 2, 3, 4, 5, 6, 8}));  // tail dropped
  EXPECT_TRUE(LlamaChunkTokens(ids, 11).empty());
}

// The encoding's error bound: a log-probability not clamped is decoded within δ of the exact one,
// δ = 0.51·scale + 1e-5: half a code step (the 0.01 covers the float product inv_scale·(l − min),
// 2^-23 relative of at most 65535 codes) plus float rounding of min_log_prob and scale·q (values
// of magnitude ≤ 16 + log 512 ≈ 22, a few operations at 2^-24 relative: < 1e-5). scale ≤ 16/65535.
// Then per position |KL| = |Σ p_base,i (log p_base,i − log p_i)| ≤ δ·Σ p_base,i ≤ δ·e^δ, and
// |Δp| ≤ max(e^δ − 1, e^-16) (e^-16 when the target's own log-probability was clamped).
TEST(KlDivergence, KvqAgainstItsOwnFileIsWithinTheEncodingBoundAndAgreesOnEveryTopToken) {
  Bundled b = Load();
  ASSERT_NE(b.model, nullptr);
  ASSERT_GE(b.bos, 0);
  const std::vector<int32_t> tokens = LlamaChunkTokens(b.text_tokens, kCtx);
  ASSERT_EQ(tokens.size(), 3u * kCtx);
  const std::string path = testing::TempDir() + "/kl_self.bin";
  const int32_t vocab = b.model->config().vocab_size;
  Result<std::unique_ptr<LlamaLogitsWriter>> out = LlamaLogitsWriter::Create(path, kCtx, vocab, tokens);
  ASSERT_TRUE(out.ok()) << out.status().message();
  KlRunConfig run{.key = Format("f32"), .value = Format("f32"), .n_ctx = kCtx, .bos = b.bos, .out = out->get()};
  Result<KlReport> written = RunKlDivergence(*b.model, tokens, run, {});
  ASSERT_TRUE(written.ok()) << written.status().message();
  ASSERT_TRUE((*out)->Close().ok());
  EXPECT_EQ(written->n_chunk, 3);
  EXPECT_EQ(written->positions, 3 * (kCtx - 1 - kCtx / 2));
  EXPECT_FALSE(written->compared);
  EXPECT_EQ(static_cast<int64_t>(Slurp(path).size()),
            20 + 4 * 3 * kCtx + written->positions * (4 + vocab) * 2);

  Result<LlamaLogitsReader> base = LlamaLogitsReader::Open(path);
  ASSERT_TRUE(base.ok()) << base.status().message();
  ASSERT_TRUE(CheckBaseMatches(*base, vocab, b.model->config().seq_len, b.text_tokens).ok());
  // The file keeps the text's ids; BOS replaces only what is fed (chunk 1 does not start with BOS).
  EXPECT_EQ(base->tokens()[kCtx], b.text_tokens[kCtx]);
  EXPECT_NE(base->tokens()[kCtx], b.bos);

  run.out = nullptr;
  run.base = &*base;
  Result<KlReport> self = RunKlDivergence(*b.model, tokens, run, {});
  ASSERT_TRUE(self.ok()) << self.status().message();
  ASSERT_TRUE(self->compared);
  const KlSummary& s = self->summary;
  EXPECT_EQ(s.count, written->positions);
  EXPECT_EQ(s.same_top_count, s.count);
  EXPECT_EQ(s.same_top.value, 1.0);
  const double delta = 0.51 * (16.0 / 65535.0) + 1e-5;
  const double kl_bound = delta * std::exp(delta);
  EXPECT_LE(QuantileValue(s.kl_quantiles, "max"), kl_bound);
  EXPECT_GE(QuantileValue(s.kl_quantiles, "min"), -kl_bound);
  EXPECT_LE(std::abs(s.kl.value), kl_bound);
  const double dp_bound = std::max(std::expm1(delta), std::exp(-16.0));
  EXPECT_LE(QuantileValue(s.p_diff_quantiles, "max"), dp_bound);
  EXPECT_GE(QuantileValue(s.p_diff_quantiles, "min"), -dp_bound);
  // kvq's perplexity is the same number both times (the same logits), and the file's is close.
  EXPECT_NEAR(s.ppl.value, written->ppl, 1e-12 * written->ppl);
  EXPECT_NEAR(s.ppl_base.value, s.ppl.value, 0.01 * s.ppl.value);

  // The measurement sees a KV format's damage: int2 keys and values are far outside the bound.
  run.key = run.value = Format("int2");
  Result<KlReport> int2 = RunKlDivergence(*b.model, tokens, run, {});
  ASSERT_TRUE(int2.ok()) << int2.status().message();
  RecordProperty("kl_int2", fmt::format("{:.6g}", int2->summary.kl.value));
  EXPECT_GT(int2->summary.kl.value, 100 * kl_bound);
  EXPECT_LT(int2->summary.same_top_count, int2->summary.count);
}

// Without BOS substitution the chunks after the first are run from the text's own token, which
// changes their predictions: the substitution is really applied (and only to what is fed).
TEST(KlDivergence, EveryChunkIsRunFromBos) {
  Bundled b = Load();
  ASSERT_NE(b.model, nullptr);
  const std::vector<int32_t> tokens = LlamaChunkTokens(b.text_tokens, kCtx);
  const std::string path = testing::TempDir() + "/kl_bos.bin";
  const int32_t vocab = b.model->config().vocab_size;
  Result<std::unique_ptr<LlamaLogitsWriter>> out = LlamaLogitsWriter::Create(path, kCtx, vocab, tokens);
  ASSERT_TRUE(out.ok());
  KlRunConfig run{.key = Format("f32"), .value = Format("f32"), .n_ctx = kCtx, .bos = b.bos, .out = out->get()};
  ASSERT_TRUE(RunKlDivergence(*b.model, tokens, run, {}).ok());
  ASSERT_TRUE((*out)->Close().ok());
  Result<LlamaLogitsReader> base = LlamaLogitsReader::Open(path);
  ASSERT_TRUE(base.ok());
  run.out = nullptr;
  run.base = &*base;
  run.bos = -1;
  Result<KlReport> no_bos = RunKlDivergence(*b.model, tokens, run, {});
  ASSERT_TRUE(no_bos.ok());
  RecordProperty("kl_without_bos", fmt::format("{:.6g}", no_bos->summary.kl.value));
  EXPECT_GT(no_bos->summary.kl.value, 0.01);  // far above the 1.3e-4 bound of the encoding
}

TEST(KlDivergence, ARunThatDoesNotMatchItsBaseIsRefused) {
  Bundled b = Load();
  ASSERT_NE(b.model, nullptr);
  const std::vector<int32_t> tokens = LlamaChunkTokens(b.text_tokens, kCtx);
  const std::string path = testing::TempDir() + "/kl_mismatch.bin";
  Result<std::unique_ptr<LlamaLogitsWriter>> out =
      LlamaLogitsWriter::Create(path, kCtx, b.model->config().vocab_size, tokens);
  ASSERT_TRUE(out.ok());
  KlRunConfig run{.key = Format("f32"), .value = Format("f32"), .n_ctx = kCtx, .bos = b.bos, .out = out->get()};
  ASSERT_TRUE(RunKlDivergence(*b.model, tokens, run, {}).ok());
  ASSERT_TRUE((*out)->Close().ok());
  Result<LlamaLogitsReader> base = LlamaLogitsReader::Open(path);
  ASSERT_TRUE(base.ok());
  run.out = nullptr;
  run.base = &*base;
  std::vector<int32_t> other = tokens;
  other[200] = (other[200] + 1) % b.model->config().vocab_size;
  EXPECT_FALSE(RunKlDivergence(*b.model, other, run, {}).ok());
  const std::vector<int32_t> two_chunks(tokens.begin(), tokens.begin() + 2 * kCtx);
  EXPECT_FALSE(RunKlDivergence(*b.model, two_chunks, run, {}).ok());
  run.base = nullptr;
  run.n_ctx = 1024;  // beyond the model's 512 positions
  EXPECT_FALSE(RunKlDivergence(*b.model, LlamaChunkTokens(b.text_tokens, 1024), run, {}).ok());
}

}  // namespace
}  // namespace kvq
