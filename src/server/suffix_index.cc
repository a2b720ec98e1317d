// The server-wide suffix index (see server/suffix_index.h).
#include "server/suffix_index.h"

#include <algorithm>
#include <utility>

namespace kvq::server {

SuffixIndex::SuffixIndex(int64_t budget_tokens, int32_t depth)
    : half_(std::max<int64_t>(1, budget_tokens / 2)), depth_(depth), newer_(depth), older_(depth) {}

void SuffixIndex::Add(std::span<const int32_t> tokens) {
  if (static_cast<int64_t>(tokens.size()) > half_) tokens = tokens.last(static_cast<size_t>(half_));
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) return;
  if (newer_tokens_ + n > half_) {  // the newer generation is full: the older one goes
    evicted_ += older_tokens_;
    older_ = std::move(newer_);
    older_tokens_ = newer_tokens_;
    newer_ = SuffixTree(depth_);
    newer_tokens_ = 0;
  }
  newer_.Append(tokens);
  newer_.EndSequence();
  newer_tokens_ += n;
}

std::vector<int32_t> SuffixIndex::Draft(std::span<const int32_t> sequence, int32_t max_tokens,
                                        const SpeculationOptions& options) const {
  std::vector<int32_t> newer = newer_.Draft(sequence, max_tokens, options);
  if (older_tokens_ == 0 || static_cast<int32_t>(newer.size()) >= max_tokens) return newer;
  std::vector<int32_t> older = older_.Draft(sequence, max_tokens, options);
  return older.size() > newer.size() ? older : newer;
}

}  // namespace kvq::server
