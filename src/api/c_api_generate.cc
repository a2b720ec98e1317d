// The C API's generation and chat calls (include/kvq.h) over Session::Generate, the sampler and
// Model::ApplyChatTemplate: each converts its arguments and calls the C++ API once.
#include <string>
#include <vector>

#include "api/c_api_internal.h"
#include "kvq/chat.h"
#include "kvq/generator.h"

namespace kvq::capi {

kvq::SamplerOptions Sampling(const kvq_generate_options& o) {
  return {.temperature = o.temperature,
          .top_k = o.top_k,
          .top_p = o.top_p,
          .min_p = o.min_p,
          .seed = o.seed};
}

int FinishToC(kvq::FinishReason reason) {
  switch (reason) {
    case kvq::FinishReason::kStop:
      return KVQ_FINISH_STOP;
    case kvq::FinishReason::kLength:
      return KVQ_FINISH_LENGTH;
    case kvq::FinishReason::kContext:
      return KVQ_FINISH_CONTEXT;
    case kvq::FinishReason::kCancelled:
      return KVQ_FINISH_CANCELLED;
  }
  return KVQ_FINISH_STOP;
}

// The caller's options (NULL: the defaults) read as this library's struct; false with the error
// set.
bool ReadGenerateOptions(const char* what, const kvq_generate_options* in,
                         kvq_generate_options& out) {
  kvq_generate_options_init(&out);
  if (in == nullptr) return true;
  return ReadStruct((std::string(what) + ": options").c_str(), "kvq_generate_options",
                               kGenerateOptionsFirstSize, *in, out);
}

// The GenerateRequest of `o`; false with the error set (naming the field) for a bad stop list,
// grammar or schema.
bool RequestFromC(const char* what, const kvq_generate_options& o, kvq::GenerateRequest& request) {
  request = {.max_tokens = o.max_tokens, .sampling = Sampling(o), .ignore_eos = o.ignore_eos != 0};
  const std::string where = std::string(what) + ": options->";
  if (o.n_stop < 0 || (o.n_stop > 0 && o.stop == nullptr)) {
    Fail(where + "n_stop is " + std::to_string(o.n_stop) +
         (o.n_stop < 0 ? "; expected 0 or more" : " but options->stop is NULL"));
    return false;
  }
  for (int32_t i = 0; i < o.n_stop; ++i) {
    if (o.stop[i] == nullptr) {
      Fail(where + "stop[" + std::to_string(i) + "] is NULL");
      return false;
    }
    request.stop.emplace_back(o.stop[i]);
  }
  const std::string grammar = Str(o.grammar), schema = Str(o.json_schema);
  if (!grammar.empty() && !schema.empty()) {
    Fail(where + "grammar and json_schema are both set; give at most one");
    return false;
  }
  if (!schema.empty()) {
    kvq::Result<std::string> gbnf = kvq::JsonSchemaGrammar(schema);
    if (!gbnf.ok()) {
      Fail(where + "json_schema: " + gbnf.status().message());
      return false;
    }
    request.grammar = std::move(gbnf).value();
  } else if (!grammar.empty()) {
    if (kvq::Status s = kvq::Generator::Check({.grammar = grammar}); !s.ok()) {
      Fail(where + "grammar: " + s.message());
      return false;
    }
    request.grammar = grammar;
  }
  return true;
}

}  // namespace kvq::capi

