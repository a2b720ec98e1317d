// ParseGbnf (see grammar.h): a recursive-descent parser over the GBNF text, building rules of
// alternatives of elements; repetitions and groups become generated rules; then the checks that
// need the whole grammar (undefined rules, "root", left recursion) and the flat element array.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>

#include "grammar/grammar.h"

namespace kvq {

void CharClass::Seal() {
  for (uint32_t c = 0; c < 128; ++c) {
    bool in = false;
    for (const auto& [first, last] : ranges) in = in || (first <= c && c <= last);
    ascii[c] = in != negated;
  }
}

bool CharClass::Matches(uint32_t c) const {
  if (c < 128) return ascii[c];
  bool in = false;
  for (const auto& [first, last] : ranges) in = in || (first <= c && c <= last);
  return in != negated;
}

bool CharClass::MatchesAnyIn(uint32_t lo, uint32_t hi) const {
  if (!negated) {
    for (const auto& [first, last] : ranges) {
      if (first <= hi && lo <= last) return true;
    }
    return false;
  }
  // Negated: some code point of [lo, hi] escapes every range unless one range covers it all (a
  // union of several ranges covering it is taken as "may match": a token is then let through
  // whose next character decides, never one the grammar needs refused).
  for (const auto& [first, last] : ranges) {
    if (first <= lo && hi <= last) return false;
  }
  return true;
}

namespace {

using Sequence = std::vector<GrammarElement>;

struct ParseError {
  std::string message;
};

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : text_(text) {}

  Grammar Parse() {
    SkipSpace(true);
    while (!AtEnd()) {
      const size_t name_at = pos_;
      const std::string name = ParseName("a rule name");
      const int32_t rule = RuleId(name, name_at);
      if (defined_[rule]) Fail(name_at, fmt::format("rule '{}' is defined twice", name));
      SkipSpace(false);
      if (text_.substr(pos_, 3) != "::=") Fail(pos_, "expected '::=' after the rule name");
      pos_ += 3;
      SkipSpace(true);
      alternatives_[rule] = ParseAlternatives(name, false);
      defined_[rule] = true;
      if (!AtEnd() && Peek() != '\n' && Peek() != '\r') {
        Fail(pos_, "expected the end of the rule (a new line) or another term");
      }
      SkipSpace(true);
    }
    for (size_t r = 0; r < names_.size(); ++r) {
      if (!defined_[r]) Fail(first_use_[r], fmt::format("rule '{}' is used but never defined", names_[r]));
    }
    const auto root = ids_.find("root");
    if (root == ids_.end()) throw ParseError{"the grammar has no rule named 'root' (where matching starts)"};
    CheckLeftRecursion();
    Grammar g;
    g.classes = std::move(classes_);
    g.rule_names = names_;
    g.root = root->second;
    g.rules.resize(names_.size());
    for (size_t r = 0; r < names_.size(); ++r) {
      for (const Sequence& alt : alternatives_[r]) {
        g.rules[r].push_back(static_cast<int32_t>(g.elements.size()));
        g.elements.insert(g.elements.end(), alt.begin(), alt.end());
        g.elements.push_back({GrammarElement::Kind::kEnd, 0});
      }
    }
    return g;
  }

 private:
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }

  [[noreturn]] void Fail(size_t at, const std::string& what) const {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    std::string found = at >= text_.size() ? "the end of the text" : fmt::format("'{}'", text_[at]);
    if (at < text_.size() && text_[at] == '\n') found = "the end of the line";
    throw ParseError{fmt::format("line {}, column {}: {} (found {})", line, column, what, found)};
  }

