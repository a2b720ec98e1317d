// Attention error vs context (seed 000's measurement one): synthetic error falls about as
// 1/sqrt(n), the fixture trap (a query that does not attend to the whole cache, numbers that do
// not change with n) is caught, f32 is exact, and model rows on the bundled model are consistent.
#include "measure/attention_error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "model/load_model.h"

namespace kvq {
namespace {

const std::string kDir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";

// A few sentences of our own in the TinyStories style; repeated by MakeAttentionTextInput.
constexpr const char* kText =
    "Once upon a time, there was a little girl named Lily. She loved to play in the park with her red ball. "
    "One day, the ball rolled under a big tree and Lily could not find it. She asked a friendly dog to help "
    "her. The dog sniffed the grass and found the ball near a small pond. Lily was very happy and gave the "
    "dog a hug. From that day on, they played together every morning.";

const FormatDesc* F(const char* name) { return FindFormat(name).value(); }

std::vector<const AttentionErrorRow*> RowsOf(const AttentionErrorReport& r, const std::string& format) {
  std::vector<const AttentionErrorRow*> out;
  for (const AttentionErrorRow& row : r.rows) {
    if (row.format == format) out.push_back(&row);
  }
  return out;
}

std::optional<double> SlopeOf(const AttentionErrorReport& r, const std::string& format) {
  for (const auto& [name, slope] : r.slopes) {
    if (name == format) return slope;
  }
  ADD_FAILURE() << "no slope for " << format;
  return std::nullopt;
}

// The shape of the synthetic runs: 4 independent layers of 8 query heads over 4 KV heads, head
// dim 64 — 2,048 output numbers per context, so each mean is a tight estimate.
constexpr SyntheticShape kShape{.n_layers = 4, .n_heads = 8, .n_kv_heads = 4, .head_dim = 64};

TEST(AttentionErrorSynthetic, Int4ErrorFallsAboutAsOneOverSqrtN) {
  AttentionErrorConfig config{.formats = {F("int4"), F("int8")}, .contexts = {16, 64, 256, 1024}};
  const Result<AttentionErrorReport> r = MeasureSyntheticAttentionError(kShape, 1, config, {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->rows.size(), 8u);
  for (const char* name : {"int4", "int8"}) {
    const auto rows = RowsOf(*r, name);
    ASSERT_EQ(rows.size(), 4u);
    for (size_t i = 1; i < rows.size(); ++i) {
      EXPECT_LT(rows[i]->mean_abs_error, rows[i - 1]->mean_abs_error) << name << " at " << rows[i]->context;
    }
    // Why about −0.5: the output error is a softmax-weighted average of n independent
    // per-position errors (each row has its own scale): Σ w_p δv_p, plus the score errors'
    // Σ δw_p (v_p − o). Its spread scales as sqrt(Σ w²), and with N(0, 1) scores Σ w² → e/n, so
    // the slope tends to −0.5. Over 16..1024 it comes out a little flatter: at small n, Σ w² falls
    // short of e/n (n = 1 gives 1, not e; sqrt(n Σ w²) is 1.44 at n = 16 and 1.63 at 1024 by a
    // Monte-Carlo of the softmax alone, a slope of −0.47), and the key term's centring by Σ w δs
    // removes more at small n. Measured here with seeds 1..8: int4 −0.437..−0.465, int8
    // −0.444..−0.481. The band ±0.1 around −0.5 holds those with room for the sampling noise of a
    // mean over 2,048 numbers (a few per cent per context, ±0.02 on the slope) and still refuses
    // what would be a bug: no trend (0, seed 000's fixture) or errors that add up (+0.5).
    const std::optional<double> slope = SlopeOf(*r, name);
    ASSERT_TRUE(slope.has_value()) << name;
    EXPECT_NEAR(*slope, -0.5, 0.1) << name;
  }
  // The averaging argument needs the weights spread over more positions as n grows: 1 / Σ w²
  // rises with n and never passes it.
  const auto int4 = RowsOf(*r, "int4");
  for (size_t i = 0; i < int4.size(); ++i) {
    EXPECT_LE(int4[i]->effective_positions, static_cast<double>(int4[i]->context));
    if (i > 0) {
      EXPECT_GT(int4[i]->effective_positions, 2 * int4[i - 1]->effective_positions);
    }
  }
  // Fewer bits, more error, at every context: int4 steps are 18 times int8's (7 vs 127 levels).
  for (size_t i = 0; i < 4; ++i) EXPECT_GT(RowsOf(*r, "int4")[i]->mean_abs_error, 5 * RowsOf(*r, "int8")[i]->mean_abs_error);
}

// Every registered format: the lossless one (f32 elements for K and V) measures 0, every other
// format a nonzero error.
TEST(AttentionErrorSynthetic, EveryRowAttendsToItsWholeContextAndNumbersDifferAcrossContexts) {
  AttentionErrorConfig config{.formats = {Formats().begin(), Formats().end()}, .contexts = {1, 16, 33, 300}};
  const Result<AttentionErrorReport> r = MeasureSyntheticAttentionError(kShape, 7, config, {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->rows.size(), 4 * Formats().size());
  for (const AttentionErrorRow& row : r->rows) {
    EXPECT_EQ(row.positions_attended, row.context) << row.format;
    if (row.context == 1) {
      EXPECT_EQ(row.effective_positions, 1.0);  // one weight, w = 1
    }
  }
  // The fixture trap: seed 000's broken table had one number at every context. Here every
  // context must give different digits, pairwise, for every lossy format.
  for (const FormatDesc* f : Formats()) {
    const char* name = f->name;
    if (std::string_view(f->key.element) == "f32" && std::string_view(f->value.element) == "f32") {
      for (const AttentionErrorRow* row : RowsOf(*r, name)) EXPECT_EQ(row->max_abs_error, 0.0) << name;
      continue;
    }
    std::set<double> means, maxes;
    for (const AttentionErrorRow* row : RowsOf(*r, name)) {
      EXPECT_GT(row->mean_abs_error, 0) << name << " at " << row->context;
      means.insert(row->mean_abs_error);
      maxes.insert(row->max_abs_error);
      EXPECT_FALSE(row->top1_changed.has_value());
    }
    EXPECT_EQ(means.size(), 4u) << name;
    EXPECT_EQ(maxes.size(), 4u) << name;
  }
  EXPECT_TRUE(CheckFixture(r->rows).ok());
}

TEST(AttentionErrorSynthetic, F32IsExact) {
  AttentionErrorConfig config{.formats = {F("f32")}, .contexts = {16, 256}};
  const Result<AttentionErrorReport> r = MeasureSyntheticAttentionError(kShape, 3, config, {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  for (const AttentionErrorRow& row : r->rows) {
    EXPECT_EQ(row.mean_abs_error, 0.0);
    EXPECT_EQ(row.max_abs_error, 0.0);
    EXPECT_EQ(row.positions_attended, row.context);
  }
  EXPECT_FALSE(SlopeOf(*r, "f32").has_value());  // ln 0 has no slope
}

TEST(AttentionErrorSynthetic, Seed000FixtureBugIsRefused) {
  // The query at position 0 attends to one position whatever the cache holds.
  AttentionErrorConfig config{.formats = {F("int4")}, .contexts = {16, 64, 256}, .inject_query_at_position_zero = true};
  const Result<AttentionErrorReport> r = MeasureSyntheticAttentionError(kShape, 1, config, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("attended 1 positions, expected 16"), std::string::npos) << r.status().message();
}

TEST(AttentionErrorFixture, IdenticalNumbersAcrossContextsAreRefused) {
  AttentionErrorConfig config{.formats = {F("int4"), F("f32")}, .contexts = {16, 64, 256}};
  const Result<AttentionErrorReport> r = MeasureSyntheticAttentionError(kShape, 1, config, {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_TRUE(CheckFixture(r->rows).ok());  // f32's zeros at every context are legitimate
  // Seed 000's symptom alone (positions counted right): one number at every context.
  std::vector<AttentionErrorRow> broken = r->rows;
  for (AttentionErrorRow& row : broken) {
    if (row.format == "int4") {
      row.mean_abs_error = 0.04922855290753129;
      row.max_abs_error = 0.1;
    }
  }
  const Status s = CheckFixture(broken);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("int4"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("identical numbers"), std::string::npos) << s.message();
  // One context differing is enough to pass: the check is for all-identical tables.
  broken[2].mean_abs_error = 0.05;
  EXPECT_TRUE(CheckFixture(broken).ok());
}

TEST(AttentionErrorFixture, BadConfigurationsAreRefusedByName) {
  auto run = [](AttentionErrorConfig c) { return MeasureSyntheticAttentionError(kShape, 1, c, {}).status().message(); };
  EXPECT_NE(run({.formats = {F("int4")}, .contexts = {0}}).find("at least 1"), std::string::npos);
  EXPECT_NE(run({.formats = {F("int4")}, .contexts = {64, 16}}).find("ascending"), std::string::npos);
  EXPECT_NE(run({.formats = {F("int4")}, .contexts = {16}, .layer = 4}).find("layer 4"), std::string::npos);
  EXPECT_NE(run({.formats = {F("int4")}, .contexts = {16}, .head = 8}).find("head 8"), std::string::npos);
  EXPECT_NE(run({.formats = {}, .contexts = {16}}).find("no formats"), std::string::npos);
}

TEST(LogLogSlope, RecoversAPowerLaw) {
  const std::vector<int64_t> n = {16, 64, 256, 2787};
  std::vector<double> e;
  for (int64_t x : n) e.push_back(0.3 * std::pow(static_cast<double>(x), -0.5));
  // Exact up to the rounding of a handful of logs: 1e-12 is far above that.
  EXPECT_NEAR(LogLogSlope(n, e).value(), -0.5, 1e-12);
  e[1] = 0;
  EXPECT_FALSE(LogLogSlope(n, e).has_value());
  EXPECT_FALSE(LogLogSlope(std::vector<int64_t>{16}, std::vector<double>{0.1}).has_value());
}

class AttentionErrorModel : public testing::Test {
 protected:
  void SetUp() override {
    Result<LoadedModel> m = LoadModel(kDir + "stories260K.bin", kDir + "tok512.bin");
    ASSERT_TRUE(m.ok()) << m.status().message();
    tokenizer_ = std::make_unique<Tokenizer>(m->tokenizer);
    model_ = std::make_unique<LlamaModel>(std::move(m.value().weights), 1);
  }
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<LlamaModel> model_;
};

TEST_F(AttentionErrorModel, TextIsRepeatedToFillTheLargestContext) {
  const AttentionTextInput in = MakeAttentionTextInput(*tokenizer_, kText, 300);
  ASSERT_EQ(in.tokens.size(), 300u);
  const std::vector<int32_t> once = tokenizer_->Encode(kText, tokenizer_->add_bos());
  const std::vector<int32_t> again = tokenizer_->Encode(kText, false);
  EXPECT_EQ(in.text_tokens, static_cast<int64_t>(once.size()));
  ASSERT_LT(once.size(), 300u);
  EXPECT_GT(in.repeats, 1);
  EXPECT_TRUE(std::equal(once.begin(), once.end(), in.tokens.begin()));
  EXPECT_EQ(in.tokens[once.size()], again[0]);  // the copy follows without a second BOS
  EXPECT_EQ(MakeAttentionTextInput(*tokenizer_, kText, 10).repeats, 1);
}

TEST_F(AttentionErrorModel, RowsForEveryContextF32ExactAndLayersConsistent) {
  const AttentionTextInput in = MakeAttentionTextInput(*tokenizer_, kText, 512);
  AttentionErrorConfig config{.formats = {F("f32"), F("int4"), F("int2")}, .contexts = {16, 64, 256, 512}};
  const Result<AttentionErrorReport> r = MeasureModelAttentionError(*model_, in.tokens, config, {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->rows.size(), 12u);
  for (const AttentionErrorRow& row : r->rows) {
    EXPECT_EQ(row.positions_attended, row.context) << row.format;
    ASSERT_TRUE(row.top1_changed.has_value());
    EXPECT_LT(row.worst_layer, model_->config().n_layers);
    EXPECT_GE(row.worst_layer_mean_abs_error, row.mean_abs_error);
    EXPECT_GE(row.max_abs_error, row.worst_layer_mean_abs_error);
  }
  // f32 through the harness reproduces the model's own attention output bit for bit, so its
  // substitute changes nothing.
  for (const AttentionErrorRow* row : RowsOf(*r, "f32")) {
    EXPECT_EQ(row->mean_abs_error, 0.0) << row->context;
    EXPECT_EQ(row->max_abs_error, 0.0) << row->context;
    EXPECT_FALSE(*row->top1_changed) << row->context;
  }
  for (const char* name : {"int4", "int2"}) {
    std::set<double> means;
    for (const AttentionErrorRow* row : RowsOf(*r, name)) {
      EXPECT_GT(row->mean_abs_error, 0) << name;
      means.insert(row->mean_abs_error);
    }
    EXPECT_EQ(means.size(), 4u) << name << ": identical numbers across contexts";
    EXPECT_TRUE(SlopeOf(*r, name).has_value());
  }
  // The rerun does substitute: with this text two-bit attention changes the next token at some
  // context (at all four when this test was written), which f32 never does.
  int flips = 0;
  for (const AttentionErrorRow* row : RowsOf(*r, "int2")) flips += *row->top1_changed ? 1 : 0;
  EXPECT_GT(flips, 0);
  // Two bits are coarser than four at every context (steps 7 times larger).
  for (size_t i = 0; i < 4; ++i) EXPECT_GT(RowsOf(*r, "int2")[i]->mean_abs_error, RowsOf(*r, "int4")[i]->mean_abs_error);

  // --layer L measures that layer alone with the same computation: its numbers are the default
  // run's per-layer numbers for L exactly.
  const AttentionErrorRow& worst = *RowsOf(*r, "int4")[2];
  AttentionErrorConfig one = config;
  one.formats = {F("int4")};
  one.layer = worst.worst_layer;
  const Result<AttentionErrorReport> single = MeasureModelAttentionError(*model_, in.tokens, one, {});
  ASSERT_TRUE(single.ok()) << single.status().message();
  EXPECT_EQ(single->rows[2].mean_abs_error, worst.worst_layer_mean_abs_error);
  EXPECT_EQ(single->rows[2].worst_layer, worst.worst_layer);
}

TEST_F(AttentionErrorModel, OneHeadAndTheFixtureBugOnModelRows) {
  const AttentionTextInput in = MakeAttentionTextInput(*tokenizer_, kText, 128);
  AttentionErrorConfig config{.formats = {F("int4")}, .contexts = {16, 128}, .layer = 2, .head = 5};
  const Result<AttentionErrorReport> r = MeasureModelAttentionError(*model_, in.tokens, config, {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->rows.size(), 2u);
  EXPECT_NE(r->rows[0].mean_abs_error, r->rows[1].mean_abs_error);
  for (const AttentionErrorRow& row : r->rows) EXPECT_EQ(row.worst_layer, 2);

  config.inject_query_at_position_zero = true;
  const Result<AttentionErrorReport> broken = MeasureModelAttentionError(*model_, in.tokens, config, {});
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("fixture check failed"), std::string::npos);

  // Contexts past the model's 512 positions, or past the tokens given, are refused.
  config.inject_query_at_position_zero = false;
  config.contexts = {16, 513};
  EXPECT_NE(MeasureModelAttentionError(*model_, in.tokens, config, {}).status().message().find("512"),
            std::string::npos);
  config.contexts = {16, 200};
  EXPECT_NE(MeasureModelAttentionError(*model_, in.tokens, config, {}).status().message().find("128 tokens"),
            std::string::npos);
}

}  // namespace
}  // namespace kvq
