// GrammarMatcher and TokenTrie (see grammar_matcher.h).
#include "grammar/grammar_matcher.h"

#include <algorithm>
#include <numeric>

namespace kvq {

TokenTrie::TokenTrie(const std::vector<std::string>& tokens) : vocab_(static_cast<int32_t>(tokens.size())) {
  std::vector<int32_t> order;  // ids with text, sorted by their bytes: each subtree is a run
  for (int32_t i = 0; i < vocab_; ++i) {
    if (!tokens[i].empty()) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return tokens[a] != tokens[b] ? tokens[a] < tokens[b] : a < b;
  });
  // Preorder: a node for every distinct prefix. Walking the sorted ids, token k's new nodes are the
  // bytes past its common prefix with token k-1; `open` holds the nodes of the current path, each
  // closed (its end_ set) when a later token leaves it.
  byte_.push_back(0);
  depth_.push_back(0);
  end_.push_back(0);
  std::vector<int32_t> node_of_token(order.size());
  std::vector<int32_t> open{0};  // [depth] node on the current path
  std::string_view previous;
  for (size_t k = 0; k < order.size(); ++k) {
    const std::string& t = tokens[order[k]];
    size_t common = 0;
    while (common < previous.size() && common < t.size() && previous[common] == t[common]) ++common;
    while (open.size() > common + 1) {  // close the nodes deeper than the shared prefix
      end_[open.back()] = static_cast<int32_t>(byte_.size());
      open.pop_back();
    }
    for (size_t d = common; d < t.size(); ++d) {
      open.push_back(static_cast<int32_t>(byte_.size()));
      byte_.push_back(static_cast<uint8_t>(t[d]));
      depth_.push_back(static_cast<uint16_t>(std::min<size_t>(d + 1, 65535)));
      end_.push_back(0);
    }
    node_of_token[k] = open.back();
    max_depth_ = std::max<int32_t>(max_depth_, static_cast<int32_t>(t.size()));
    previous = t;
  }
  for (int32_t n : open) end_[n] = static_cast<int32_t>(byte_.size());
  // Tokens grouped by node: sorted order already visits nodes in preorder.
  token_begin_.assign(byte_.size() + 1, 0);
  for (int32_t n : node_of_token) ++token_begin_[n + 1];
  std::partial_sum(token_begin_.begin(), token_begin_.end(), token_begin_.begin());
  tokens_.resize(order.size());
  for (size_t k = 0; k < order.size(); ++k) tokens_[k] = order[k];
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar) : g_(std::move(grammar)) {
  sets_.emplace_back();  // kDead
  set_ids_.emplace(std::vector<int32_t>{}, kDead);
  byte_next_.assign(256, kDead);
  std::vector<int32_t> tops;
  for (int32_t start : g_->rules[g_->root]) Expand(start, -1, tops);
  set_ = InternSet(std::move(tops));
}

int32_t GrammarMatcher::Node(int32_t pos, int32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent);
  const auto [it, added] = node_ids_.emplace(key, static_cast<int32_t>(nodes_.size()));
  if (added) nodes_.emplace_back(pos, parent);
  return it->second;
}

void GrammarMatcher::Expand(int32_t pos, int32_t parent, std::vector<int32_t>& tops) {
  while (true) {
    const GrammarElement& e = g_->elements[pos];
    switch (e.kind) {
      case GrammarElement::Kind::kChars:
        tops.push_back(Node(pos, parent));
        return;
      case GrammarElement::Kind::kEnd:
        if (parent < 0) {
          tops.push_back(-1);  // the root rule is complete
          return;
        }
        pos = nodes_[parent].first;  // continue where the finished rule was called from
        parent = nodes_[parent].second;
        continue;
      case GrammarElement::Kind::kRule: {
        // What follows the reference; a reference last in its alternative continues straight at
        // the caller's continuation, so right recursion (x*) keeps the stack flat.
        const bool last = g_->elements[pos + 1].kind == GrammarElement::Kind::kEnd;
        const int32_t after = last ? parent : Node(pos + 1, parent);
        for (int32_t start : g_->rules[e.value]) Expand(start, after, tops);
        return;
      }
    }
  }
}

