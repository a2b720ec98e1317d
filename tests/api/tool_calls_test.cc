// Tool calls in the core (include/kvq/tool_calls.h), every row of the format table: a reply in the
// format parses into its calls, whole or streamed a byte at a time (the same calls and content);
// a call that is not well-formed stays content; the grammar of a forced call accepts exactly the
// format's calls of declared functions; the template each fixture model ships is detected as its
// format. And the two-step tool loop rendered through the real Qwen 3, Qwen 2.5, Mistral Nemo,
// Llama 3.1 and DeepSeek V3 templates (the messages parsed from an OpenAI request body, as kvq serve parses
// them) equals @huggingface/jinja's render of the same conversation, byte for byte.
#include "kvq/tool_calls.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <nlohmann/json.hpp>
#include <string>

#include "grammar/grammar.h"
#include "grammar/grammar_matcher.h"
#include "jinja/chat_template.h"
#include "server/openai_protocol.h"

namespace kvq {
namespace {

using json = nlohmann::ordered_json;

const char* kTools = R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
   "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                  "required": ["city"]}}},
  {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
   "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}])";

// A reply holding `calls` ({name, arguments-object}) as `format` writes it.
std::string Written(const ToolCallFormat& f, const std::vector<std::pair<std::string, std::string>>& calls) {
  std::string out;
  if (NamedCalls(f)) {  // DeepSeek: the name outside the JSON, the calls one per line
    out = f.open;
    for (size_t i = 0; i < calls.size(); ++i) {
      out += (i > 0 ? "\n" : "") + std::string(f.call_open) + calls[i].first + f.name_end + calls[i].second + f.call_close;
    }
    return out + f.close;
  }
  if (f.array) {
    out = std::string(f.open) + "[";
    for (size_t i = 0; i < calls.size(); ++i) {
      if (i > 0) out += ", ";
      out += std::string("{\"name\": \"") + calls[i].first + "\", \"" + f.arguments_key +
             "\": " + calls[i].second + "}";
    }
    return out + "]";
  }
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string object = "{\"name\": \"" + calls[i].first + "\", \"" + f.arguments_key + "\": " + calls[i].second + "}";
    if (*f.open == '\0') {
      out += object;
      continue;
    }
    if (i > 0) out += "\n";
    out += std::string(f.open) + "\n" + object + "\n" + f.close;
  }
  return out;
}

// Streams `text` a byte at a time.
ToolCallParser::Delta Streamed(const ToolCallFormat& f, std::string_view text) {
  ToolCallParser p(f);
  ToolCallParser::Delta all;
  auto take = [&](ToolCallParser::Delta d) {
    all.content += d.content;
    all.calls.insert(all.calls.end(), d.calls.begin(), d.calls.end());
    all.chunks.insert(all.chunks.end(), d.chunks.begin(), d.chunks.end());
  };
  for (char c : text) take(p.Add(std::string_view(&c, 1)));
  take(p.Finish());
  return all;
}

// `text` as a reply's content shows it: without the format's control-token texts.
std::string Visible(const ToolCallFormat& f, std::string text) {
  for (const std::string& p : PreservedTokens(f)) {
    for (size_t at; (at = text.find(p)) != std::string::npos;) text.erase(at, p.size());
  }
  return text;
}

// `text` without its last UTF-8 character.
std::string DropLastCharacter(const std::string& text) {
  size_t n = text.size() - 1;
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  return text.substr(0, n);
}

// gtest names a row by its name rather than dumping its bytes.
void PrintTo(const ToolCallFormat& f, std::ostream* os) { *os << f.name; }

class EveryFormat : public ::testing::TestWithParam<ToolCallFormat> {};

TEST_P(EveryFormat, ParsesItsCallsWholeAndStreamed) {
  const ToolCallFormat& f = GetParam();
  // llama3_json has no parallel calls: one per reply.
  std::vector<std::pair<std::string, std::string>> calls = {{"get_weather", R"({"city": "Paris"})"}};
  if (*f.open != '\0') calls.push_back({"add", R"({"a": 1, "b": 2})"});
  const std::string text = Written(f, calls);
  for (const ToolCallParser::Delta& d : {ParseToolCalls(f, text), Streamed(f, text)}) {
    EXPECT_EQ(d.content, "") << f.name << ": " << text;
    ASSERT_EQ(d.calls.size(), calls.size()) << f.name << ": " << text;
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(d.calls[i].name, calls[i].first);
      EXPECT_EQ(json::parse(d.calls[i].arguments), json::parse(calls[i].second));
      EXPECT_EQ(d.calls[i].id.size(), f.id_length > 0 ? size_t(f.id_length) : size_t(29)) << d.calls[i].id;
    }
  }
}

TEST_P(EveryFormat, TextWithoutCallsIsContentAndBrokenCallsStayContent) {
  const ToolCallFormat& f = GetParam();
  for (const std::string& text : {std::string("It is sunny in Paris."), std::string("a < b and [x] {y}")}) {
    EXPECT_EQ(ParseToolCalls(f, text).content, text) << f.name;
    EXPECT_EQ(Streamed(f, text).content, text) << f.name;
    EXPECT_TRUE(Streamed(f, text).calls.empty()) << f.name;
  }
  // A call cut before its name is known, and one whose JSON lacks a name: every byte comes back
  // as content.
  const std::string whole = Written(f, {{"add", R"({"a": 1, "b": 2})"}});
  const bool named = NamedCalls(f);  // DeepSeek: no "name" key; its block is broken instead
  for (const std::string& text : {whole.substr(0, whole.find(named ? "add" : "\"add\"") + 3), [&] {
         std::string t = whole;
         if (named) {
           t.replace(t.find("```json"), 7, "```yaml");
         } else {
           t.replace(t.find("\"name\""), 6, "\"nome\"");
         }
         return t;
       }()}) {
    EXPECT_EQ(ParseToolCalls(f, text).content, Visible(f, text)) << f.name;
    EXPECT_EQ(Streamed(f, text).content, Visible(f, text)) << f.name;
    EXPECT_TRUE(ParseToolCalls(f, text).calls.empty()) << f.name;
    EXPECT_TRUE(Streamed(f, text).chunks.empty()) << f.name;
  }
}

// The concatenated chunks of each call, by index, checked against `calls`: the first chunk of a
// call carries its id and name, later ones neither.
void ExpectChunksAreTheCalls(const ToolCallParser::Delta& d, const std::string& why) {
  std::vector<ToolCall> assembled;
  for (const ToolCallChunk& c : d.chunks) {
    if (c.index == static_cast<int>(assembled.size())) {
      EXPECT_FALSE(c.id.empty()) << why;
      EXPECT_FALSE(c.name.empty()) << why;
      assembled.push_back({.id = c.id, .name = c.name, .arguments = c.arguments});
    } else {
      ASSERT_EQ(c.index, static_cast<int>(assembled.size()) - 1) << why;  // in order, never going back
      EXPECT_EQ(c.id, "") << why;
      EXPECT_EQ(c.name, "") << why;
      assembled.back().arguments += c.arguments;
    }
  }
  ASSERT_EQ(assembled.size(), d.calls.size()) << why;
  for (size_t i = 0; i < assembled.size(); ++i) {
    EXPECT_EQ(assembled[i].id, d.calls[i].id) << why;
    EXPECT_EQ(assembled[i].name, d.calls[i].name) << why;
    EXPECT_EQ(assembled[i].arguments, d.calls[i].arguments) << why;
  }
}

TEST_P(EveryFormat, ArgumentsStreamAsWrittenAndConcatenateToTheWholeCall) {
  const ToolCallFormat& f = GetParam();
  std::vector<std::pair<std::string, std::string>> calls = {{"get_weather", R"({"city": "Par\"is}", "n": [1, {"x": 2}]})"}};
  if (*f.open != '\0') calls.push_back({"add", R"({"a": 1,  "b": 2})"});
  const std::string text = Written(f, calls);
  const ToolCallParser::Delta whole = ParseToolCalls(f, text);
  const ToolCallParser::Delta streamed = Streamed(f, text);
  for (const ToolCallParser::Delta* d : {&whole, &streamed}) {
    ExpectChunksAreTheCalls(*d, std::string(f.name) + ": " + text);
    ASSERT_EQ(d->calls.size(), calls.size());
    // The model's own text of the arguments, spacing and all (not a re-serialisation).
    for (size_t i = 0; i < calls.size(); ++i) EXPECT_EQ(d->calls[i].arguments, calls[i].second) << f.name;
    EXPECT_EQ(d->content, "") << f.name;
  }
  // Streamed a byte at a time, the arguments come in many pieces, the first with the name.
  EXPECT_GT(streamed.chunks.size(), 2 * calls.size()) << f.name;
  EXPECT_EQ(streamed.chunks[0].arguments, "") << f.name;

  // Cut inside the arguments (max_tokens): the call was committed by its first chunk, and keeps
  // what was written, whole or streamed alike.
  const std::string cut = text.substr(0, text.find("\"n\"") + 4);
  for (const ToolCallParser::Delta& d : {ParseToolCalls(f, cut), Streamed(f, cut)}) {
    ExpectChunksAreTheCalls(d, std::string(f.name) + ": " + cut);
    ASSERT_EQ(d.calls.size(), 1u) << f.name;
    EXPECT_EQ(d.calls[0].arguments, R"({"city": "Par\"is}", "n":)") << f.name;
    EXPECT_EQ(d.content, "") << f.name;
  }
  if (NamedCalls(f)) return;  // the name is outside the JSON: never written after the arguments
  // Arguments written before the name cannot stream: the call comes whole at its end, as one chunk.
  std::string backwards = Written(f, {{"add", R"({"a": 1})"}});
  const std::string name_first = "{\"name\": \"add\", \"" + std::string(f.arguments_key) + "\": {\"a\": 1}}";
  backwards.replace(backwards.find(name_first), name_first.size(),
                    "{\"" + std::string(f.arguments_key) + "\": {\"a\": 1}, \"name\": \"add\"}");
  const ToolCallParser::Delta late = Streamed(f, backwards);
  ExpectChunksAreTheCalls(late, std::string(f.name) + ": " + backwards);
  ASSERT_EQ(late.chunks.size(), 1u) << f.name << ": " << backwards;
  EXPECT_EQ(json::parse(late.calls[0].arguments), json::parse(R"({"a": 1})"));
}

// Whether `grammar` (GBNF) accepts exactly `text`.
bool Accepts(const std::string& gbnf, const std::string& text) {
  Result<Grammar> g = ParseGbnf(gbnf);
  EXPECT_TRUE(g.ok()) << g.status().message() << "\n" << gbnf;
  if (!g.ok()) return false;
  GrammarMatcher m(std::make_shared<const Grammar>(std::move(g).value()));
  return m.Accept(text) && m.CanEnd();
}

// The grammar's own spelling of a call: compact JSON, as a forced reply may write it.
std::string Compact(const ToolCallFormat& f, const std::vector<std::pair<std::string, std::string>>& calls) {
  std::vector<std::pair<std::string, std::string>> c;
  for (const auto& [name, args] : calls) c.push_back({name, json::parse(args).dump()});
  std::string text = Written(f, c);
  // Written puts a space after each ':' and ','; the grammar allows that whitespace too.
  return text;
}

TEST_P(EveryFormat, ForcedCallGrammarAcceptsDeclaredCallsOnly) {
  const ToolCallFormat& f = GetParam();
  Result<std::string> required = ToolCallGrammar(f, {.tools_json = kTools, .choice = ToolChoice::kRequired});
  ASSERT_TRUE(required.ok()) << required.status().message();
  Result<std::string> named =
      ToolCallGrammar(f, {.tools_json = kTools, .choice = ToolChoice::kFunction, .function = "add"});
  ASSERT_TRUE(named.ok()) << named.status().message();
  const std::string weather = Compact(f, {{"get_weather", R"({"city": "Oslo"})"}});
  const std::string add = Compact(f, {{"add", R"({"a": 1, "b": -2})"}});
  EXPECT_TRUE(Accepts(*required, weather)) << f.name << ": " << weather;
  EXPECT_TRUE(Accepts(*required, add)) << f.name << ": " << add;
  EXPECT_FALSE(Accepts(*named, weather)) << f.name;
  EXPECT_TRUE(Accepts(*named, add)) << f.name;
  // Undeclared function, an argument outside its enum, text instead of a call.
  EXPECT_FALSE(Accepts(*required, Compact(f, {{"get_time", R"({"city": "Oslo"})"}}))) << f.name;
  EXPECT_FALSE(Accepts(*required, Compact(f, {{"get_weather", R"({"city": "Rome"})"}}))) << f.name;
  EXPECT_FALSE(Accepts(*required, "It is sunny.")) << f.name;
  // Parallel calls where the format has them, and only when asked.
  if (*f.open != '\0') {
    const std::string both = Compact(f, {{"get_weather", R"({"city": "Oslo"})"}, {"add", R"({"a": 1, "b": 2})"}});
    EXPECT_TRUE(Accepts(*required, both)) << f.name << ": " << both;
    Result<std::string> single =
        ToolCallGrammar(f, {.tools_json = kTools, .choice = ToolChoice::kRequired, .parallel = false});
    ASSERT_TRUE(single.ok());
    EXPECT_FALSE(Accepts(*single, both)) << f.name;
  }
  // What the grammar accepts, the parser reads back.
  EXPECT_EQ(ParseToolCalls(f, add).calls.size(), 1u);
  // none forces nothing (auto: the lazy grammar below).
  EXPECT_EQ(*ToolCallGrammar(f, {.tools_json = kTools, .choice = ToolChoice::kNone}), "");
}

TEST_P(EveryFormat, AutoGrammarIsFreeUntilTheOpeningThenOnlyDeclaredCalls) {
  const ToolCallFormat& f = GetParam();
  Result<std::string> lazy = ToolCallGrammar(f, {.tools_json = kTools, .choice = ToolChoice::kAuto});
  ASSERT_TRUE(lazy.ok()) << lazy.status().message();
  const std::string open = *f.open != '\0' ? f.open : "{";  // llama3_json: a reply starting with '{'
  const std::string weather = Compact(f, {{"get_weather", R"({"city": "Oslo"})"}});
  // Free text, with pieces of the opening that never complete it, however long.
  std::string text = "It is sunny. a < b, [x] {y}: " + DropLastCharacter(open) + " and on";
  if (*f.open == '\0') text = "Sunny. {y}";  // llama3_json: text is any reply not starting with '{'
  EXPECT_TRUE(Accepts(*lazy, text)) << f.name << ": " << text;
  std::string long_text;
  for (int i = 0; i < 2000; ++i) long_text += "word <t [T ";
  EXPECT_TRUE(Accepts(*lazy, long_text)) << f.name;
  EXPECT_TRUE(Accepts(*lazy, weather)) << f.name << ": " << weather;
  EXPECT_TRUE(Accepts(*lazy, "")) << f.name;
  if (*f.open != '\0') {
    EXPECT_TRUE(Accepts(*lazy, "Let me look.\n" + weather)) << f.name;
    // A thought may name the opening: it is not a call there.
    EXPECT_TRUE(Accepts(*lazy, "<think>\nI may write " + open + " now.\n</think>\n\nSunny.")) << f.name;
  }
  // Once the opening is written, only a declared call may follow.
  const std::string before = *f.open != '\0' ? "Let me look.\n" : "";
  EXPECT_FALSE(Accepts(*lazy, before + open + " maybe not")) << f.name;
  EXPECT_FALSE(Accepts(*lazy, before + Compact(f, {{"get_time", R"({"city": "Oslo"})"}}))) << f.name;
  EXPECT_FALSE(Accepts(*lazy, before + Compact(f, {{"get_weather", R"({"city": "Rome"})"}}))) << f.name;
  EXPECT_FALSE(Accepts(*lazy, weather + " and more text")) << f.name;
  if (*f.open != '\0') {
    // A prompt that opens the thought: the reply starts in it, free (openings too) until </think>.
    Result<std::string> thinking =
        ToolCallGrammar(f, {.tools_json = kTools, .choice = ToolChoice::kAuto, .starts_thinking = true});
    ASSERT_TRUE(thinking.ok());
    EXPECT_TRUE(Accepts(*thinking, "I may write " + open + " now.\n</think>\n\n" + weather)) << f.name;
    EXPECT_TRUE(Accepts(*thinking, "cut mid-thought " + open)) << f.name;
    EXPECT_FALSE(Accepts(*thinking, "hm</think>\n" + open + " maybe not")) << f.name;
  }
}

// The grammar's state machine fed the opening, then left to pick: a random walk over a small
// vocabulary (bytes and a few multi-byte tokens), each step a token the mask allows, ends in text
// that parses as declared calls whose arguments follow their schemas, every time.
TEST_P(EveryFormat, AfterTheOpeningEveryAllowedPathIsADeclaredCall) {
  const ToolCallFormat& f = GetParam();
  Result<std::string> lazy = ToolCallGrammar(f, {.tools_json = kTools, .choice = ToolChoice::kAuto});
  ASSERT_TRUE(lazy.ok());
  Result<Grammar> g = ParseGbnf(*lazy);
  ASSERT_TRUE(g.ok()) << g.status().message();
  auto grammar = std::make_shared<const Grammar>(std::move(g).value());
  std::vector<std::string> vocab;
  for (int c = 32; c < 127; ++c) vocab.push_back(std::string(1, static_cast<char>(c)));
  for (const char* t : {"\n", "\"name\"", "\"city\"", "Paris", "Oslo", "get_weather", "add", ": ", ", ", "{\"", "\"}"}) {
    vocab.push_back(t);
  }
  // Non-ASCII framing (DeepSeek's): whole, and its characters, so that every spelling can go on.
  for (const char* framing : {f.call_open, f.name_end, f.call_close, f.close, "｜", "▁"}) {
    if (*framing != '\0') vocab.push_back(framing);
  }
  const TokenTrie trie(vocab);
  const std::string prefix = *f.open != '\0' ? std::string("Sure.\n") + f.open : "{";
  std::mt19937 rng(7);
  int calls = 0;
  for (int walk = 0; walk < 40; ++walk) {
    GrammarMatcher m(grammar);
    ASSERT_TRUE(m.Accept(prefix));
    std::string text = prefix;
    for (int step = 0; step < 4000 && !m.Done(); ++step) {
      if (m.CanEnd()) break;  // a reply may end here: the walk ends it
      const std::vector<uint64_t>& allowed = m.AllowedTokens(trie);
      std::vector<int> choices;
      for (int t = 0; t < static_cast<int>(vocab.size()); ++t) {
        if ((allowed[t / 64] >> (t % 64)) & 1) choices.push_back(t);
      }
      ASSERT_FALSE(choices.empty()) << f.name << ": stuck after " << text;
      const std::string& token = vocab[choices[std::uniform_int_distribution<size_t>(0, choices.size() - 1)(rng)]];
      ASSERT_TRUE(m.Accept(token));
      text += token;
    }
    ASSERT_TRUE(m.CanEnd()) << f.name << ": unfinished " << text;
    const ToolCallParser::Delta d = ParseToolCalls(f, text);
    EXPECT_EQ(d.content, *f.open != '\0' ? "Sure." : "") << f.name << ": " << text;
    ASSERT_GE(d.calls.size(), 1u) << f.name << ": " << text;
    for (const ToolCall& c : d.calls) {
      const json args = json::parse(c.arguments);
      if (c.name == "get_weather") {
        EXPECT_TRUE(args["city"] == "Paris" || args["city"] == "Oslo") << text;
      } else {
        ASSERT_EQ(c.name, "add") << text;
        EXPECT_TRUE(args["a"].is_number_integer() && args["b"].is_number_integer()) << text;
      }
      ++calls;
    }
  }
  EXPECT_GE(calls, 40);
}

std::string FormatName(const ::testing::TestParamInfo<ToolCallFormat>& p) { return p.param.name; }
INSTANTIATE_TEST_SUITE_P(Table, EveryFormat, ::testing::ValuesIn(ToolCallFormats().begin(), ToolCallFormats().end()),
                         FormatName);

TEST(ToolCalls, BadToolsAreNamed) {
  auto error = [](const std::string& tools, ToolChoice choice = ToolChoice::kAuto, std::string function = "") {
    Result<std::vector<std::string>> r = CheckTools({.tools_json = tools, .choice = choice, .function = function});
    return r.ok() ? std::string("ok") : r.status().message();
  };
  EXPECT_EQ(error("{}"), "tools must be a JSON array of tool definitions");
  EXPECT_EQ(error(R"([{"type": "retrieval"}])"), "tools[0].type must be \"function\" (the only kind of tool)");
  EXPECT_EQ(error(R"([{"type": "function", "function": {}}])"), "tools[0].function.name must be a non-empty string");
  EXPECT_EQ(error(R"([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}])"),
            "tools[1].function.name 'f' is declared twice");
  EXPECT_EQ(error(kTools, ToolChoice::kFunction, "nope"),
            "tool_choice names the function 'nope', which tools does not declare");
  EXPECT_EQ(error(kTools), "ok");
  Result<std::string> g = ToolCallGrammar(
      ToolCallFormats()[0],
      {.tools_json = R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "string", "format": "uri"}}}])",
       .choice = ToolChoice::kRequired});
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().message().rfind("tools[0].function.parameters: ", 0), 0u) << g.status().message();
}

