// kvq's chat templates on the real templates of Qwen 3, Qwen 2.5, Llama 3.1, Gemma 3, Mistral Nemo
// and Llama 2 (fetched into the build folder by tests/text/fetch_chat_templates.sh, a CTest fixture) against
// an independent oracle: @huggingface/jinja, transformers.js's Jinja, run by node over every
// conversation of tests/text/data/chat_template_cases.json (tests/text/chat_template_oracle.js, a fixture too, writes
// oracle.json). Strict equality of the rendered bytes, and of raise_exception's message where the
// template refuses a conversation. Plus hand-written expected prompts, so that the test does not
// rest on the oracle alone, and the places where kvq follows jinja2 (transformers' Python
// renderer) rather than @huggingface/jinja.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "jinja/chat_template.h"

namespace kvq {
namespace {

using nlohmann::json;

// The day the oracle's strftime_now() formats (chat_template_oracle.js fixes its clock at 2024-07-26).
constexpr std::chrono::sys_seconds kOracleNow{std::chrono::sys_days{std::chrono::year{2024} / 7 / 26}};

constexpr const char* kTemplates[] = {"qwen3",
                                      "qwen2_5",
                                      "llama3_1",
                                      "llama3_2",
                                      "gemma3",
                                      "mistral_nemo",
                                      "deepseek_v3",
                                      "llama2",
                                      "llama2_default_system_prompt"};

const json& Oracle() {
  static const json oracle = [] {
    const std::string path = std::string(KVQ_CHAT_TEMPLATES_DIR) + "/oracle.json";
    std::ifstream in(path);
    if (!in) return json();
    return json::parse(in);
  }();
  return oracle;
}

std::vector<ChatMessage> Messages(const json& conversation) {
  std::vector<ChatMessage> messages;
  for (const json& m : conversation) messages.push_back({m.at("role"), m.at("content")});
  return messages;
}

class ChatTemplateOracle : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(Oracle().is_object())
        << "cannot read " << KVQ_CHAT_TEMPLATES_DIR
        << "/oracle.json (written by the CTest fixture text.chat_template_oracle)";
    ASSERT_TRUE(Oracle().at("templates").contains(GetParam())) << GetParam();
    entry_ = Oracle().at("templates").at(GetParam());
    Result<ChatTemplate> t = ChatTemplate::Parse(entry_.at("source").get<std::string>());
    ASSERT_TRUE(t.ok()) << t.status().message();
    template_.emplace(std::move(t).value());
  }

  ChatRenderOptions Options(bool add_generation_prompt, const json& enable_thinking) const {
    ChatRenderOptions options;
    options.add_generation_prompt = add_generation_prompt;
    options.bos_token = entry_.at("bos_token");
    options.eos_token = entry_.at("eos_token");
    if (!enable_thinking.is_null()) options.enable_thinking = enable_thinking.get<bool>();
    options.now = kOracleNow;
    return options;
  }

  /// The render of a hand-written conversation, or "ERROR: <message>".
  std::string Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true,
                     std::optional<bool> enable_thinking = std::nullopt) const {
    ChatRenderOptions options = Options(add_generation_prompt, nullptr);
    options.enable_thinking = enable_thinking;
    Result<std::string> r = template_->Render(messages, options);
    return r.ok() ? *r : "ERROR: " + r.status().message();
  }
  std::string Render(const char* conversation, bool add_generation_prompt = true,
                     std::optional<bool> enable_thinking = std::nullopt) const {
    return Render(Messages(Oracle().at("conversations").at(conversation)), add_generation_prompt,
                  enable_thinking);
  }

  json entry_;
  std::optional<ChatTemplate> template_;
};

// Where @huggingface/jinja is wrong and kvq follows jinja2: Mistral Nemo filters the messages
// with selectattr("tool_calls", "undefined"), which @huggingface/jinja makes drop every message
// (it skips items that lack the attribute before testing them), so its role-alternation check
// never runs. jinja2 keeps them and raises, as kvq does.
const std::map<std::pair<std::string, std::string>, std::string> kJinja2Differs = {
    {{"mistral_nemo", "roles_not_alternating"},
     "After the optional system message, conversation roles must alternate "
     "user/assistant/user/assistant/..."},
};

