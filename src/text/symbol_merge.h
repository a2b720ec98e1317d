// The merge loop both tokenizers share: adjacent symbols (byte ranges of a text, linked left to
// right) are merged pair by pair, the best-priority pair first and the leftmost on ties, until no
// adjacent pair may merge. SentencePiece ranks a pair by its piece's score, byte-level BPE by its
// merge rank; the loop is the same.
#pragma once

#include <cstdint>
#include <optional>
#include <queue>
#include <vector>

namespace kvq {

struct MergeSymbol {
  uint32_t start;  // first byte in the text
  uint32_t n;      // bytes; 0 once merged into the symbol on its left
  int32_t prev;    // -1 at the ends
  int32_t next;
};

/// Merges `symbols` in place. `priority(left, right)` returns the priority of merging the two
/// adjacent symbols (smaller merges first), or nothing when they may not merge. Walk the result
/// from symbol 0 along `next`.
template <typename Priority, typename PriorityOf>
void MergeAdjacentSymbols(std::vector<MergeSymbol>& symbols, PriorityOf priority) {
  struct Pair {
    Priority priority;
    int32_t left;
    int32_t right;
    uint32_t size;  // bytes of the merged symbol: a stale entry no longer adds up
  };
  const auto later = [](const Pair& a, const Pair& b) {
    return a.priority > b.priority || (a.priority == b.priority && a.left > b.left);
  };
  std::priority_queue<Pair, std::vector<Pair>, decltype(later)> queue(later);
  const auto try_pair = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const std::optional<Priority> p = priority(symbols[left], symbols[right]);
    if (p) queue.push({*p, left, right, symbols[left].n + symbols[right].n});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_pair(i - 1, i);

  while (!queue.empty()) {
    const Pair p = queue.top();
    queue.pop();
    MergeSymbol& left = symbols[p.left];
    MergeSymbol& right = symbols[p.right];
    // Symbols only grow (by taking in their right neighbour), so a pair whose sizes no longer add
    // up was overtaken by another merge.
    if (left.n == 0 || right.n == 0 || left.n + right.n != p.size) continue;
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = p.left;
    try_pair(left.prev, p.left);
    try_pair(p.left, left.next);
  }
}

}  // namespace kvq
