// The sampler's logit adjustments (src/generate/sampler.h, kvq/sampling.h): logit_bias, then the
// repeat, frequency and presence penalties over the last repeat_last_n tokens, each checked against
// a scalar recomputation of its definition here, exactly (the same float operations in the same
// order); greedy picks the argmax of the adjusted logits; tokens outside the window are untouched.
// And LogprobsOf: the log-softmax of the logits, against a double recomputation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "generate/sampler.h"

namespace kvq {
namespace {

std::vector<float> RandomLogits(int32_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(n);
  for (float& l : logits) l = normal(rng);
  return logits;
}

// The definitions, token by token: bias added; then for a token seen c > 0 times in the window,
// logit / penalty if positive else × penalty, minus c × frequency, minus presence.
std::vector<float> Expected(const std::vector<float>& logits, const std::vector<int32_t>& recent,
                            const SamplerOptions& o) {
  std::vector<float> out = logits;
  for (const auto& [id, bias] : o.logit_bias) out[id] += bias;
  const size_t window = o.repeat_last_n < 0 ? recent.size() : std::min<size_t>(recent.size(), o.repeat_last_n);
  std::map<int32_t, int> count;
  for (size_t i = recent.size() - window; i < recent.size(); ++i) ++count[recent[i]];
  for (const auto& [id, c] : count) {
    float l = out[id];
    l = l > 0 ? l / o.repeat_penalty : l * o.repeat_penalty;
    l -= static_cast<float>(c) * o.frequency_penalty + o.presence_penalty;
    out[id] = l;
  }
  return out;
}

TEST(Penalties, EqualTheirDefinitions) {
  const int32_t n = 300;
  const std::vector<int32_t> recent = {5, 7, 5, 9, 250, 5, 7, 11, 11, 11, 3, 299, 0};
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const std::vector<float> logits = RandomLogits(n, seed);
    for (int32_t last_n : {0, 1, 4, 8, 64, -1}) {
      SamplerOptions o{.temperature = 0, .seed = seed, .repeat_penalty = 1.3f, .frequency_penalty = 0.4f,
                       .presence_penalty = -0.25f, .repeat_last_n = last_n,
                       .logit_bias = {{17, 2.5f}, {5, -1.0f}, {299, 100.0f}}};
      Sampler sampler(o);
      std::vector<float> got;
      sampler.Adjust(logits.data(), n, recent, &got);
      SamplerOptions expected_options = o;
      const std::vector<float> expected = Expected(logits, recent, expected_options);
      ASSERT_EQ(got, expected) << "seed " << seed << " last_n " << last_n;
      // Greedy draws the argmax of the adjusted logits (the lowest id of tied maxima).
      const int32_t argmax = static_cast<int32_t>(std::max_element(expected.begin(), expected.end()) - expected.begin());
      EXPECT_EQ(sampler.Sample(logits.data(), n, recent), argmax);
    }
  }
}

TEST(Penalties, OnlyTheWindowIsPenalizedAndOffMeansUntouched) {
  const std::vector<float> logits = RandomLogits(40, 3);
  const std::vector<int32_t> recent = {1, 2, 3, 4};
  SamplerOptions o{.temperature = 0, .repeat_penalty = 2.0f, .frequency_penalty = 1.0f, .presence_penalty = 1.0f,
                   .repeat_last_n = 2};
  std::vector<float> got;
  Sampler(o).Adjust(logits.data(), 40, recent, &got);
  for (int32_t id = 0; id < 40; ++id) {
    if (id == 3 || id == 4) {
      EXPECT_NE(got[id], logits[id]) << id;
    } else {
      EXPECT_EQ(got[id], logits[id]) << id;  // 1 and 2 are outside the last 2
    }
  }
  EXPECT_FALSE(SamplerOptions{}.AdjustsLogits());
  EXPECT_FALSE((SamplerOptions{.repeat_penalty = 1.5f, .repeat_last_n = 0}.AdjustsLogits()));
  EXPECT_TRUE((SamplerOptions{.logit_bias = {{1, 1.0f}}}.AdjustsLogits()));
}

TEST(Penalties, BiasOfMinus100BansAToken) {
  const std::vector<float> logits = RandomLogits(50, 9);
  const int32_t top = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  Sampler sampler({.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 4, .logit_bias = {{top, -100.0f}}});
  for (int i = 0; i < 2000; ++i) EXPECT_NE(sampler.Sample(logits.data(), 50), top);
}

TEST(Logprobs, AreTheLogSoftmaxOfTheLogits) {
  const std::vector<float> logits = RandomLogits(1000, 21);
  double max = *std::max_element(logits.begin(), logits.end()), sum = 0;
  for (float l : logits) sum += std::exp(l - max);
  const double log_sum = max + std::log(sum);
  const TokenLogprobs lp = LogprobsOf(logits, 123, 5);
  EXPECT_EQ(lp.chosen.id, 123);
  // Both sides compute in double and round once to float: equal within float rounding.
  EXPECT_FLOAT_EQ(lp.chosen.logprob, static_cast<float>(logits[123] - log_sum));
  std::vector<int32_t> ids(1000);
  for (int32_t i = 0; i < 1000; ++i) ids[i] = i;
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  ASSERT_EQ(lp.top.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(lp.top[i].id, ids[i]);
    EXPECT_FLOAT_EQ(lp.top[i].logprob, static_cast<float>(logits[ids[i]] - log_sum));
  }
}

}  // namespace
}  // namespace kvq
