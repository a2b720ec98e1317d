// Model's chat-template calls (include/kvq/model.h, kvq/chat.h): the one place a conversation
// becomes prompt text, for kvq chat, kvq serve's /v1/chat/completions and library users. Its own
// file because the WebAssembly build leaves the Jinja interpreter out (CMakeLists.txt).
#include <fmt/format.h>

#include "api/api_internal.h"
#include "kvq/tool_calls.h"

namespace kvq {

void Model::Impl::ChooseChatTemplate() const {
  std::call_once(chat_once_, [this] {
    if (info.chat_template.empty()) {
      chat_template_ = ChatTemplate::ChatMl();
      chat_choice_ = {.chatml_fallback = true, .origin = "ChatML (the model file has no tokenizer.chat_template)"};
      return;
    }
    Result<ChatTemplate> parsed = ChatTemplate::Parse(info.chat_template);
    if (parsed.ok()) {
      chat_template_ = std::move(parsed).value();
      chat_choice_ = {.chatml_fallback = false, .origin = "the model's tokenizer.chat_template"};
    } else {
      chat_template_ = ChatTemplate::ChatMl();
      chat_choice_ = {.chatml_fallback = true,
                      .origin = "ChatML (the model's template is not supported: " + parsed.status().message() + ")"};
    }
  });
}

const ChatTemplate& Model::Impl::chat_template() const {
  ChooseChatTemplate();
  return *chat_template_;
}

const ChatTemplateChoice& Model::Impl::chat_template_choice() const {
  ChooseChatTemplate();
  return chat_choice_;
}

Result<std::string> Model::ApplyChatTemplate(std::span<const ChatMessage> messages,
                                             const ChatTemplateOptions& options) const {
  const ModelInfo& i = impl_->info;
  // The template's tool-call format says how it wants earlier calls (DeepSeek V3's: as text).
  const ToolCallFormat& calls = ToolCallFormatOf(*this, options.template_override);
  const ChatRenderOptions render{.add_generation_prompt = options.add_generation_prompt,
                                 .bos_token = i.bos >= 0 ? TokenPiece(i.bos) : "",
                                 .eos_token = i.eos >= 0 ? TokenPiece(i.eos) : "",
                                 .enable_thinking = options.enable_thinking,
                                 .now = options.now,
                                 .tools_json = options.tools_json,
                                 .calls_as_text = calls.calls_as_text};
  if (options.template_override.empty()) return impl_->chat_template().Render(messages, render);
  Result<ChatTemplate> t = ChatTemplate::Parse(options.template_override);
  if (!t.ok()) return t.status();
  return t->Render(messages, render);
}

const ChatTemplateChoice& Model::chat_template_choice() const { return impl_->chat_template_choice(); }

std::vector<int32_t> Model::TokenizeChatPrompt(std::string_view text) const {
  // A template that writes the BOS text itself stands for the BOS the vocabulary adds: that text
  // is taken as the added BOS, so the prompt has one (Tokenize would add one and parse the text's
  // as a second). What follows is tokenized as llama.cpp tokenizes the text after a special token.
  const int32_t bos = impl_->info.bos;
  const std::string bos_text = bos >= 0 ? TokenPiece(bos) : "";
  if (!bos_text.empty() && text.starts_with(bos_text)) return Tokenize(text.substr(bos_text.size()), AddBos::kYes);
  return Tokenize(text, AddBos::kModelDefault);
}

Status Model::CheckChatTemplate(std::string_view source) {
  Result<ChatTemplate> t = ChatTemplate::Parse(source);
  return t.ok() ? Status::Ok() : t.status();
}

}  // namespace kvq