const json& Oracle() {
  // The two-step loop as OpenAI's clients send it (arguments as a string of JSON, content null
  // beside tool_calls), and as transformers' templates expect it (arguments an object, content "").
  static const json oracle = [] {
    const json tools = json::parse(kTools);
    const json call = {{"id", "Ab3De6Gh9"}, {"type", "function"},
                       {"function", {{"name", "get_weather"}, {"arguments", R"({"city": "Paris"})"}}}};
    json template_call = call;
    template_call["function"]["arguments"] = json::parse(R"({"city": "Paris"})");
    const json user = {{"role", "user"}, {"content", "Weather in Paris?"}};
    const json result = {{"role", "tool"}, {"tool_call_id", "Ab3De6Gh9"}, {"content", R"({"temp": 21})"}};
    json cases = json::object();
    cases["step1"] = {{"messages", {user}}, {"tools", tools}};
    cases["step2"] = {{"messages", {user, {{"role", "assistant"}, {"content", ""}, {"tool_calls", {template_call}}}, result}},
                      {"tools", tools}};
    // As OpenAI sends it (content null, arguments text): what DeepSeek V3's template renders a call from.
    cases["step2_text"] = {{"messages", {user, {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {call}}}, result}},
                           {"tools", tools}};
    const std::string stem = testing::TempDir() + "/kvq_tool_calls_" + std::to_string(getpid());
    std::ofstream(stem + "_cases.json") << json{{"conversations", cases}}.dump();
    const std::string cmd = std::string(KVQ_NODE) + " " + KVQ_SOURCE_DIR + "/tests/text/chat_template_oracle.js " +
                            stem + "_cases.json " + KVQ_CHAT_TEMPLATES_DIR + " " + stem + "_oracle.json > /dev/null";
    const bool ran = std::system(cmd.c_str()) == 0;
    json out = ran ? json::parse(std::ifstream(stem + "_oracle.json")) : json();
    std::remove((stem + "_cases.json").c_str());
    std::remove((stem + "_oracle.json").c_str());
    if (!ran) return json();
    out["openai_step2"] = json::array({user, {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {call}}}, result});
    return out;
  }();
  return oracle;
}

