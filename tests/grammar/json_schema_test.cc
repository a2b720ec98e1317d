// JsonSchemaToGbnf: schemas of the supported subset become grammars that take exactly the JSON
// texts meant (checked by running the matcher over texts), and everything else is refused with the
// keyword and where it is named.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "grammar/grammar.h"
#include "grammar/grammar_matcher.h"
#include "grammar/json_schema.h"

namespace kvq {
namespace {

// Whether the schema's grammar takes `text` whole.
bool Takes(const std::string& schema, const std::string& text) {
  Result<std::string> gbnf = JsonSchemaToGbnf(schema);
  EXPECT_TRUE(gbnf.ok()) << gbnf.status().message();
  if (!gbnf.ok()) return false;
  Result<Grammar> g = ParseGbnf(gbnf.value());
  EXPECT_TRUE(g.ok()) << g.status().message() << "\n" << gbnf.value();
  if (!g.ok()) return false;
  GrammarMatcher m(std::make_shared<const Grammar>(std::move(g).value()));
  return m.Accept(text) && m.CanEnd();
}

std::string ErrorOf(const std::string& schema) {
  Result<std::string> gbnf = JsonSchemaToGbnf(schema);
  return gbnf.ok() ? "" : gbnf.status().message();
}

TEST(JsonSchema, ObjectsWithRequiredAndOptionalKeys) {
  const std::string s = R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},
      "c":{"type":"boolean"}},"required":["b"]})";
  for (const char* ok : {R"({"b":"x"})", R"({"a":1,"b":"x"})", R"({"a":-20, "b":"", "c":true})", R"({"b":"x","c":false})",
                         "{\n  \"b\": \"\\u00e9\\n\"\n}"}) {
    EXPECT_TRUE(Takes(s, ok)) << ok;
  }
  for (const char* bad : {R"({})", R"({"a":1})", R"({"b":"x","a":1})", R"({"b":"x",})", R"({"b":"x","d":1})",
                          R"({"b":1})", R"({"a":01,"b":"x"})", R"({"a":1.5,"b":"x"})"}) {
    EXPECT_FALSE(Takes(s, bad)) << bad;
  }
  const std::string all_optional = R"({"type":"object","properties":{"a":{"type":"null"},"b":{"type":"null"}}})";
  for (const char* ok : {"{}", R"({"a":null})", R"({"b":null})", R"({"a":null,"b":null})"}) EXPECT_TRUE(Takes(all_optional, ok)) << ok;
  EXPECT_FALSE(Takes(all_optional, R"({"b":null,"a":null})"));  // keys in the schema's order
}

TEST(JsonSchema, ArraysStringsNumbersEnumsRefs) {
  const std::string arr = R"({"type":"array","items":{"type":"number"},"minItems":1,"maxItems":2})";
  for (const char* ok : {"[1]", "[1.5e3, -0.25]", "[ 0 ]"}) EXPECT_TRUE(Takes(arr, ok)) << ok;
  for (const char* bad : {"[]", "[1,2,3]", "[1,]", "[.5]"}) EXPECT_FALSE(Takes(arr, bad)) << bad;
  const std::string str = R"({"type":"string","minLength":2,"maxLength":3})";
  for (const char* ok : {R"("ab")", R"("a\"c")", R"("éàü")"}) EXPECT_TRUE(Takes(str, ok)) << ok;
  for (const char* bad : {R"("a")", R"("abcd")", "\"a\nb\""}) EXPECT_FALSE(Takes(str, bad)) << bad;
  const std::string en = R"({"enum":["x",2,null,{"k":[true]}]})";
  for (const char* ok : {R"("x")", "2", "null", R"({"k":[true]})"}) EXPECT_TRUE(Takes(en, ok)) << ok;
  EXPECT_FALSE(Takes(en, R"("y")"));
  const std::string tree = R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},"$ref":"#/$defs/node"})";
  EXPECT_TRUE(Takes(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})"));
  EXPECT_FALSE(Takes(tree, R"({"v":1,"kids":[{"w":2}]})"));
  const std::string any_of = R"({"anyOf":[{"type":"integer"},{"const":"none"}]})";
  EXPECT_TRUE(Takes(any_of, "7"));
  EXPECT_TRUE(Takes(any_of, R"("none")"));
  EXPECT_FALSE(Takes(any_of, R"("some")"));
  EXPECT_TRUE(Takes(R"({"type":["string","null"]})", "null"));
  EXPECT_TRUE(Takes("{}", R"([{"a":[1,"2",null,false]}])"));
}

TEST(JsonSchema, RefusesWhatItDoesNotSupport) {
  EXPECT_EQ(ErrorOf(R"({"type":"string","pattern":"^a"})"),
            "at '/': unsupported keyword 'pattern' (supported: type, properties, required, additionalProperties, "
            "items, minItems, maxItems, minLength, maxLength, enum, const, anyOf, oneOf, $ref, $defs, definitions)");
  EXPECT_EQ(ErrorOf(R"({"type":"object","properties":{"n":{"type":"integer","minimum":0}}})").substr(0, 52),
            "at '/properties/n': unsupported keyword 'minimum' (s");
  EXPECT_EQ(ErrorOf(R"({"$ref":"#/$defs/missing"})"), "at '/$ref': '#/$defs/missing' does not resolve: the schema has no $defs/missing");
  EXPECT_EQ(ErrorOf(R"({"$ref":"http://x/y.json"})"),
            "at '/$ref': 'http://x/y.json' is not a local reference '#/$defs/NAME' or '#/definitions/NAME'");
  EXPECT_EQ(ErrorOf(R"({"type":"integer","maxLength":3})"), "at '/': 'maxLength' does not apply to type 'integer'");
  EXPECT_EQ(ErrorOf(R"({"type":"object","properties":{},"required":["a"]})"),
            "at '/required': 'a' is required but not in 'properties'");
  EXPECT_EQ(ErrorOf(R"({"type":"text"})"), "at '/type': unknown type 'text' (object, array, string, number, integer, boolean, null)");
  EXPECT_EQ(ErrorOf(R"({"type":"array","items":[{"type":"integer"}]})"), "at '/items': tuple 'items' (a list) is not supported");
  EXPECT_EQ(ErrorOf(R"({"type":"string","minLength":3,"maxLength":2})"), "at '/': maxLength is below minLength");
  EXPECT_EQ(ErrorOf("false"), "at '/': the schema false accepts nothing");
  EXPECT_EQ(ErrorOf("{").substr(0, 8), "not JSON");
}

TEST(JsonSchema, JsonObjectGrammarTakesAnyObjectOnly) {
  Result<Grammar> g = ParseGbnf(JsonObjectGbnf());
  ASSERT_TRUE(g.ok()) << g.status().message();
  auto grammar = std::make_shared<const Grammar>(std::move(g).value());
  for (const char* ok : {"{}", R"({"a":{"b":[1,2,{"c":null}]},"d":"e"})"}) {
    GrammarMatcher m(grammar);
    EXPECT_TRUE(m.Accept(ok) && m.CanEnd()) << ok;
  }
  for (const char* bad : {"[]", "1", R"({"a"})", R"({a:1})"}) {
    GrammarMatcher m(grammar);
    EXPECT_FALSE(m.Accept(bad) && m.CanEnd()) << bad;
  }
}

}  // namespace
}  // namespace kvq
