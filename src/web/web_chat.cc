// The WebAssembly module's chat template call (see web_api.cc for the shim's conventions): the
// loaded model's template rendered by kvq's Jinja interpreter in the module, so a chat page in the
// tab gives the model the prompt kvq serve and kvq chat give it. A template's error comes back
// through kvq_web_last_error; the interpreter's exceptions stay inside jinja/chat_template.cc.
// Also the chat prompt's ids (Model::TokenizeChatPrompt: one BOS whether or not the template wrote
// it) and the reuse of a conversation's history (Session::KeepCommonPrefix; for the WebGPU path's
// sequence, the positions its rule keeps), so a turn in the tab prefills only its new tokens, by
// the rules kvq chat and kvq serve follow.
#include <emscripten/emscripten.h>

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "kvq/chat.h"
#include "kvq/model.h"
#include "kvq/prefix_reuse.h"
#include "web/web_common.h"

namespace {

using json = nlohmann::json;

// The request's messages, or an error naming the field (as kvq serve's checks do).
kvq::Result<std::vector<kvq::ChatMessage>> Messages(const json& request) {
  if (!request.contains("messages") || !request["messages"].is_array()) {
    return kvq::Status::Error("apply_template: 'messages' must be an array of {role, content}");
  }
  std::vector<kvq::ChatMessage> messages;
  for (size_t i = 0; i < request["messages"].size(); ++i) {
    const json& m = request["messages"][i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string()) {
      return kvq::Status::Error("apply_template: 'messages[" + std::to_string(i) +
                                "]' must be an object with string 'role' and 'content'");
    }
    messages.push_back({.role = m["role"].get<std::string>(), .content = m["content"].get<std::string>()});
  }
  return messages;
}

}  // namespace

extern "C" {

// request_json: {"messages": [{role, content}], "add_generation_prompt": true (default),
// "enable_thinking": bool (absent: undefined, the template decides), "template_override": Jinja
// source to render with instead of the model's (absent or "": the model's)} → {"prompt": TEXT,
// "template": which template rendered it}; NULL on an error (kvq_web_last_error).
EMSCRIPTEN_KEEPALIVE const char* kvq_web_apply_template(int model, const char* request_json) {
  static std::string answer;
  const json request = json::parse(request_json, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded() || !request.is_object()) {
    kvq_web::Fail("apply_template: the request is not a JSON object");
    return nullptr;
  }
  kvq::Result<std::vector<kvq::ChatMessage>> messages = Messages(request);
  if (!messages.ok()) {
    kvq_web::Fail(messages.status().message());
    return nullptr;
  }
  kvq::ChatTemplateOptions options;
  for (const char* flag : {"add_generation_prompt", "enable_thinking"}) {
    if (request.contains(flag) && !request[flag].is_boolean()) {
      kvq_web::Fail(std::string("apply_template: '") + flag + "' must be a boolean");
      return nullptr;
    }
  }
  if (request.contains("template_override") && !request["template_override"].is_string()) {
    kvq_web::Fail("apply_template: 'template_override' must be a string (Jinja source)");
    return nullptr;
  }
  options.add_generation_prompt = request.value("add_generation_prompt", true);
  options.template_override = request.value("template_override", std::string());
  if (request.contains("enable_thinking")) options.enable_thinking = request["enable_thinking"].get<bool>();
  const kvq::Model& m = *kvq_web::ModelOf(model)->model;
  kvq::Result<std::string> prompt = m.ApplyChatTemplate(*messages, options);
  if (!prompt.ok()) {
    const std::string which = options.template_override.empty() ? m.chat_template_choice().origin : "the given one";
    kvq_web::Fail("the chat template (" + which + ") refused the messages: " + prompt.status().message());
    return nullptr;
  }
  const std::string which = options.template_override.empty() ? m.chat_template_choice().origin : "the given one";
  answer = json{{"prompt", *prompt}, {"template", which}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
  return answer.c_str();
}

// The ids of a prompt kvq_web_apply_template rendered (Model::TokenizeChatPrompt): writes
// min(count, capacity) ids to `ids` ([capacity] int32) and returns the count, so a caller whose
// buffer was too small calls again with a larger one.
EMSCRIPTEN_KEEPALIVE int kvq_web_tokenize_chat_prompt(int model, const char* text, int32_t* ids, int capacity) {
  const std::vector<int32_t> tokens = kvq_web::ModelOf(model)->model->TokenizeChatPrompt(text);
  const int n = static_cast<int>(tokens.size());
  if (ids != nullptr) std::copy_n(tokens.begin(), std::min(n, std::max(capacity, 0)), ids);
  return n;
}

// Keeps what the session holds up to where it and the next turn's prompt ([n] int32 ids) first
// differ, never all of the prompt (Session::KeepCommonPrefix); the positions kept, or -1.
EMSCRIPTEN_KEEPALIVE int kvq_web_session_keep_prefix(int session, const int32_t* ids, int n) {
  if (n < 0) return kvq_web::Fail("keep_prefix: negative token count");
  kvq::Result<int64_t> kept =
      kvq_web::SessionOf(session)->session->KeepCommonPrefix(std::span<const int32_t>(ids, static_cast<size_t>(n)));
  return kept.ok() ? static_cast<int>(*kept) : kvq_web::Fail("keeping the conversation's prefix: " + kept.status().message());
}

// The positions of held ([n_held] int32: the ids the WebGPU path's sequence holds) that the next
// turn's prompt ([n] int32 ids) keeps (kvq::PositionsToKeep, Session::KeepCommonPrefix's rule),
// or -1.
EMSCRIPTEN_KEEPALIVE int kvq_web_positions_to_keep(const int32_t* held, int n_held, const int32_t* ids, int n) {
  if (n_held < 0 || n < 0) return kvq_web::Fail("positions_to_keep: negative token count");
  return static_cast<int>(kvq::PositionsToKeep(std::span<const int32_t>(held, static_cast<size_t>(n_held)),
                                               std::span<const int32_t>(ids, static_cast<size_t>(n))));
}

}  // extern "C"
