// Generation under a grammar, end to end through Session::Generate on a random-weight model with
// GPT-2's real 50,257-token vocabulary (byte-level BPE: tokens hold parts of UTF-8 characters):
// 200 sampled completions over 10 JSON schemas all parse and validate (by the small validator
// below, for the subset json_schema.h supports), and 50 over 5 GBNF grammars are all accepted by
// the matcher run again over the finished text. Every schema and grammar here is bounded (string
// lengths, counts, digits), so each completion must end by the grammar (finish "stop") well
// within max_tokens. A random model's choice among the allowed tokens is arbitrary, so this
// exercises the masks over many different states, not one greedy path.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/grammar_matcher.h"
#include "kvq/generator.h"
#include "kvq/model.h"
#include "kvq/session.h"
#include "synth/synth.h"

namespace kvq {
namespace {

using Json = nlohmann::ordered_json;

const Model& Gpt2Synth() {
  static std::unique_ptr<Model> model = [] {
    namespace fs = std::filesystem;
    const std::string path =
        (fs::path(::testing::TempDir()) / ("kvq_grammar_gen_" + std::to_string(::getpid()) + ".gguf")).string();
    const SynthSpec spec{.arch = SynthArch::kLlama, .dim = 64, .n_layers = 1, .n_heads = 4, .n_kv_heads = 2,
                         .hidden_dim = 128, .context = 2048, .type = "f32", .seed = 11};
    const std::string vocab = std::string(KVQ_SOURCE_DIR) + "/tests/testdata/vocab/ggml-vocab-gpt-2.gguf";
    Status written = WriteSynthModel(spec, vocab, path);
    EXPECT_TRUE(written.ok()) << written.message();
    Result<std::unique_ptr<Model>> m = Model::Load(path, {.threads = 2});
    fs::remove(path);
    EXPECT_TRUE(m.ok()) << m.status().message();
    return m.ok() ? std::move(m).value() : nullptr;
  }();
  return *model;
}

size_t CodePoints(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// Whether `v` satisfies `schema` (the subset of json_schema.h; `root` resolves $ref). Keys outside
// `properties` are refused: the grammar never writes them.
bool Valid(const Json& v, const Json& schema, const Json& root) {
  if (schema.contains("$ref")) {
    const std::string ref = schema["$ref"];
    const std::string section = ref.rfind("#/$defs/", 0) == 0 ? "$defs" : "definitions";
    return Valid(v, root[section][ref.substr(ref.find('/', 2) + 1)], root);
  }
  if (schema.contains("const")) return v == schema["const"];
  if (schema.contains("enum")) {
    for (const Json& e : schema["enum"]) {
      if (v == e) return true;
    }
    return false;
  }
  if (schema.contains("anyOf")) {
    for (const Json& s : schema["anyOf"]) {
      if (Valid(v, s, root)) return true;
    }
    return false;
  }
  if (schema.contains("oneOf")) {
    int matched = 0;
    for (const Json& s : schema["oneOf"]) matched += Valid(v, s, root) ? 1 : 0;
    return matched == 1;
  }
  if (!schema.contains("type")) return true;
  auto of_type = [&](const std::string& t) {
    if (t == "null") return v.is_null();
    if (t == "boolean") return v.is_boolean();
    if (t == "integer") return v.is_number_integer();
    if (t == "number") return v.is_number();
    if (t == "string") {
      if (!v.is_string()) return false;
      const size_t n = CodePoints(v.get<std::string>());
      return n >= schema.value("minLength", size_t{0}) && n <= schema.value("maxLength", size_t{1} << 30);
    }
    if (t == "array") {
      if (!v.is_array()) return false;
      if (v.size() < schema.value("minItems", size_t{0}) || v.size() > schema.value("maxItems", size_t{1} << 30)) {
        return false;
      }
      for (const Json& item : v) {
        if (schema.contains("items") && !Valid(item, schema["items"], root)) return false;
      }
      return true;
    }
    if (t == "object") {
      if (!v.is_object()) return false;
      if (!schema.contains("properties")) return true;
      for (const auto& [key, value] : v.items()) {
        if (!schema["properties"].contains(key) || !Valid(value, schema["properties"][key], root)) return false;
      }
      for (const Json& k : schema.value("required", Json::array())) {
        if (!v.contains(k.get<std::string>())) return false;
      }
      return true;
    }
    return false;
  };
  if (schema["type"].is_string()) return of_type(schema["type"]);
  for (const Json& t : schema["type"]) {
    if (of_type(t)) return true;
  }
  return false;
}

TEST(ConstrainedGeneration, ValidatorRefusesWhatSchemasRefuse) {
  // The validator must be able to fail, or the test below proves nothing.
  const Json person = Json::parse(R"({"type":"object","properties":{"name":{"type":"string","maxLength":3},
      "n":{"type":"integer"}},"required":["name"]})");
  EXPECT_TRUE(Valid(Json::parse(R"({"name":"abc","n":2})"), person, person));
  EXPECT_FALSE(Valid(Json::parse(R"({"name":"abcd"})"), person, person));
  EXPECT_FALSE(Valid(Json::parse(R"({"n":2})"), person, person));
  EXPECT_FALSE(Valid(Json::parse(R"({"name":"a","n":2.5})"), person, person));
  EXPECT_FALSE(Valid(Json::parse(R"({"name":"a","x":1})"), person, person));
}

const char* kSchemas[] = {
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},"age":{"type":"integer"}},
        "required":["name","age"]})",
    R"({"enum":["red","green","blue"]})",
    R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":4})",
    R"({"type":"object","properties":{"user":{"type":"object","properties":{"id":{"type":"integer"},
        "tags":{"type":"array","items":{"enum":["a","b","c"]},"maxItems":3}},"required":["id","tags"]},
        "active":{"type":"boolean"}},"required":["user","active"]})",
    R"({"type":["number","null"]})",
    R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string","maxLength":4},
        "c":{"type":"boolean"}},"required":["b"]})",
    R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":5}]})",
    R"({"$defs":{"point":{"type":"object","properties":{"x":{"type":"number"},"y":{"type":"number"}},
        "required":["x","y"]}},"type":"object","properties":{"from":{"$ref":"#/$defs/point"},
        "to":{"$ref":"#/$defs/point"}},"required":["from","to"]})",
    R"({"type":"object","properties":{"kind":{"const":"circle"},"r":{"oneOf":[{"type":"integer"},
        {"type":"null"}]}},"required":["kind","r"]})",
    R"({"type":"array","items":{"type":"object","properties":{"k":{"type":"string","minLength":1,"maxLength":3},
        "v":{"type":"boolean"}},"required":["k","v"]},"maxItems":3})",
};

