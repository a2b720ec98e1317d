// The MoE routing rule (model/moe_route.h), which the WebGPU routing must reproduce bit for bit
// (tests/web/gpu/gpu_moe_page.js): the softmax over every expert, the top k with ties to the lower
// index (exact ties, probabilities underflowing to 0), the chosen ones renormalised by their own
// sum, and the order of a random row's choice against a plain sort.
#include "model/moe_route.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace kvq {
namespace {

struct Routed {
  std::vector<float> probs;
  std::vector<int32_t> chosen;
  std::vector<float> weights;
};

Routed Route(std::vector<float> logits, int64_t k) {
  const int64_t n = static_cast<int64_t>(logits.size());
  Routed r{.probs = std::move(logits), .chosen = std::vector<int32_t>(k), .weights = std::vector<float>(k)};
  std::vector<int32_t> order(n);
  RouteRow(r.probs.data(), n, k, order.data(), r.chosen.data(), r.weights.data());
  return r;
}

TEST(MoeRouteTest, ExactTiesGoToTheLowerIndex) {
  const Routed r = Route({1.0f, 3.0f, 2.0f, 3.0f, 3.0f}, 3);
  EXPECT_EQ(r.chosen, (std::vector<int32_t>{1, 3, 4}));
  EXPECT_EQ(r.weights[0], r.weights[1]);
  EXPECT_EQ(r.weights[1], r.weights[2]);
}

TEST(MoeRouteTest, UnderflowedProbabilitiesTieAtZero) {
  const Routed r = Route({-200.0f, 0.0f, -200.0f, -300.0f}, 3);
  EXPECT_EQ(r.probs[0], 0.0f);
  EXPECT_EQ(r.chosen, (std::vector<int32_t>{1, 0, 2}));
  EXPECT_EQ(r.weights, (std::vector<float>{1.0f, 0.0f, 0.0f}));
}

// The weights are the chosen probabilities over their own sum (in rank order), not a softmax of
// the chosen logits alone: the same numbers here, computed as the rule says.
TEST(MoeRouteTest, WeightsAreTheChosenProbabilitiesRenormalised) {
  const Routed r = Route({0.5f, -1.0f, 2.0f, 0.25f}, 2);
  ASSERT_EQ(r.chosen, (std::vector<int32_t>{2, 0}));
  float top = 2.0f, sum = 0.0f;
  std::vector<float> p = {0.5f, -1.0f, 2.0f, 0.25f};
  for (float& v : p) sum += v = std::exp(v - top);
  for (float& v : p) v /= sum;
  EXPECT_EQ(r.probs, p);
  const float chosen_sum = p[2] + p[0];
  EXPECT_EQ(r.weights, (std::vector<float>{p[2] / chosen_sum, p[0] / chosen_sum}));
}

// A random row's choice is a stable sort's first k by probability, largest first.
TEST(MoeRouteTest, ChoiceIsAStableSortByProbability) {
  std::mt19937 rng(31);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  for (int rep = 0; rep < 200; ++rep) {
    std::vector<float> logits(64);
    for (float& v : logits) v = std::round(u(rng) * 4.0f) / 4.0f;  // quarters: many ties
    const Routed r = Route(logits, 8);
    std::vector<int32_t> order(64);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return r.probs[a] > r.probs[b]; });
    ASSERT_EQ(r.chosen, std::vector<int32_t>(order.begin(), order.begin() + 8)) << "row " << rep;
  }
}

}  // namespace
}  // namespace kvq