  // Spaces, tabs and comments; line ends too when `newlines`.
  void SkipSpace(bool newlines) {
    while (!AtEnd()) {
      const char c = Peek();
      if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
        ++pos_;
      } else if (c == '#') {
        while (!AtEnd() && Peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  static bool IsNameChar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }

  std::string ParseName(const char* what) {
    const size_t start = pos_;
    while (!AtEnd() && IsNameChar(Peek())) ++pos_;
    if (pos_ == start) Fail(start, fmt::format("expected {} (letters, digits, '-', '_')", what));
    return std::string(text_.substr(start, pos_ - start));
  }

  int32_t RuleId(const std::string& name, size_t used_at) {
    const auto [it, added] = ids_.emplace(name, static_cast<int32_t>(names_.size()));
    if (added) {
      names_.push_back(name);
      alternatives_.emplace_back();
      defined_.push_back(false);
      first_use_.push_back(used_at);
    }
    return it->second;
  }

  int32_t NewRule(const std::string& parent, std::vector<Sequence> alternatives) {
    std::string name;
    do {
      name = fmt::format("{}_{}", parent, ++generated_);
    } while (ids_.count(name) > 0);
    const int32_t rule = RuleId(name, pos_);
    alternatives_[rule] = std::move(alternatives);
    defined_[rule] = true;
    return rule;
  }

  // One code point of the text, UTF-8 decoded.
  uint32_t ParseCodePoint() {
    const auto lead = static_cast<unsigned char>(Peek());
    const int extra = lead < 0x80 ? 0 : lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : -1;
    if (extra < 0 || pos_ + extra >= text_.size()) Fail(pos_, "expected a UTF-8 character");
    uint32_t c = extra == 0 ? lead : lead & (0x3F >> extra);
    for (int i = 1; i <= extra; ++i) {
      const auto b = static_cast<unsigned char>(text_[pos_ + i]);
      if ((b & 0xC0) != 0x80) Fail(pos_, "expected a UTF-8 character");
      c = (c << 6) | (b & 0x3F);
    }
    pos_ += extra + 1;
    return c;
  }

  uint32_t ParseHex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = Peek();
      int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) Fail(pos_, fmt::format("expected {} hex digits", digits));
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  // A character of a literal or a class, escapes decoded.
  uint32_t ParseChar() {
    if (AtEnd()) Fail(pos_, "expected a character");
    if (Peek() != '\\') return ParseCodePoint();
    ++pos_;
    const char e = Peek();
    ++pos_;
    switch (e) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': return static_cast<uint32_t>(e);
      case 'x': return ParseHex(2);
      case 'u': return ParseHex(4);
      case 'U': return ParseHex(8);
      default: Fail(pos_ - 1, "expected an escape: \\n \\r \\t \\\\ \\\" \\[ \\] \\- \\xHH \\uHHHH \\UHHHHHHHH");
    }
  }

  GrammarElement AddClass(CharClass c) {
    c.Seal();
    classes_.push_back(std::move(c));
    return {GrammarElement::Kind::kChars, static_cast<int32_t>(classes_.size() - 1)};
  }

  std::vector<Sequence> ParseAlternatives(const std::string& rule, bool nested) {
    std::vector<Sequence> alternatives{ParseSequence(rule, nested)};
    while (Peek() == '|') {
      ++pos_;
      SkipSpace(true);
      alternatives.push_back(ParseSequence(rule, nested));
    }
    return alternatives;
  }

  Sequence ParseSequence(const std::string& rule, bool nested) {
    Sequence seq;
    while (!AtEnd()) {
      const size_t term_at = pos_;
      Sequence term;
      const char c = Peek();
      if (c == '"') {
        ++pos_;
        while (Peek() != '"') {
          if (AtEnd() || Peek() == '\n') Fail(pos_, "expected '\"' closing the literal");
          const uint32_t ch = ParseChar();
          term.push_back(AddClass({.ranges = {{ch, ch}}}));
        }
        ++pos_;
      } else if (c == '[') {
        ++pos_;
        CharClass cls;
        if (Peek() == '^') {
          cls.negated = true;
          ++pos_;
        }
        while (Peek() != ']') {
          if (AtEnd() || Peek() == '\n') Fail(pos_, "expected ']' closing the character class");
          const uint32_t first = ParseChar();
          uint32_t last = first;
          if (Peek() == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
            ++pos_;
            last = ParseChar();
            if (last < first) Fail(pos_ - 1, "expected a range's end not below its start");
          }
          cls.ranges.emplace_back(first, last);
        }
        ++pos_;
        term.push_back(AddClass(std::move(cls)));
      } else if (c == '.') {
        ++pos_;
        term.push_back(AddClass({.negated = true}));
      } else if (c == '(') {
        ++pos_;
        SkipSpace(true);
        std::vector<Sequence> group = ParseAlternatives(rule, true);
        if (Peek() != ')') Fail(pos_, "expected ')' closing the group, or another term");
        ++pos_;
        term.push_back({GrammarElement::Kind::kRule, NewRule(rule, std::move(group))});
      } else if (IsNameChar(c)) {
        const std::string name = ParseName("a rule name");
        term.push_back({GrammarElement::Kind::kRule, RuleId(name, term_at)});
      } else {
        break;  // the end of the sequence: '|', ')', a line end, or an error the caller names
      }
      SkipSpace(nested);
      ApplyRepetitions(rule, term, nested);
      seq.insert(seq.end(), term.begin(), term.end());
    }
    return seq;
  }