TEST_P(ChatTemplateOracle, RendersLikeHuggingFaceJinja) {
  int renders = 0;
  for (const json& r : Oracle().at("renders")) {
    if (r.at("template") != GetParam()) continue;
    ++renders;
    const std::string conversation = r.at("conversation");
    const ChatRenderOptions options =
        Options(r.at("add_generation_prompt"), r.at("enable_thinking"));
    Result<std::string> got =
        template_->Render(Messages(Oracle().at("conversations").at(conversation)), options);
    const std::string where = std::string(GetParam()) + " / " + conversation +
                              " / add_generation_prompt=" + r.at("add_generation_prompt").dump() +
                              " / enable_thinking=" + r.at("enable_thinking").dump();
    const auto differs = kJinja2Differs.find({GetParam(), conversation});
    if (differs != kJinja2Differs.end()) {
      EXPECT_TRUE(r.contains("output")) << where << ": @huggingface/jinja no longer renders this";
      ASSERT_FALSE(got.ok()) << where;
      EXPECT_EQ(got.status().message(), differs->second) << where;
    } else if (r.contains("output")) {
      ASSERT_TRUE(got.ok()) << where << ": " << got.status().message();
      EXPECT_EQ(*got, r.at("output").get<std::string>()) << where;
    } else {
      ASSERT_FALSE(got.ok()) << where << " rendered, but @huggingface/jinja raised "
                             << r.at("error");
      EXPECT_EQ(got.status().message(), r.at("error").get<std::string>()) << where;
    }
  }
  const size_t conversations = Oracle().at("conversations").size();
  EXPECT_GE(conversations, 14u);
  EXPECT_GE(renders, static_cast<int>(2 * conversations)) << "renders missing from oracle.json";
}

std::string TemplateName(const ::testing::TestParamInfo<const char*>& param) { return param.param; }
INSTANTIATE_TEST_SUITE_P(RealTemplates, ChatTemplateOracle, ::testing::ValuesIn(kTemplates),
                         TemplateName);

TEST(ChatTemplateOracleFile, HasEveryTemplate) {
  ASSERT_TRUE(Oracle().is_object()) << "no oracle.json in " << KVQ_CHAT_TEMPLATES_DIR;
  EXPECT_EQ(Oracle().at("templates").size(), std::size(kTemplates));
  EXPECT_EQ(Oracle().at("jinja_version"), "0.5.11");
}

// Hand-written prompts: what each model's documentation shows its format to be.

TEST_P(ChatTemplateOracle, HandWrittenPrompts) {
  const std::string name = GetParam();
  if (name == "qwen3") {
    const std::string system_user =
        "<|im_start|>system\nYou are a helpful "
        "assistant.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n"
        "<|im_start|>assistant\n";
    EXPECT_EQ(Render("system_user"), system_user);
    EXPECT_EQ(Render("system_user", true, true), system_user);
    EXPECT_EQ(Render("system_user", true, false), system_user + "<think>\n\n</think>\n\n");
    // Reasoning of earlier turns is dropped; the last turn's is kept.
    EXPECT_EQ(Render("thinking_in_history"),
              "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
              "<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n");
    EXPECT_EQ(
        Render("thinking_last", false),
        "<|im_start|>user\nWhat is 5*5?<|im_end|>\n<|im_start|>assistant\n<think>\nFive fives.\n"
        "</think>\n\n25<|im_end|>\n");
    // jinja2: content.lstrip('\n') keeps a leading space (@huggingface/jinja strips it).
    EXPECT_EQ(Render({{"user", "q"}, {"assistant", " a"}}, false),
              "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n "
              "a<|im_end|>\n");
  } else if (name == "qwen2_5") {
    EXPECT_EQ(
        Render("user_only"),
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n");
  } else if (name == "llama3_1") {
    EXPECT_EQ(Render("system_user"),
              "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful "
              "assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n");
  } else if (name == "gemma3") {
    EXPECT_EQ(Render("system_user"),
              "<bos><start_of_turn>user\nYou are a helpful assistant.\n\nHello!<end_of_turn>\n"
              "<start_of_turn>model\n");
    EXPECT_EQ(Render("roles_not_alternating"),
              "ERROR: Conversation roles must alternate user/assistant/user/assistant/...");
  } else if (name == "mistral_nemo") {
    EXPECT_EQ(Render("system_user"), "<s>[INST]You are a helpful assistant.\n\nHello![/INST]");
    EXPECT_EQ(
        Render("multi_turn"),
        "<s>[INST]Name a prime number.[/INST]7</s>[INST]Answer briefly.\n\nAnother one?[/INST]");
  } else if (name == "llama2") {
    EXPECT_EQ(Render("multi_turn"),
              "<s>[INST] <<SYS>>\nAnswer briefly.\n<</SYS>>\n\nName a prime number. [/INST] 7 </s>"
              "<s>[INST] Another one? [/INST]");
    EXPECT_EQ(Render("roles_not_alternating"),
              "ERROR: Conversation roles must alternate user/assistant/user/assistant/...");
    // jinja2: '' != false is True, so an empty system prompt still gets its block
    // (@huggingface/jinja compares with JavaScript's loose !=, and drops it).
    EXPECT_EQ(Render({{"system", ""}, {"user", "hi"}}),
              "<s>[INST] <<SYS>>\n\n<</SYS>>\n\nhi [/INST]");
  } else if (name == "llama2_default_system_prompt") {
    const std::string prompt = Render("user_only");
    EXPECT_EQ(
        prompt.rfind("<s>[INST] <<SYS>>\nYou are a helpful, respectful and honest assistant.", 0),
        0u);
    EXPECT_NE(
        prompt.find("please don't share false information.\n<</SYS>>\n\nWhat is 2+2? [/INST]"),
        std::string::npos);
  }
}

}  // namespace
}  // namespace kvq
