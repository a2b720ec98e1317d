// GrammarMatcher: which texts a grammar takes (whole, and byte by byte as tokens cut them, UTF-8
// characters split across tokens included), when it may end, and that the allowed-token mask of
// the trie walk is exactly the tokens Accept would take, checked token by token on a copy.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/grammar_matcher.h"
#include "grammar/json_schema.h"

namespace kvq {
namespace {

std::shared_ptr<const Grammar> Compile(const std::string& gbnf) {
  Result<Grammar> g = ParseGbnf(gbnf);
  EXPECT_TRUE(g.ok()) << g.status().message();
  return std::make_shared<const Grammar>(g.ok() ? std::move(g).value() : Grammar{});
}

// Whether the grammar takes all of `text` and may end after it.
bool Matches(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.Accept(text) && m.CanEnd();
}

TEST(GrammarMatcher, AcceptsAndRejectsWholeTexts) {
  auto g = Compile("root ::= \"(\" item (\",\" item)* \")\"\nitem ::= [a-c]+ | [0-9]{2}");
  for (const char* ok : {"(a)", "(abc,12)", "(99,b,cc)"}) EXPECT_TRUE(Matches(g, ok)) << ok;
  for (const char* bad : {"()", "(a,)", "(1)", "(123)", "(d)", "(a", "a)", "(a))"}) EXPECT_FALSE(Matches(g, bad)) << bad;

  auto any = Compile("root ::= \"<\" [^>]* \">\" .");
  EXPECT_TRUE(Matches(any, "<héllo wörld>!"));
  EXPECT_TRUE(Matches(any, "<>\xF0\x9F\x98\x80"));  // . is any character, four bytes here
  EXPECT_FALSE(Matches(any, "<a>b>"));
  EXPECT_FALSE(Matches(any, "<a>"));

  auto counted = Compile("root ::= \"x\"{2,3} \"y\"{,1} \"z\"{2,}");
  for (const char* ok : {"xxzz", "xxxyzzzzz"}) EXPECT_TRUE(Matches(counted, ok)) << ok;
  for (const char* bad : {"xzz", "xxxxzz", "xxyyzz", "xxz"}) EXPECT_FALSE(Matches(counted, bad)) << bad;
}

TEST(GrammarMatcher, RefusedBytesChangeNothing) {
  auto g = Compile("root ::= \"ab\" \"c\"*");
  GrammarMatcher m(g);
  EXPECT_FALSE(m.Accept("ax"));
  EXPECT_TRUE(m.Accept("a"));
  EXPECT_FALSE(m.CanEnd());
  EXPECT_FALSE(m.Accept("bd"));
  EXPECT_TRUE(m.Accept("b"));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_FALSE(m.Done());  // more c's may follow
  EXPECT_TRUE(m.Accept("ccc"));
  EXPECT_TRUE(m.CanEnd());

  GrammarMatcher done(Compile("root ::= \"ok\""));
  EXPECT_TRUE(done.Accept("ok"));
  EXPECT_TRUE(done.Done());
  EXPECT_FALSE(done.Accept("k"));
}

TEST(GrammarMatcher, Utf8SplitAcrossTokens) {
  auto g = Compile("root ::= [é-ê] \"日本\" [^a]");
  const std::string text = "é日本\xF0\x9F\x98\x80";  // 2 + 3 + 3 + 4 bytes
  // Every way of cutting the text into two or three pieces: the same verdict as whole.
  for (size_t i = 0; i <= text.size(); ++i) {
    for (size_t j = i; j <= text.size(); ++j) {
      GrammarMatcher m(g);
      ASSERT_TRUE(m.Accept(text.substr(0, i))) << i;
      ASSERT_TRUE(m.Accept(text.substr(i, j - i))) << i << " " << j;
      ASSERT_TRUE(m.Accept(text.substr(j))) << j;
      EXPECT_TRUE(m.CanEnd());
    }
  }
  GrammarMatcher m(g);
  ASSERT_TRUE(m.Accept("\xC3"));   // the first byte of é (U+00E9)
  EXPECT_FALSE(m.CanEnd());        // a character is pending
  EXPECT_FALSE(m.Accept("\xA0"));  // à (U+00E0) is not in [é-ê]
  EXPECT_TRUE(m.Accept("\xAA"));   // ê (U+00EA)
  GrammarMatcher lead(g);
  EXPECT_FALSE(lead.Accept("\xE6"));  // a three-byte character: none is in [é-ê]
  EXPECT_FALSE(lead.Accept("\x80"));  // a continuation byte with nothing begun
  EXPECT_FALSE(lead.Accept("\xFF"));  // never UTF-8
  // Overlong forms of an allowed character are not UTF-8: refused (found by sampling byte tokens).
  GrammarMatcher o(Compile("root ::= \"o\""));
  EXPECT_FALSE(o.Accept("\xF0\x80\x81\xAF"));
  EXPECT_FALSE(o.Accept("\xC1\xAF"));
  EXPECT_FALSE(o.Accept("\xE0\x81\xAF"));
  GrammarMatcher any(Compile("root ::= ."));
  EXPECT_FALSE(any.Accept("\xED\xA0\x80"));      // a surrogate
  EXPECT_FALSE(any.Accept("\xF4\x90\x80\x80"));  // beyond U+10FFFF
  EXPECT_TRUE(any.Accept("\xF4\x8F\xBF\xBF"));   // U+10FFFF itself
}

std::string Utf8Of(uint32_t c) {
  if (c < 0x80) return std::string(1, static_cast<char>(c));
  if (c < 0x800) return {static_cast<char>(0xC0 | c >> 6), static_cast<char>(0x80 | (c & 0x3F))};
  if (c < 0x10000) {
    return {static_cast<char>(0xE0 | c >> 12), static_cast<char>(0x80 | (c >> 6 & 0x3F)),
            static_cast<char>(0x80 | (c & 0x3F))};
  }
  return {static_cast<char>(0xF0 | c >> 18), static_cast<char>(0x80 | (c >> 12 & 0x3F)),
          static_cast<char>(0x80 | (c >> 6 & 0x3F)), static_cast<char>(0x80 | (c & 0x3F))};
}

TEST(GrammarMatcher, MultiByteCharactersAtClassRangeEnds) {
  // The classes cut the code points >= 128 into many intervals, a negated class among them; each
  // character is asked twice, once per alternative, of one matcher, so a step remembered for one
  // interval is reused (and must be right) for the other code points of it.
  auto g = Compile("root ::= [é-ê日α-ω] \"a\" | [^é-ÿぁ-ヿ] \"b\"");
  GrammarMatcher m(g);
  const std::vector<uint32_t> chars = {0x80,   0xE8,   0xE9,   0xEA,   0xEB,   0xFF,    0x100,    0x3B0,
                                       0x3B1,  0x3C0,  0x3C9,  0x3CA,  0x3040, 0x3041,  0x3099,   0x30FF,
                                       0x3100, 0x65E4, 0x65E5, 0x65E6, 0xFFFF, 0x10000, 0x10FFFF, 0x7FF};
  for (int round = 0; round < 2; ++round) {
    for (uint32_t c : chars) {
      const bool first = (c >= 0xE9 && c <= 0xEA) || c == 0x65E5 || (c >= 0x3B1 && c <= 0x3C9);
      const bool second = !(c >= 0xE9 && c <= 0xFF) && !(c >= 0x3041 && c <= 0x30FF);
      EXPECT_EQ(m.Allows(Utf8Of(c) + "a"), first) << std::hex << c;
      EXPECT_EQ(m.Allows(Utf8Of(c) + "b"), second) << std::hex << c;
    }
  }
}

// The trie walk against the definition: token t is allowed iff a copy of the matcher Accepts it.
void ExpectMaskIsExact(GrammarMatcher& m, const std::vector<std::string>& tokens, const TokenTrie& trie) {
  const std::vector<uint64_t> mask = m.AllowedTokens(trie);
  for (size_t t = 0; t < tokens.size(); ++t) {
    GrammarMatcher copy = m;
    const bool accepted = !tokens[t].empty() && copy.Accept(tokens[t]);
    const bool allowed = (mask[t / 64] >> (t % 64)) & 1;
    ASSERT_EQ(allowed, accepted) << "token " << t << " '" << tokens[t] << "'";
  }
}

TEST(GrammarMatcher, AllowedTokensEqualTokenByTokenAccept) {
  // A vocabulary of single bytes, JSON-ish pieces, shared prefixes, duplicates, an empty
  // (control) token, and pieces of UTF-8 characters.
  std::vector<std::string> tokens = {"", "{", "}", "\"", ":", ",", " ", "\n", "{\"", "\":", "\",", "\"}",
                                     "true", "tr", "t", "false", "null", "1", "12", "123", "-", "0", ".5",
                                     "e", "a", "ab", "abc", "name", "\"name", "é", "\xC3", "\xA9", "日",
                                     "\xE6\x97", "\xA5", "\\", "\\n", "\\u00", "ab", "[", "]", "[]", " \"",
                                     "\xF0", "\x80", "\x81", "\xAF", "\xE0\x81", "\xC1"};
  for (int c = 32; c < 127; ++c) tokens.push_back(std::string(1, static_cast<char>(c)));
  TokenTrie trie(tokens);
  Result<std::string> gbnf = JsonSchemaToGbnf(R"({"type":"object","properties":{
      "name":{"type":"string","maxLength":6},"n":{"type":"integer"},"ok":{"type":"boolean"},
      "tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":2}},"required":["name"]})");
  ASSERT_TRUE(gbnf.ok()) << gbnf.status().message();
  GrammarMatcher m(Compile(gbnf.value()));
  // Walk a random path of allowed tokens, checking the mask at every step.
  std::mt19937 rng(7);
  for (int step = 0; step < 60 && !m.Done(); ++step) {
    ExpectMaskIsExact(m, tokens, trie);
    const std::vector<uint64_t> mask = m.AllowedTokens(trie);
    std::vector<size_t> allowed;
    for (size_t t = 0; t < tokens.size(); ++t) {
      if ((mask[t / 64] >> (t % 64)) & 1) allowed.push_back(t);
    }
    if (allowed.empty()) break;
    ASSERT_TRUE(m.Accept(tokens[allowed[rng() % allowed.size()]]));
  }
  // The mask of a state reached again comes from the cache: still exact.
  ExpectMaskIsExact(m, tokens, trie);
  GrammarMatcher split(Compile("root ::= \"é日\""));
  ExpectMaskIsExact(split, tokens, trie);
  ASSERT_TRUE(split.Accept("\xC3"));
  ExpectMaskIsExact(split, tokens, trie);  // "\xA9" (the rest of é) allowed, "é" not
  ASSERT_TRUE(split.Accept("\xA9\xE6\x97"));
  ExpectMaskIsExact(split, tokens, trie);
}

}  // namespace
}  // namespace kvq
