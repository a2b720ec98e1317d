// A server-wide suffix index (SuffixDecoding's global tree): the tokens of recent requests (prompt
// and reply) in suffix trees that every new request's suffix drafter also consults, so a request
// that repeats what an earlier one wrote (the same question again, a template, a retry) gets
// drafts from it. Bounded by a token budget: two generations of trees, each of at most half the
// budget; when the newer one is full the older is dropped and the newer becomes the older, so at
// most `budget` tokens are held and the oldest go first, half a budget at a time. Drafts only
// decide how many positions a pass runs: the index changes no output.
//
// Threads: the engine's scheduler thread only.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvq/speculation.h"

namespace kvq::server {

class SuffixIndex {
 public:
  /// `budget_tokens` ≥ 2; `depth`: the trees' substring length at most (SuffixTree).
  SuffixIndex(int64_t budget_tokens, int32_t depth);
  /// Adds one request's tokens as a sequence of its own (only its last budget/2 when longer).
  void Add(std::span<const int32_t> tokens);
  /// The longer of the two generations' drafts continuing `sequence` (SuffixTree::Draft; the
  /// newer's on a tie); empty when neither matches.
  std::vector<int32_t> Draft(std::span<const int32_t> sequence, int32_t max_tokens,
                             const SpeculationOptions& options) const;
  int64_t tokens() const { return newer_tokens_ + older_tokens_; }  ///< held now, ≤ the budget
  int64_t evicted_tokens() const { return evicted_; }                ///< dropped so far

 private:
  int64_t half_;
  int32_t depth_;
  SuffixTree newer_, older_;
  int64_t newer_tokens_ = 0, older_tokens_ = 0, evicted_ = 0;
};

}  // namespace kvq::server