  // Postfix operators after a term: the term becomes min copies followed by an optional tail.
  void ApplyRepetitions(const std::string& rule, Sequence& term, bool nested) {
    while (true) {
      int64_t min = 0, max = -1;  // max -1: unbounded
      const char c = Peek();
      if (c == '*') {
        ++pos_;
      } else if (c == '+') {
        ++pos_;
        min = 1;
      } else if (c == '?') {
        ++pos_;
        max = 1;
      } else if (c == '{') {
        const size_t brace = pos_;
        ++pos_;
        SkipSpace(false);
        auto number = [&]() -> std::optional<int64_t> {
          if (Peek() < '0' || Peek() > '9') return std::nullopt;
          int64_t v = 0;
          while (Peek() >= '0' && Peek() <= '9') {
            v = v * 10 + (Peek() - '0');
            if (v > kMaxRepeat) Fail(pos_, fmt::format("expected a repetition count of at most {}", kMaxRepeat));
            ++pos_;
          }
          return v;
        };
        std::optional<int64_t> lo = number();
        SkipSpace(false);
        if (Peek() == ',') {
          ++pos_;
          SkipSpace(false);
          std::optional<int64_t> hi = number();
          min = lo.value_or(0);
          max = hi.value_or(-1);
          if (!lo && !hi) Fail(brace, "expected a count in the repetition '{m,n}'");
        } else {
          if (!lo) Fail(pos_, "expected a count in the repetition '{m}'");
          min = max = *lo;
        }
        SkipSpace(false);
        if (Peek() != '}') Fail(pos_, "expected '}' closing the repetition");
        ++pos_;
        if (max >= 0 && max < min) Fail(brace, "expected a repetition '{m,n}' with m <= n");
      } else {
        return;
      }
      SkipSpace(nested);
      term = Repeat(rule, term, min, max);
    }
  }

  Sequence Repeat(const std::string& rule, const Sequence& term, int64_t min, int64_t max) {
    Sequence out;
    for (int64_t i = 0; i < min; ++i) out.insert(out.end(), term.begin(), term.end());
    if (max < 0) {
      // tail ::= term tail | (empty): right recursion, so a long run never deepens the stack
      // (the matcher continues a rule's last element in place of returning to it).
      const int32_t tail = NewRule(rule, {});
      Sequence again = term;
      again.push_back({GrammarElement::Kind::kRule, tail});
      alternatives_[tail] = {again, {}};
      out.push_back({GrammarElement::Kind::kRule, tail});
    } else if (max > min) {
      // opt_1 ::= term opt_2 | (empty) ... opt_k ::= term | (empty): at most max - min more.
      int32_t next = -1;
      for (int64_t i = max - min; i >= 1; --i) {
        Sequence one = term;
        if (next >= 0) one.push_back({GrammarElement::Kind::kRule, next});
        next = NewRule(rule, {one, {}});
      }
      out.push_back({GrammarElement::Kind::kRule, next});
    }
    return out;
  }

  // A rule that can reach itself without consuming a character would make the matcher expand
  // forever: refused, naming the rule.
  void CheckLeftRecursion() const {
    const size_t n = names_.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const Sequence& alt : alternatives_[r]) {
          bool all = true;
          for (const GrammarElement& e : alt) {
            all = all && e.kind == GrammarElement::Kind::kRule && nullable[e.value];
          }
          if (all) {
            nullable[r] = changed = true;
            break;
          }
        }
      }
    }
    std::vector<std::vector<int32_t>> leftmost(n);
    for (size_t r = 0; r < n; ++r) {
      for (const Sequence& alt : alternatives_[r]) {
        for (const GrammarElement& e : alt) {
          if (e.kind != GrammarElement::Kind::kRule) break;
          leftmost[r].push_back(e.value);
          if (!nullable[e.value]) break;
        }
      }
    }
    std::vector<uint8_t> state(n, 0);  // 0 unseen, 1 on the path, 2 done
    std::vector<std::pair<int32_t, size_t>> path;
    for (size_t start = 0; start < n; ++start) {
      if (state[start] != 0) continue;
      path.push_back({static_cast<int32_t>(start), 0});
      state[start] = 1;
      while (!path.empty()) {
        auto& [r, next] = path.back();
        if (next == leftmost[r].size()) {
          state[r] = 2;
          path.pop_back();
          continue;
        }
        const int32_t to = leftmost[r][next++];
        if (state[to] == 1) {
          throw ParseError{fmt::format("rule '{}' is left-recursive: it can reach itself without matching a "
                                       "character, which a top-down matcher cannot run",
                                       names_[to])};
        }
        if (state[to] == 0) {
          state[to] = 1;
          path.push_back({to, 0});
        }
      }
    }
  }

  static constexpr int64_t kMaxRepeat = 100000;

  std::string_view text_;
  size_t pos_ = 0;
  std::map<std::string, int32_t> ids_;
  std::vector<std::string> names_;                     // [rule]
  std::vector<std::vector<Sequence>> alternatives_;    // [rule]
  std::vector<bool> defined_;                          // [rule]
  std::vector<size_t> first_use_;                      // [rule] text offset of its first mention
  std::vector<CharClass> classes_;
  int generated_ = 0;
};

}  // namespace

Result<Grammar> ParseGbnf(std::string_view text) {
  try {
    return GbnfParser(text).Parse();
  } catch (const ParseError& e) {
    return Status::Error(e.message);
  }
}

}  // namespace kvq
