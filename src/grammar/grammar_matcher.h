// Matching a Grammar (grammar.h) against text as it is generated, and the tokens that may come next.
//
// State: the set of parse stacks the text so far can be in (a pushdown recogniser run on all
// alternatives at once), plus the bytes of a UTF-8 character begun but not finished (a token may
// end inside a character; the next one finishes it). A stack's top is always a character class;
// an empty stack means the grammar may end here.
//
// Stacks are linked nodes (position in the grammar, parent) interned so that equal stacks are the
// same id, and stack sets are interned too, so a step is a memoised function of (set, byte):
// ASCII bytes and UTF-8 lead bytes from a table of 256 entries per set, completed multi-byte
// characters from the set's code-point intervals (cut at its classes' range ends). The
// allowed-token mask walks a byte trie of the vocabulary once in preorder, stepping the set along
// each edge and skipping a subtree as soon as its prefix is refused; masks are cached per state,
// since a state recurs (every token inside an unbounded JSON string leaves the same one). A
// state's first mask is that walk, on the decode path: inside a string nearly every token is
// allowed and the walk visits the whole trie, so its cost per node is what the first mask costs.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"

namespace kvq {

/// The vocabulary's token texts as a byte trie in preorder, built once per vocabulary.
class TokenTrie {
 public:
  /// tokens[i]: the bytes token i adds to the text. Empty tokens (control tokens) are left out:
  /// a grammar never allows them.
  explicit TokenTrie(const std::vector<std::string>& tokens);
  int32_t vocab_size() const { return vocab_; }
  int32_t nodes() const { return static_cast<int32_t>(byte_.size()); }

 private:
  friend class GrammarMatcher;
  std::vector<uint8_t> byte_;          // [nodes] the byte on the edge into the node (root: 0)
  std::vector<uint16_t> depth_;        // [nodes] bytes from the root
  std::vector<int32_t> end_;           // [nodes] one past the node's subtree, in preorder
  std::vector<int32_t> token_begin_;   // [nodes + 1] tokens ending at node i: [token_begin_[i], token_begin_[i + 1])
  std::vector<int32_t> tokens_;        // [tokens with text] ids, grouped by node
  int32_t vocab_ = 0;
  int32_t max_depth_ = 0;
};

class GrammarMatcher {
 public:
  /// At the start of the grammar's root rule.
  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);

  /// Advances over `bytes` if the grammar allows all of them (they may end inside a UTF-8
  /// character); otherwise returns false and changes nothing.
  bool Accept(std::string_view bytes);
  /// Whether Accept(bytes) would take them; changes nothing (Generator asks it of control tokens
  /// kept as text, which the trie leaves out).
  bool Allows(std::string_view bytes);
  /// Whether the text so far is a complete sentence of the grammar.
  bool CanEnd() const;
  /// Whether the text is complete and nothing may follow it.
  bool Done() const;
  /// [ceil(vocab / 64)] bit t of word t / 64 set: token t's bytes may come next (Accept would take
  /// them). Valid until the next call.
  const std::vector<uint64_t>& AllowedTokens(const TokenTrie& trie);

 private:
  struct Utf8 {  // a character begun: its bits so far, the continuation bytes still due, its bytes
    uint32_t value = 0;
    uint32_t remaining = 0;
    uint32_t length = 0;
  };
  // The code points a character so begun can still become, [lo, hi] with lo > hi when none can
  // (an overlong form, a surrogate, beyond U+10FFFF: UTF-8 allows one encoding per code point).
  static std::pair<uint32_t, uint32_t> Reachable(Utf8 utf8);
  static constexpr int32_t kDead = 0;      // the empty stack set: nothing can follow
  static constexpr int32_t kUnknown = -1;  // a table entry not computed yet

  int32_t Node(int32_t pos, int32_t parent);
  // Appends the stacks (tops) reached from grammar position `pos` under `parent`.
  void Expand(int32_t pos, int32_t parent, std::vector<int32_t>& tops);
  int32_t InternSet(std::vector<int32_t> tops);
  // The set after code point c.
  int32_t StepCodePoint(int32_t set, uint32_t c);
  // The same for c >= 128, from the set's intervals (cp_starts_).
  int32_t StepNonAscii(int32_t set, uint32_t c);
  // Whether some stack of `set` takes a code point in [lo, hi].
  bool TakesAnyIn(int32_t set, uint32_t lo, uint32_t hi) const;
  // One byte from (set, utf8); false when the text can no longer match.
  bool StepByte(int32_t set, Utf8 utf8, uint8_t byte, int32_t& next_set, Utf8& next_utf8);
  // Whether a token ending with `utf8` pending may stand (some stack takes a character so begun).
  bool PendingPlausible(int32_t set, Utf8 utf8) const;

  std::shared_ptr<const Grammar> g_;
  std::vector<std::pair<int32_t, int32_t>> nodes_;          // [node] (grammar position, parent node or -1)
  std::unordered_map<uint64_t, int32_t> node_ids_;          // (pos, parent) -> node
  std::vector<std::vector<int32_t>> sets_;                  // [set] sorted tops; -1: the empty stack
  std::map<std::vector<int32_t>, int32_t> set_ids_;
  std::vector<int32_t> byte_next_;                          // [set][256] StepByte from a whole character
  // A set's code points >= 128 cut into intervals at every range end of its tops' classes, so that
  // each interval's code points match the same tops and step to the same set: a completed
  // multi-byte character is a binary search, not a hash lookup per (set, code point), which a
  // vocabulary of 150K tokens makes tens of thousands of.
  std::vector<std::vector<uint32_t>> cp_starts_;            // [set][interval] first code point; empty: not cut yet
  std::vector<std::vector<int32_t>> cp_next_;               // [set][interval] the set after one, kUnknown until stepped
  std::vector<int32_t> scratch_;
  int32_t set_ = kDead;
  Utf8 utf8_;
  // AllowedTokens' cache: (set, utf8) -> mask; cleared when it holds kMaxMasks.
  static constexpr size_t kMaxMasks = 64;
  std::unordered_map<uint64_t, std::vector<uint64_t>> masks_;
  std::vector<uint64_t> mask_;       // [ceil(vocab / 64)] what AllowedTokens returns
  std::vector<int32_t> walk_sets_;   // [max depth + 1] the set at each depth of the trie walk
  std::vector<Utf8> walk_utf8_;      // [max depth + 1]
};

}  // namespace kvq
