// The server-wide suffix index (server/suffix_index.h): it drafts what followed in an earlier
// request's tokens, holds at most its budget (the older generation dropped when the newer fills,
// counted as evicted), and once a request's tokens are evicted it no longer drafts from them.
#include "server/suffix_index.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvq::server {
namespace {

TEST(SuffixIndex, DraftsFromEarlierRequestsWithinItsBudget) {
  const SpeculationOptions o{.source = DraftSource::kSuffix, .max_draft = 4, .min_draft_probability = 0.5};
  SuffixIndex index(/*budget_tokens=*/12, /*depth=*/8);
  const std::vector<int32_t> first = {1, 2, 3, 4, 5, 6};
  index.Add(first);
  EXPECT_EQ(index.tokens(), 6);
  const std::vector<int32_t> asks = {9, 2, 3};
  EXPECT_EQ(index.Draft(asks, 3, o), (std::vector<int32_t>{4, 5, 6}));
  // A second request fills the newer generation past half the budget: the first becomes the older
  // generation, still drafted from.
  const std::vector<int32_t> second = {7, 8, 9, 10};
  index.Add(second);
  EXPECT_EQ(index.tokens(), 10);
  EXPECT_EQ(index.evicted_tokens(), 0);
  EXPECT_EQ(index.Draft(asks, 3, o), (std::vector<int32_t>{4, 5, 6}));
  EXPECT_EQ(index.Draft(std::vector<int32_t>{7, 8}, 2, o), (std::vector<int32_t>{9, 10}));
  // A third: the first request's generation goes.
  const std::vector<int32_t> third = {11, 12, 13, 14, 15};
  index.Add(third);
  EXPECT_LE(index.tokens(), 12);
  EXPECT_EQ(index.evicted_tokens(), 6);
  EXPECT_TRUE(index.Draft(asks, 3, o).empty());
  EXPECT_EQ(index.Draft(std::vector<int32_t>{7, 8}, 2, o), (std::vector<int32_t>{9, 10}));
  // A request longer than half the budget keeps only its last half.
  const std::vector<int32_t> long_one = {20, 21, 22, 23, 24, 25, 26, 27, 28, 29};
  index.Add(long_one);
  EXPECT_LE(index.tokens(), 12);
  EXPECT_TRUE(index.Draft(std::vector<int32_t>{20}, 2, o).empty());
  EXPECT_EQ(index.Draft(std::vector<int32_t>{26}, 2, o), (std::vector<int32_t>{27, 28}));
}

}  // namespace
}  // namespace kvq::server