int32_t GrammarMatcher::InternSet(std::vector<int32_t> tops) {
  std::sort(tops.begin(), tops.end());
  tops.erase(std::unique(tops.begin(), tops.end()), tops.end());
  const auto [it, added] = set_ids_.emplace(tops, static_cast<int32_t>(sets_.size()));
  if (added) {
    sets_.push_back(std::move(tops));
    byte_next_.resize(sets_.size() * 256, kUnknown);
    cp_starts_.resize(sets_.size());
    cp_next_.resize(sets_.size());
  }
  return it->second;
}

int32_t GrammarMatcher::StepCodePoint(int32_t set, uint32_t c) {
  std::vector<int32_t> next;
  for (int32_t top : sets_[set]) {
    if (top < 0) continue;
    const auto [pos, parent] = nodes_[top];
    if (g_->classes[g_->elements[pos].value].Matches(c)) Expand(pos + 1, parent, next);
  }
  return InternSet(std::move(next));
}

int32_t GrammarMatcher::StepNonAscii(int32_t set, uint32_t c) {
  if (cp_starts_[set].empty()) {
    // Cut [0x80, 0x10FFFF] at every first code point and one past every last of the tops' class
    // ranges: inside an interval each class matches all code points or none (a negated class
    // too), so StepCodePoint gives one set for the whole interval.
    std::vector<uint32_t>& starts = cp_starts_[set];
    starts.push_back(0x80);
    for (int32_t top : sets_[set]) {
      if (top < 0) continue;
      for (const auto& [first, last] : g_->classes[g_->elements[nodes_[top].first].value].ranges) {
        if (first > 0x80 && first <= 0x10FFFF) starts.push_back(first);
        if (last >= 0x80 && last < 0x10FFFF) starts.push_back(last + 1);
      }
    }
    std::sort(starts.begin(), starts.end());
    starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
    cp_next_[set].assign(starts.size(), kUnknown);
  }
  const std::vector<uint32_t>& starts = cp_starts_[set];
  const size_t interval =
      starts.size() == 1 ? 0 : static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), c) - starts.begin() - 1);
  if (cp_next_[set][interval] == kUnknown) {
    const int32_t next = StepCodePoint(set, c);  // may grow cp_next_: written by index after
    cp_next_[set][interval] = next;
  }
  return cp_next_[set][interval];
}

bool GrammarMatcher::TakesAnyIn(int32_t set, uint32_t lo, uint32_t hi) const {
  for (int32_t top : sets_[set]) {
    if (top >= 0 && g_->classes[g_->elements[nodes_[top].first].value].MatchesAnyIn(lo, hi)) return true;
  }
  return false;
}

[[gnu::always_inline]] inline std::pair<uint32_t, uint32_t> GrammarMatcher::Reachable(Utf8 utf8) {
  static constexpr uint32_t kSmallest[5] = {0, 0, 0x80, 0x800, 0x10000};  // [length]
  const uint32_t shift = 6 * utf8.remaining;
  const uint32_t lo = std::max(utf8.value << shift, kSmallest[utf8.length]);
  const uint32_t hi = std::min((utf8.value << shift) | ((1u << shift) - 1), uint32_t{0x10FFFF});
  if (lo >= 0xD800 && hi <= 0xDFFF) return {1, 0};  // only surrogates left
  return {lo, hi};
}

bool GrammarMatcher::PendingPlausible(int32_t set, Utf8 utf8) const {
  const auto [lo, hi] = Reachable(utf8);
  return lo <= hi && TakesAnyIn(set, lo, hi);
}

