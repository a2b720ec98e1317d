// `kvq plan --auto`'s choice: the knapsack finds the optimum a brute force finds (and fits its
// budget when it rounds).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "measure/kv_plan_auto.h"

namespace kvq {
namespace {

// Every combination, for small instances: the least Σ kl within the budget.
double BruteForce(const std::vector<std::vector<KvPlanOption>>& groups, int64_t budget) {
  double best = INFINITY;
  std::vector<size_t> at(groups.size(), 0);
  while (true) {
    int64_t bytes = 0;
    double kl = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      bytes += groups[g][at[g]].bytes;
      kl += groups[g][at[g]].kl;
    }
    if (bytes <= budget) best = std::min(best, kl);
    size_t g = 0;
    while (g < groups.size() && ++at[g] == groups[g].size()) at[g++] = 0;
    if (g == groups.size()) return best;
  }
}

TEST(ChooseKvPlan, SpendsTheBudgetWhereItBuysTheMostKl) {
  // Two tensors, each a cheap lossy option and a dear exact one; the budget buys one dear option,
  // and it goes to the tensor whose cheap option hurts more.
  const std::vector<std::vector<KvPlanOption>> groups = {{{10, 0.5}, {30, 0.0}}, {{10, 0.1}, {30, 0.0}}};
  const Result<KvPlanChoice> c = ChooseKvPlan(groups, 40);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->option, (std::vector<int>{1, 0}));
  EXPECT_EQ(c->bytes, 40);
  EXPECT_EQ(c->kl, 0.1);
  EXPECT_TRUE(c->exact);
  // Budget for both: both exact; below the cheapest: an error naming the cheapest total.
  EXPECT_EQ(ChooseKvPlan(groups, 60)->option, (std::vector<int>{1, 1}));
  const Result<KvPlanChoice> none = ChooseKvPlan(groups, 19);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("20 bytes"), std::string::npos) << none.status().message();
  // A tie in kl goes to fewer bytes.
  EXPECT_EQ(ChooseKvPlan({{{30, 0.0}, {20, 0.0}}}, 100)->option, (std::vector<int>{1}));
}

TEST(ChooseKvPlan, MatchesABruteForceOnRandomInstances) {
  std::mt19937_64 rng(15);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t n_groups = 1 + rng() % 5, n_options = 1 + rng() % 4;
    std::vector<std::vector<KvPlanOption>> groups(n_groups);
    int64_t least = 0, most = 0;
    for (auto& g : groups) {
      int64_t lo = INT64_MAX, hi = 0;
      for (size_t o = 0; o < n_options; ++o) {
        g.push_back({static_cast<int64_t>(6 * (1 + rng() % 40)), static_cast<double>(rng() % 1000) / 997.0});
        lo = std::min(lo, g.back().bytes);
        hi = std::max(hi, g.back().bytes);
      }
      least += lo;
      most += hi;
    }
    const int64_t budget = least + static_cast<int64_t>(rng() % static_cast<uint64_t>(most - least + 1));
    const Result<KvPlanChoice> c = ChooseKvPlan(groups, budget);
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_TRUE(c->exact);
    EXPECT_LE(c->bytes, budget);
    // The same additions in the same order as the brute force's: equal, not merely close.
    EXPECT_EQ(c->kl, BruteForce(groups, budget)) << "trial " << trial;
  }
}

TEST(ChooseKvPlan, ACoarseUnitStillFitsTheBudget) {
  // Co-prime byte counts over a budget of millions: more states than kMaxPlanStates, so bytes are
  // rounded up to a coarser unit; the choice is still within the budget, and here still optimal.
  const std::vector<std::vector<KvPlanOption>> groups = {{{1'000'003, 1.0}, {3'000'017, 0.0}},
                                                         {{1'000'033, 2.0}, {3'000'001, 0.0}}};
  const int64_t budget = 4'000'050;
  const Result<KvPlanChoice> c = ChooseKvPlan(groups, budget);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_FALSE(c->exact);
  EXPECT_LE(c->bytes, budget);
  EXPECT_EQ(c->option, (std::vector<int>{0, 1}));
}

}  // namespace
}  // namespace kvq
