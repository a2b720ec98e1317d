// A context-free grammar over Unicode code points, parsed from GBNF as llama.cpp writes it:
//
//   root   ::= object                 # a rule: name ::= alternatives (the start rule is "root")
//   object ::= "{" ws ( pair ( "," ws pair )* )? "}"
//   pair   ::= [a-z]+ ":" ws [0-9]{1,3}
//   ws     ::= [ \t\n]*
//
// Terms: "literal" (escapes \n \r \t \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH), [character class]
// with ranges and negation ([^...]), `.` (any character), a rule name, ( grouping ); postfix
// `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`, `{,n}`; `|` between alternatives; `#` starts a comment.
// A rule ends at the end of its line, except inside parentheses and after `|`.
//
// Compiled form: every alternative of every rule is a run of elements in one array ending with
// kEnd; repetitions and groups become generated rules (named after the rule they appear in:
// "object_1"), as llama.cpp does, so the matcher sees only terminals and rule references.
#pragma once

#include <bitset>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvq/status.h"

namespace kvq {

/// A set of code points: ranges, possibly negated; ASCII answered from a bitmap.
struct CharClass {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  ///< inclusive [first, last]
  bool negated = false;
  std::bitset<128> ascii;  ///< Matches(c) for c < 128, filled by Seal()

  void Seal();
  bool Matches(uint32_t c) const;
  /// Whether some code point in [lo, hi] matches.
  bool MatchesAnyIn(uint32_t lo, uint32_t hi) const;
};

struct GrammarElement {
  enum class Kind : uint8_t {
    kEnd,    ///< the end of an alternative
    kChars,  ///< one code point of classes[value]
    kRule,   ///< rule `value`
  };
  Kind kind = Kind::kEnd;
  int32_t value = 0;
};

struct Grammar {
  std::vector<GrammarElement> elements;        ///< every alternative, each ending with kEnd
  std::vector<std::vector<int32_t>> rules;     ///< [rule] the start index of each alternative
  std::vector<std::string> rule_names;         ///< [rule]
  std::vector<CharClass> classes;              ///< referred to by kChars elements
  int32_t root = -1;                           ///< the rule named "root"
};

/// Parses GBNF. Errors name the line and column and say what was expected there; a rule used but
/// never defined, a missing "root", and left recursion (which a top-down matcher cannot run) are
/// errors naming the rule.
Result<Grammar> ParseGbnf(std::string_view text);

}  // namespace kvq
