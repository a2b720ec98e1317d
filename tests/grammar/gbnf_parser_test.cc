// ParseGbnf: what it accepts (the syntax llama.cpp's GBNF files use) and how it refuses the rest,
// each error naming the line, the column and what was expected.
#include <gtest/gtest.h>

#include <string>

#include "grammar/grammar.h"

namespace kvq {
namespace {

// The error message of parsing `text`, or "" if it parsed.
std::string ErrorOf(const std::string& text) {
  Result<Grammar> g = ParseGbnf(text);
  return g.ok() ? "" : g.status().message();
}

TEST(GbnfParser, AcceptsLlamaCppSyntax) {
  const char* grammars[] = {
      "root ::= \"yes\" | \"no\"",
      "root ::= [a-z]+ # a comment\n",
      "# leading comment\nroot ::= item (\",\" item)*\nitem ::= [0-9]{1,3}\n",
      "root ::= (\n  \"a\" |\n  \"b\"\n)\n",
      "root ::= [^\"\\\\] . [\\x41-\\x5A] [\\u00e9] \"\\U0001F600\"",
      "root ::= x{2} x{2,} x{,3} x{1,4} x? x*\nx ::= \"x\"",
      "root ::= | \"a\"",
      "root ::= \"a\" |\n  \"b\"",
      "root ::= [-+] [a-] \"\\t\\n\\r\\\"\"",
      "root  ::=  ws-rule\nws-rule ::= [ \\t\\n]*",
  };
  for (const char* text : grammars) EXPECT_EQ(ErrorOf(text), "") << text;
}

TEST(GbnfParser, CompilesRepetitionsIntoRules) {
  Result<Grammar> g = ParseGbnf("root ::= \"a\"{2,4}");
  ASSERT_TRUE(g.ok()) << g.status().message();
  // root: a a opt1; opt1 ::= a opt2 | ; opt2 ::= a |  -> three rules, root named root.
  EXPECT_EQ(g.value().rules.size(), 3u);
  EXPECT_EQ(g.value().rule_names[g.value().root], "root");
}

TEST(GbnfParser, ErrorsNameLineColumnAndExpectation) {
  EXPECT_EQ(ErrorOf("root ::= \"abc"), "line 1, column 14: expected '\"' closing the literal (found the end of the text)");
  EXPECT_EQ(ErrorOf("root ::= [a-z"), "line 1, column 14: expected ']' closing the character class (found the end of the text)");
  EXPECT_EQ(ErrorOf("root ::= (\"a\" \"b\""), "line 1, column 18: expected ')' closing the group, or another term (found the end of the text)");
  EXPECT_EQ(ErrorOf("root := \"a\""), "line 1, column 6: expected '::=' after the rule name (found ':')");
  EXPECT_EQ(ErrorOf("root ::= \"a\"\n\nitem ::= @"), "line 3, column 10: expected the end of the rule (a new line) or another term (found '@')");
  EXPECT_EQ(ErrorOf("root ::= \"\\q\""), "line 1, column 12: expected an escape: \\n \\r \\t \\\\ \\\" \\[ \\] \\- \\xHH \\uHHHH \\UHHHHHHHH (found 'q')");
  EXPECT_EQ(ErrorOf("root ::= x{3,1}\nx ::= \"x\""), "line 1, column 11: expected a repetition '{m,n}' with m <= n (found '{')");
  EXPECT_EQ(ErrorOf("root ::= x{}\nx ::= \"x\""), "line 1, column 12: expected a count in the repetition '{m}' (found '}')");
  EXPECT_EQ(ErrorOf("root ::= [z-a]"), "line 1, column 13: expected a range's end not below its start (found 'a')");
  EXPECT_EQ(ErrorOf("root ::= \"a\" | \"b\"\n| \"c\""), "line 2, column 1: expected a rule name (letters, digits, '-', '_') (found '|')");
}

TEST(GbnfParser, WholeGrammarChecks) {
  EXPECT_EQ(ErrorOf("root ::= item\n"), "line 1, column 10: rule 'item' is used but never defined (found 'i')");
  EXPECT_EQ(ErrorOf("start ::= \"a\""), "the grammar has no rule named 'root' (where matching starts)");
  EXPECT_EQ(ErrorOf("root ::= \"a\"\nroot ::= \"b\""), "line 2, column 1: rule 'root' is defined twice (found 'r')");
  EXPECT_EQ(ErrorOf("root ::= root \"a\" | \"b\""),
            "rule 'root' is left-recursive: it can reach itself without matching a character, which a top-down "
            "matcher cannot run");
  // Through a nullable rule: empty? then root.
  EXPECT_NE(ErrorOf("root ::= empty root \"a\" | \"b\"\nempty ::= \"x\"?").find("left-recursive"), std::string::npos);
  // A repetition of something that can match nothing would loop without consuming a character.
  EXPECT_NE(ErrorOf("root ::= (\"a\"?)*").find("left-recursive"), std::string::npos);
  EXPECT_EQ(ErrorOf(""), "the grammar has no rule named 'root' (where matching starts)");
}

}  // namespace
}  // namespace kvq