namespace {

using kvq::capi::Check;
using kvq::capi::Fail;
using kvq::capi::Guard;
using kvq::capi::Missing;
using kvq::capi::FinishToC;
using kvq::capi::ReadGenerateOptions;
using kvq::capi::RequestFromC;
using kvq::capi::Sampling;
using kvq::capi::Str;

kvq::TokenCallback CallbackFromC(kvq_token_fn on_token, void* user_data) {
  if (on_token == nullptr) return {};
  return [on_token, user_data](int32_t token, const std::string& piece) {
    return on_token(token, piece.c_str(), user_data) != 0;
  };
}

// The body of the kvq_session_generate* calls: `prompt` is the text or the ids Session::Generate
// takes.
template <typename Prompt>
int Generate(const char* what, kvq_session* session, const Prompt& prompt,
             const kvq_generate_options* options, kvq_token_fn on_token, void* user_data,
             int64_t* n_generated) {
  session->last_finish = -1;  // until this call succeeds
  return Guard(what, KVQ_ERROR, [&] {
    kvq_generate_options o;
    kvq::GenerateRequest request;
    if (!ReadGenerateOptions(what, options, o) || !RequestFromC(what, o, request)) return KVQ_ERROR;
    request.speculation = session->speculation;  // kvq_session_set_speculation's
    kvq::Result<kvq::Completion> c =
        session->session->Generate(prompt, request, CallbackFromC(on_token, user_data));
    if (!c.ok()) return Fail(c.status().message());
    session->last_speculation = c->speculation;
    if (n_generated != nullptr) *n_generated = static_cast<int64_t>(c->tokens.size());
    session->last_finish = FinishToC(c->finish);
    return KVQ_OK;
  });
}

// messages[0..n) as the C++ API's; false with the error set for a NULL array, role or content.
bool MessagesFromC(const char* what, const kvq_chat_message* messages, int64_t n,
                   std::vector<kvq::ChatMessage>& out) {
  if (n < 0 || (messages == nullptr && n > 0)) {
    Fail(std::string(what) + ": messages is NULL or n_messages is negative");
    return false;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (messages[i].role == nullptr || messages[i].content == nullptr) {
      Fail(std::string(what) + ": messages[" + std::to_string(i) + "]." +
           (messages[i].role == nullptr ? "role" : "content") + " is NULL");
      return false;
    }
    out.push_back({.role = messages[i].role, .content = messages[i].content});
  }
  return true;
}

// The prompt text of a conversation; false with the error set.
bool RenderChat(const char* what, const kvq::Model& model, const kvq_chat_message* messages,
                int64_t n, const kvq_chat_options* options, std::string& text) {
  kvq_chat_options o;
  kvq_chat_options_init(&o);
  if (options != nullptr &&
      !kvq::capi::ReadStruct((std::string(what) + ": chat options").c_str(), "kvq_chat_options",
                             kvq::capi::kChatOptionsFirstSize, *options, o)) {
    return false;
  }
  std::vector<kvq::ChatMessage> chat;
  if (!MessagesFromC(what, messages, n, chat)) return false;
  kvq::ChatTemplateOptions render{.add_generation_prompt = o.add_generation_prompt != 0,
                                  .template_override = Str(o.template_override)};
  if (o.enable_thinking >= 0) render.enable_thinking = o.enable_thinking != 0;
  kvq::Result<std::string> rendered = model.ApplyChatTemplate(chat, render);
  if (!rendered.ok()) {
    Fail(std::string(what) + ": " + rendered.status().message());
    return false;
  }
  text = std::move(rendered).value();
  return true;
}

}  // namespace