TEST(ToolCallTemplates, TwoStepLoopRendersAsTheOracle) {
  ASSERT_TRUE(Oracle().is_object()) << "the oracle (node tests/text/chat_template_oracle.js) did not run";
  const json openai_messages = {{"step1", json::array({Oracle()["openai_step2"][0]})},
                                {"step2", Oracle()["openai_step2"]}};
  int compared = 0;
  for (const char* name : {"qwen3", "qwen2_5", "mistral_nemo", "llama3_1", "llama3_2", "deepseek_v3"}) {
    const json& t = Oracle()["templates"][name];
    Result<ChatTemplate> parsed = ChatTemplate::Parse(t["source"].get<std::string>());
    ASSERT_TRUE(parsed.ok()) << name;
    // The template's format says how it wants an earlier call (ToolCallFormat::calls_as_text), and
    // the oracle is given the call so.
    const bool as_text = ToolCallFormatFor(t["source"].get<std::string>()).calls_as_text;
    for (const char* step : {"step1", "step2"}) {
      const std::string oracle_step = std::string(step) + (as_text && std::string(step) == "step2" ? "_text" : "");
      // The messages as kvq serve reads them from a request.
      const json body = {{"messages", openai_messages[step]}, {"tools", json::parse(kTools)}};
      auto request = server::ParseGenerationRequest(server::Endpoint::kChatCompletions, body.dump(), {});
      ASSERT_TRUE(std::holds_alternative<server::GenerationRequest>(request))
          << std::get<server::ApiError>(request).message;
      const server::GenerationRequest& r = std::get<server::GenerationRequest>(request);
      for (const json& render : Oracle()["renders"]) {
        if (render["template"] != name || render["conversation"] != oracle_step || !render["enable_thinking"].is_null()) {
          continue;
        }
        ChatRenderOptions options{.add_generation_prompt = render["add_generation_prompt"].get<bool>(),
                                  .bos_token = t["bos_token"].get<std::string>(), .eos_token = t["eos_token"].get<std::string>(),
                                  .now = std::chrono::sys_days{std::chrono::year{2024} / 7 / 26},  // the oracle's
                                  .tools_json = r.tools.tools_json,
                                  .calls_as_text = as_text};
        Result<std::string> got = parsed->Render(r.messages, options);
        const std::string where = std::string(name) + " " + step + " agp=" + render["add_generation_prompt"].dump();
        ASSERT_TRUE(render.contains("output")) << where << ": the oracle refused: " << render["error"];
        ASSERT_TRUE(got.ok()) << where << ": " << got.status().message();
        EXPECT_EQ(*got, render["output"].get<std::string>()) << where;
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 6 * 2 * 2);
}

TEST(ToolCallTemplates, FixtureTemplatesAreDetected) {
  ASSERT_TRUE(Oracle().is_object());
  EXPECT_STREQ(ToolCallFormatFor(Oracle()["templates"]["qwen3"]["source"].get<std::string>()).name, "hermes");
  EXPECT_STREQ(ToolCallFormatFor(Oracle()["templates"]["qwen2_5"]["source"].get<std::string>()).name, "hermes");
  EXPECT_STREQ(ToolCallFormatFor(Oracle()["templates"]["mistral_nemo"]["source"].get<std::string>()).name, "mistral");
  EXPECT_STREQ(ToolCallFormatFor(Oracle()["templates"]["llama3_2"]["source"].get<std::string>()).name, "llama3_json");
  EXPECT_STREQ(ToolCallFormatFor("{{ '<|python_tag|>' }}").name, "llama3_json");
  EXPECT_STREQ(ToolCallFormatFor(Oracle()["templates"]["deepseek_v3"]["source"].get<std::string>()).name, "deepseek_v3");
  // V3.1's template writes the name before the separator: not this format, so it falls back (and
  // CheckToolCallTemplate refuses tools for it).
  EXPECT_STREQ(ToolCallFormatFor("{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['function']['name'] + "
                                 "'<｜tool▁sep｜>' + tool['function']['arguments']}}").name, "hermes");
  EXPECT_STREQ(ToolCallFormatFor("").name, "hermes");
}

}  // namespace
}  // namespace kvq