// Pure sampling (no top-k, top-p or min-p): any allowed token may be drawn.
GenerateRequest Sampled(const std::string& grammar, uint64_t seed) {
  return {.max_tokens = 400,
          .sampling = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = seed},
          .grammar = grammar};
}

TEST(ConstrainedGeneration, TwoHundredSampledCompletionsMatchTheirSchemas) {
  const Model& model = Gpt2Synth();
  Result<std::unique_ptr<Session>> session = model.NewSession();
  ASSERT_TRUE(session.ok()) << session.status().message();
  int checked = 0;
  for (size_t k = 0; k < std::size(kSchemas); ++k) {
    const Json schema = Json::parse(kSchemas[k]);
    Result<std::string> gbnf = JsonSchemaGrammar(kSchemas[k]);
    ASSERT_TRUE(gbnf.ok()) << gbnf.status().message();
    for (uint64_t seed = 0; seed < 20; ++seed) {
      Result<Completion> c = (*session)->Generate("The answer as JSON:", Sampled(gbnf.value(), seed * 31 + k));
      ASSERT_TRUE(c.ok()) << c.status().message();
      EXPECT_EQ(c->finish, FinishReason::kStop) << "schema " << k << " seed " << seed << ": " << c->text;
      const Json v = Json::parse(c->text, nullptr, false);
      ASSERT_FALSE(v.is_discarded()) << "schema " << k << " seed " << seed << ": not JSON: " << c->text;
      EXPECT_TRUE(Valid(v, schema, schema)) << "schema " << k << " seed " << seed << ": " << c->text;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 200);
}

const char* kGrammars[] = {
    "root ::= \"yes\" | \"no\" | \"maybe\"",
    "root ::= term ((\"+\" | \"-\") term){0,3}\nterm ::= [0-9]{1,3} | \"(\" [0-9]{1,2} \")\"",
    "root ::= [a-z]{1,10} (\",\" [a-z]{1,10}){0,3} \".\"",
    "root ::= \"«\" [^»\\n]{0,12} \"»\"",
    "root ::= \"key=\" [A-Z]{2,4} (\" \" [0-9]{1,6}){0,2} \"\\n\"",
};

TEST(ConstrainedGeneration, GbnfCompletionsAreAcceptedByTheirGrammar) {
  const Model& model = Gpt2Synth();
  Result<std::unique_ptr<Session>> session = model.NewSession();
  ASSERT_TRUE(session.ok()) << session.status().message();
  for (size_t k = 0; k < std::size(kGrammars); ++k) {
    Result<Grammar> parsed = ParseGbnf(kGrammars[k]);
    ASSERT_TRUE(parsed.ok()) << parsed.status().message();
    auto grammar = std::make_shared<const Grammar>(std::move(parsed).value());
    for (uint64_t seed = 0; seed < 10; ++seed) {
      Result<Completion> c = (*session)->Generate("Say:", Sampled(kGrammars[k], seed * 17 + k));
      ASSERT_TRUE(c.ok()) << c.status().message();
      EXPECT_EQ(c->finish, FinishReason::kStop) << "grammar " << k << ": " << c->text;
      GrammarMatcher again(grammar);
      EXPECT_TRUE(again.Accept(c->text) && again.CanEnd()) << "grammar " << k << " seed " << seed << ": " << c->text;
    }
  }
}

TEST(ConstrainedGeneration, GreedyFollowsTheGrammarAndNoGrammarChangesNothing) {
  const Model& model = Gpt2Synth();
  Result<std::unique_ptr<Session>> a = model.NewSession();
  ASSERT_TRUE(a.ok());
  Result<Completion> greedy =
      (*a)->Generate("Colour:", {.max_tokens = 50, .sampling = {.temperature = 0}, .grammar = kGrammars[0]});
  ASSERT_TRUE(greedy.ok()) << greedy.status().message();
  EXPECT_TRUE(greedy->text == "yes" || greedy->text == "no" || greedy->text == "maybe") << greedy->text;
  EXPECT_EQ(greedy->finish, FinishReason::kStop);
  // A bad grammar is refused before anything runs, naming the option.
  Result<Completion> bad = (*a)->Generate("x", {.grammar = "root ::= ("});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().rfind("Generate: GeneratorOptions::grammar: line 1, column 11:", 0), 0u)
      << bad.status().message();
}

}  // namespace
}  // namespace kvq