// Inlined into the trie walk, which calls it once per node visited (333K nodes for Qwen 3's
// vocabulary when nearly every token is allowed, as inside a JSON string).
[[gnu::always_inline]] inline bool GrammarMatcher::StepByte(int32_t set, Utf8 utf8, uint8_t byte, int32_t& next_set,
                                                           Utf8& next_utf8) {
  if (utf8.remaining == 0) {
    const size_t slot = static_cast<size_t>(set) * 256 + byte;
    if (byte_next_[slot] == kUnknown) {
      int32_t entry = kDead;  // a continuation byte with no character begun, or never valid UTF-8
      if (byte < 0x80) {
        entry = StepCodePoint(set, byte);  // may grow byte_next_: written by index after
      } else if (byte >= 0xC2 && byte <= 0xF4) {
        // A lead byte: alive (the set stays until the character completes) when some stack takes
        // a character it can begin.
        const uint32_t extra = byte >= 0xF0 ? 3 : byte >= 0xE0 ? 2 : 1;
        entry = PendingPlausible(set, {byte & (0x3Fu >> extra), extra, extra + 1}) ? set : kDead;
      }
      byte_next_[slot] = entry;
    }
    const int32_t value = byte_next_[slot];
    if (value == kDead) return false;
    next_set = value;
    if (byte < 0x80) {
      next_utf8 = {};
    } else {
      const uint32_t extra = byte >= 0xF0 ? 3 : byte >= 0xE0 ? 2 : 1;
      next_utf8 = {byte & (0x3Fu >> extra), extra, extra + 1};
    }
    return true;
  }
  if ((byte & 0xC0) != 0x80) return false;
  const uint32_t value = (utf8.value << 6) | (byte & 0x3F);
  const Utf8 next{value, utf8.remaining - 1, utf8.length};
  const auto [lo, hi] = Reachable(next);
  if (lo > hi) return false;  // overlong, a surrogate or too large: not UTF-8
  if (next.remaining > 0) {
    next_set = set;
    next_utf8 = next;
    return true;
  }
  if (value >= 0xD800 && value <= 0xDFFF) return false;
  const int32_t stepped = StepNonAscii(set, value);
  if (stepped == kDead) return false;
  next_set = stepped;
  next_utf8 = {};
  return true;
}

bool GrammarMatcher::Accept(std::string_view bytes) {
  int32_t set = set_;
  Utf8 utf8 = utf8_;
  for (char b : bytes) {
    if (!StepByte(set, utf8, static_cast<uint8_t>(b), set, utf8)) return false;
  }
  set_ = set;
  utf8_ = utf8;
  return true;
}

bool GrammarMatcher::Allows(std::string_view bytes) {
  int32_t set = set_;
  Utf8 utf8 = utf8_;
  for (char b : bytes) {
    if (!StepByte(set, utf8, static_cast<uint8_t>(b), set, utf8)) return false;
  }
  return true;
}

bool GrammarMatcher::CanEnd() const {
  return utf8_.remaining == 0 && !sets_[set_].empty() && sets_[set_].front() == -1;
}

bool GrammarMatcher::Done() const { return CanEnd() && sets_[set_].size() == 1; }

const std::vector<uint64_t>& GrammarMatcher::AllowedTokens(const TokenTrie& trie) {
  // value < 2^21, remaining < 4, length < 8: disjoint bit fields.
  const uint64_t key = (static_cast<uint64_t>(set_) << 26) | (uint64_t{utf8_.length} << 23) |
                       (uint64_t{utf8_.remaining} << 21) | utf8_.value;
  const size_t words = (static_cast<size_t>(trie.vocab_) + 63) / 64;
  if (auto it = masks_.find(key); it != masks_.end() && it->second.size() == words) {
    mask_ = it->second;
    return mask_;
  }
  mask_.assign(words, 0);
  walk_sets_.resize(trie.max_depth_ + 1);
  walk_utf8_.resize(trie.max_depth_ + 1);
  walk_sets_[0] = set_;
  walk_utf8_[0] = utf8_;
  const int32_t n = trie.nodes();
  for (int32_t i = 1; i < n;) {
    const int32_t d = trie.depth_[i];
    if (!StepByte(walk_sets_[d - 1], walk_utf8_[d - 1], trie.byte_[i], walk_sets_[d], walk_utf8_[d])) {
      i = trie.end_[i];  // no token under this prefix can match
      continue;
    }
    const int32_t first = trie.token_begin_[i], last = trie.token_begin_[i + 1];
    if (first < last && (walk_utf8_[d].remaining == 0 || PendingPlausible(walk_sets_[d], walk_utf8_[d]))) {
      for (int32_t k = first; k < last; ++k) {
        const int32_t t = trie.tokens_[k];
        mask_[t >> 6] |= uint64_t{1} << (t & 63);
      }
    }
    ++i;
  }
  if (masks_.size() >= kMaxMasks) masks_.clear();
  masks_.emplace(key, mask_);
  return mask_;
}

}  // namespace kvq