extern "C" {

void kvq_generate_options_init(kvq_generate_options* o) {
  if (Missing(o, "kvq_generate_options_init: options")) return;
  const kvq::SamplerOptions d;
  *o = {.struct_size = sizeof(kvq_generate_options),
        .max_tokens = 256,
        .temperature = d.temperature,
        .top_k = d.top_k,
        .top_p = d.top_p,
        .min_p = d.min_p,
        .seed = d.seed,
        .stop = nullptr,
        .n_stop = 0,
        .ignore_eos = 0,
        .grammar = nullptr,
        .json_schema = nullptr};
}

void kvq_session_set_sampler(kvq_session* session, const kvq_generate_options* options) {
  if (Missing(session, "kvq_session_set_sampler: session") ||
      Missing(options, "kvq_session_set_sampler: options")) {
    return;
  }
  kvq_generate_options o;
  if (!ReadGenerateOptions("kvq_session_set_sampler", options, o)) return;
  session->session->SetSampler(Sampling(o));
}

int32_t kvq_session_sample(kvq_session* session) {
  if (Missing(session, "kvq_session_sample: session")) return -1;
  return Guard("kvq_session_sample", int32_t{-1}, [&]() -> int32_t {
    kvq::Result<int32_t> t = session->session->Sample();
    if (!t.ok()) {
      Fail(t.status().message());
      return -1;
    }
    return *t;
  });
}

int kvq_session_generate(kvq_session* session, const char* prompt,
                         const kvq_generate_options* options, kvq_token_fn on_token,
                         void* user_data, int64_t* n_generated) {
  if (n_generated != nullptr) *n_generated = 0;
  if (Missing(session, "kvq_session_generate: session") ||
      Missing(prompt, "kvq_session_generate: prompt")) {
    return KVQ_ERROR;
  }
  return Generate("kvq_session_generate", session, std::string_view(prompt), options, on_token,
                  user_data, n_generated);
}

int kvq_session_generate_tokens(kvq_session* session, const int32_t* ids, int64_t n,
                                const kvq_generate_options* options, kvq_token_fn on_token,
                                void* user_data, int64_t* n_generated) {
  if (n_generated != nullptr) *n_generated = 0;
  if (Missing(session, "kvq_session_generate_tokens: session")) return KVQ_ERROR;
  if (n < 0 || (ids == nullptr && n > 0))
    return Fail("kvq_session_generate_tokens: ids is NULL or n is negative");
  return Generate("kvq_session_generate_tokens", session,
                  std::span<const int32_t>(ids, static_cast<size_t>(n)), options, on_token,
                  user_data, n_generated);
}

int kvq_session_finish_reason(const kvq_session* session) {
  return Missing(session, "kvq_session_finish_reason: session") ? -1 : session->last_finish;
}

void kvq_chat_options_init(kvq_chat_options* o) {
  if (Missing(o, "kvq_chat_options_init: options")) return;
  *o = {.struct_size = sizeof(kvq_chat_options),
        .add_generation_prompt = 1,
        .enable_thinking = -1,
        .template_override = nullptr};
}

int64_t kvq_apply_chat_template(const kvq_model* model, const kvq_chat_message* messages,
                                int64_t n_messages, const kvq_chat_options* options, char* out,
                                int64_t capacity) {
  if (Missing(model, "kvq_apply_chat_template: model")) return -1;
  if (capacity < 0 || (out == nullptr && capacity > 0)) {
    Fail("kvq_apply_chat_template: out is NULL with a capacity, or the capacity is negative");
    return -1;
  }
  return Guard("kvq_apply_chat_template", int64_t{-1}, [&]() -> int64_t {
    std::string text;
    if (!RenderChat("kvq_apply_chat_template", *model->model, messages, n_messages, options, text))
      return -1;
    return kvq::capi::CopyText(text, out, capacity);
  });
}

int64_t kvq_tokenize_chat_prompt(const kvq_model* model, const char* text, int32_t* ids,
                                 int64_t capacity) {
  if (Missing(model, "kvq_tokenize_chat_prompt: model") ||
      Missing(text, "kvq_tokenize_chat_prompt: text")) {
    return -1;
  }
  if (capacity < 0 || (ids == nullptr && capacity > 0)) {
    Fail("kvq_tokenize_chat_prompt: ids is NULL with a capacity, or the capacity is negative");
    return -1;
  }
  return Guard("kvq_tokenize_chat_prompt", int64_t{-1}, [&] {
    return kvq::capi::CopyIds(model->model->TokenizeChatPrompt(text), ids, capacity);
  });
}

int kvq_session_generate_chat(kvq_session* session, const kvq_chat_message* messages,
                              int64_t n_messages, const kvq_chat_options* chat_options,
                              const kvq_generate_options* options, kvq_token_fn on_token,
                              void* user_data, int64_t* n_generated) {
  if (n_generated != nullptr) *n_generated = 0;
  if (Missing(session, "kvq_session_generate_chat: session")) return KVQ_ERROR;
  session->last_finish = -1;
  return Guard("kvq_session_generate_chat", KVQ_ERROR, [&] {
    std::string text;
    if (!RenderChat("kvq_session_generate_chat", *session->model, messages, n_messages,
                    chat_options, text)) {
      return KVQ_ERROR;
    }
    const std::vector<int32_t> ids = session->model->TokenizeChatPrompt(text);
    return Generate("kvq_session_generate_chat", session, std::span<const int32_t>(ids), options,
                    on_token, user_data, n_generated);
  });
}

}  // extern "C"
