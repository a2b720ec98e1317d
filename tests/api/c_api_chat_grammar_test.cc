// The C API's chat and constrained-output calls (include/kvq.h) are thin clients of the C++ API:
// kvq_apply_chat_template renders what Model::ApplyChatTemplate renders, kvq_session_generate_chat
// generates what Session::Generate of the rendered prompt's ids generates, and a grammar or a JSON
// schema in kvq_generate_options constrains the output exactly as GenerateRequest::grammar does.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvq.h"
#include "kvq/chat.h"
#include "kvq/generator.h"
#include "kvq/model.h"
#include "kvq/session.h"

namespace {

const std::string kDir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";
const std::string kModel = kDir + "stories260K.bin", kTok = kDir + "tok512.bin";

kvq_model* LoadC() {
  kvq_model_options o;
  kvq_model_options_init(&o);
  o.tokenizer_path = kTok.c_str();
  o.threads = 1;
  kvq_model* m = kvq_model_load(kModel.c_str(), &o);
  EXPECT_NE(m, nullptr) << kvq_last_error();
  return m;
}

std::unique_ptr<kvq::Model> LoadCpp() {
  kvq::Result<std::unique_ptr<kvq::Model>> m =
      kvq::Model::Load(kModel, {.tokenizer_path = kTok, .threads = 1});
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

struct Streamed {
  std::string text;
  std::vector<int32_t> tokens;
};

int Collect(int32_t token, const char* piece, void* user) {
  auto* s = static_cast<Streamed*>(user);
  s->text += piece;
  s->tokens.push_back(token);
  return 1;
}

// The text of a C render (kvq_apply_chat_template's size-then-fill contract).
std::string RenderC(kvq_model* m, const std::vector<kvq_chat_message>& messages,
                    const kvq_chat_options* o) {
  const int64_t n = kvq_apply_chat_template(m, messages.data(),
                                            static_cast<int64_t>(messages.size()), o, nullptr, 0);
  EXPECT_GE(n, 0) << kvq_last_error();
  if (n < 0) return "<error>";
  std::string text(static_cast<size_t>(n) + 1, '\0');
  EXPECT_EQ(kvq_apply_chat_template(m, messages.data(), static_cast<int64_t>(messages.size()), o,
                                    text.data(), static_cast<int64_t>(text.size())),
            n);
  text.resize(static_cast<size_t>(n));
  return text;
}

TEST(CApiChat, RendersAsApplyChatTemplate) {
  kvq_model* m = LoadC();
  std::unique_ptr<kvq::Model> cpp = LoadCpp();
  ASSERT_TRUE(m && cpp);
  const std::vector<kvq_chat_message> c_chat = {{"system", "Be brief."},
                                                {"user", "Tell me a story."}};
  const std::vector<kvq::ChatMessage> chat = {{"system", "Be brief."},
                                              {"user", "Tell me a story."}};

  // No template in the file: ChatML, as the C++ API renders it.
  kvq::Result<std::string> want = cpp->ApplyChatTemplate(chat, {.add_generation_prompt = true});
  ASSERT_TRUE(want.ok()) << want.status().message();
  EXPECT_EQ(RenderC(m, c_chat, nullptr), *want);
  EXPECT_NE(want->find("<|im_start|>user\nTell me a story.<|im_end|>"), std::string::npos) << *want;

  kvq_chat_options o;
  kvq_chat_options_init(&o);
  o.add_generation_prompt = 0;
  kvq::Result<std::string> no_prompt =
      cpp->ApplyChatTemplate(chat, {.add_generation_prompt = false});
  ASSERT_TRUE(no_prompt.ok());
  EXPECT_EQ(RenderC(m, c_chat, &o), *no_prompt);
  EXPECT_NE(*no_prompt, *want);

  // An override, with enable_thinking unset, off and on.
  const std::string source =
      "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
      "{% if enable_thinking is defined %}thinking={{ enable_thinking }}{% else %}thinking unset{% "
      "endif %}";
  o.template_override = source.c_str();
  for (const int thinking : {-1, 0, 1}) {
    o.enable_thinking = thinking;
    kvq::ChatTemplateOptions co{.add_generation_prompt = false, .template_override = source};
    if (thinking >= 0) co.enable_thinking = thinking != 0;
    kvq::Result<std::string> w = cpp->ApplyChatTemplate(chat, co);
    ASSERT_TRUE(w.ok()) << w.status().message();
    EXPECT_EQ(RenderC(m, c_chat, &o), *w) << "enable_thinking " << thinking;
    EXPECT_EQ(w->find("thinking unset") != std::string::npos, thinking < 0) << *w;
  }

  // A short buffer gets the cut text and the whole length.
  char small[8];
  const int64_t n = kvq_apply_chat_template(m, c_chat.data(), 2, nullptr, small, sizeof small);
  EXPECT_EQ(n, static_cast<int64_t>(want->size()));
  EXPECT_EQ(std::string(small), want->substr(0, 7));

  // Errors: a template that does not parse, a NULL field, a bad struct size.
  o.template_override = "{% for m in messages %}";
  EXPECT_EQ(kvq_apply_chat_template(m, c_chat.data(), 2, &o, small, sizeof small), -1);
  EXPECT_NE(std::string(kvq_last_error()).find("kvq_apply_chat_template: chat template 1:"),
            std::string::npos)
      << kvq_last_error();
  const std::vector<kvq_chat_message> no_content = {{"user", "Hi"}, {"assistant", nullptr}};
  EXPECT_EQ(kvq_apply_chat_template(m, no_content.data(), 2, nullptr, small, sizeof small), -1);
  EXPECT_NE(std::string(kvq_last_error()).find("messages[1].content is NULL"), std::string::npos)
      << kvq_last_error();
  kvq_chat_options_init(&o);
  o.struct_size = 0;
  EXPECT_EQ(kvq_apply_chat_template(m, c_chat.data(), 2, &o, small, sizeof small), -1);
  EXPECT_NE(std::string(kvq_last_error()).find("kvq_chat_options"), std::string::npos)
      << kvq_last_error();
  kvq_model_free(m);
}

TEST(CApiChat, GenerateChatEqualsGenerateOfTheRenderedIds) {
  kvq_model* m = LoadC();
  std::unique_ptr<kvq::Model> cpp = LoadCpp();
  ASSERT_TRUE(m && cpp);
  const std::vector<kvq_chat_message> c_chat = {{"user", "Once upon a time"}};
  const std::vector<kvq::ChatMessage> chat = {{"user", "Once upon a time"}};
  kvq::Result<std::string> text = cpp->ApplyChatTemplate(chat);
  ASSERT_TRUE(text.ok());
  const std::vector<int32_t> ids = cpp->TokenizeChatPrompt(*text);
  kvq::Result<std::unique_ptr<kvq::Session>> s = cpp->NewSession();
  ASSERT_TRUE(s.ok());
  kvq::Result<kvq::Completion> want =
      (*s)->Generate(ids, {.max_tokens = 40, .sampling = {.temperature = 0}});
  ASSERT_TRUE(want.ok()) << want.status().message();
  ASSERT_FALSE(want->tokens.empty());

  // The ids kvq_tokenize_chat_prompt gives are TokenizeChatPrompt's.
  std::vector<int32_t> c_ids(ids.size() + 4);
  ASSERT_EQ(
      kvq_tokenize_chat_prompt(m, text->c_str(), c_ids.data(), static_cast<int64_t>(c_ids.size())),
      static_cast<int64_t>(ids.size()));
  c_ids.resize(ids.size());
  EXPECT_EQ(c_ids, ids);

  kvq_generate_options go;
  kvq_generate_options_init(&go);
  go.max_tokens = 40;
  go.temperature = 0;
  kvq_session* cs = kvq_session_new(m, nullptr);
  ASSERT_NE(cs, nullptr) << kvq_last_error();
  Streamed chat_out, ids_out;
  int64_t n = 0;
  ASSERT_EQ(kvq_session_generate_chat(cs, c_chat.data(), 1, nullptr, &go, Collect, &chat_out, &n),
            KVQ_OK)
      << kvq_last_error();
  EXPECT_EQ(n, static_cast<int64_t>(want->tokens.size()));
  EXPECT_EQ(chat_out.text, want->text);
  EXPECT_EQ(kvq_session_finish_reason(cs),
            want->finish == kvq::FinishReason::kLength ? KVQ_FINISH_LENGTH : KVQ_FINISH_STOP);
  ASSERT_EQ(kvq_session_clear(cs), KVQ_OK);
  ASSERT_EQ(kvq_session_generate_tokens(cs, ids.data(), static_cast<int64_t>(ids.size()), &go,
                                        Collect, &ids_out, &n),
            KVQ_OK)
      << kvq_last_error();
  EXPECT_EQ(ids_out.text, want->text);
  EXPECT_EQ(ids_out.tokens, chat_out.tokens);
  kvq_session_free(cs);
  kvq_model_free(m);
}

// A grammar or a JSON schema through the C API gives the C++ API's constrained completion, and the
// completion follows it (not the unconstrained text).
TEST(CApiGrammar, GrammarAndJsonSchemaConstrainAsTheCppApi) {
  kvq_model* m = LoadC();
  std::unique_ptr<kvq::Model> cpp = LoadCpp();
  ASSERT_TRUE(m && cpp);
  const std::string schema =
      R"({"type":"object","properties":{"age":{"type":"integer"}},"required":["age"]})";
  kvq::Result<std::string> schema_gbnf = kvq::JsonSchemaGrammar(schema);
  ASSERT_TRUE(schema_gbnf.ok()) << schema_gbnf.status().message();
  const std::string yes_no = "root ::= \"yes\" | \"no\"";
  struct Case {
    const char* grammar;
    const char* json_schema;
    std::string gbnf;
  };
  for (const Case& c :
       {Case{yes_no.c_str(), nullptr, yes_no}, Case{nullptr, schema.c_str(), *schema_gbnf}}) {
    kvq::Result<std::unique_ptr<kvq::Session>> s = cpp->NewSession();
    ASSERT_TRUE(s.ok());
    kvq::Result<kvq::Completion> want = (*s)->Generate(
        "Once upon a time", {.max_tokens = 24, .sampling = {.temperature = 0}, .grammar = c.gbnf});
    ASSERT_TRUE(want.ok()) << want.status().message();
    kvq_generate_options go;
    kvq_generate_options_init(&go);
    go.max_tokens = 24;
    go.temperature = 0;
    go.grammar = c.grammar;
    go.json_schema = c.json_schema;
    kvq_session* cs = kvq_session_new(m, nullptr);
    ASSERT_NE(cs, nullptr);
    Streamed out;
    ASSERT_EQ(kvq_session_generate(cs, "Once upon a time", &go, Collect, &out, nullptr), KVQ_OK)
        << kvq_last_error();
    EXPECT_EQ(out.text, want->text);
    if (c.grammar != nullptr) {
      EXPECT_TRUE(out.text == "yes" || out.text == "no") << out.text;
      EXPECT_EQ(kvq_session_finish_reason(cs), KVQ_FINISH_STOP);
    } else {
      const size_t first = out.text.find_first_not_of(" \t\n");
      ASSERT_NE(first, std::string::npos) << out.text;
      EXPECT_EQ(out.text[first], '{') << out.text;
    }
    kvq_session_free(cs);
  }

  // Refusals name the field: both set, a schema or a grammar that does not parse.
  kvq_session* cs = kvq_session_new(m, nullptr);
  ASSERT_NE(cs, nullptr);
  kvq_generate_options go;
  kvq_generate_options_init(&go);
  go.grammar = yes_no.c_str();
  go.json_schema = schema.c_str();
  EXPECT_EQ(kvq_session_generate(cs, "Once", &go, nullptr, nullptr, nullptr), KVQ_ERROR);
  EXPECT_NE(std::string(kvq_last_error()).find("options->grammar and json_schema are both set"),
            std::string::npos)
      << kvq_last_error();
  go.grammar = nullptr;
  go.json_schema = "{\"type\": ";
  EXPECT_EQ(kvq_session_generate(cs, "Once", &go, nullptr, nullptr, nullptr), KVQ_ERROR);
  EXPECT_NE(std::string(kvq_last_error()).find("options->json_schema: "), std::string::npos)
      << kvq_last_error();
  go.json_schema = nullptr;
  go.grammar = "root ::= (";
  EXPECT_EQ(kvq_session_generate(cs, "Once", &go, nullptr, nullptr, nullptr), KVQ_ERROR);
  EXPECT_NE(std::string(kvq_last_error()).find("options->grammar: "), std::string::npos)
      << kvq_last_error();
  EXPECT_EQ(kvq_session_positions(cs), 0);  // nothing ran
  kvq_session_free(cs);
  kvq_model_free(m);
}

}  // namespace
