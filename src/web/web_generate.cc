// The page's completions (see web_api.cc for the shim's conventions): kvq's Generator
// (kvq/generator.h) behind C functions, so that the page's worker keeps no generation rule of its
// own. The worker runs the model (the WebAssembly path: a session of this module, sampled here;
// the WebGPU path: its own runner, which samples on the GPU) and hands each sampled token to
// kvq_web_generator_next; the Generator says what text may be shown, whether the token runs, and
// when and why the completion ends (an end token or a stop string, max_tokens, a full context, a
// cancel) — the rules `kvq run`, the C API and kvq serve follow.
//
// Options are JSON: {"max_tokens": N (< 0: until an end token or the context is full), "stop":
// ["text", ...], "ignore_eos": bool}; a missing field takes GeneratorOptions' default; errors name
// the field as the page's params name it.
// A step is JSON too: {"text": shown now, "kept", "run", "finished", "finish_reason": "stop" |
// "length" | "context" | "cancelled" | null}, and once finished "completion": the whole text.
#include <emscripten/emscripten.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "kvq/generator.h"
#include "kvq/model.h"
#include "kvq/session.h"
#include "web/web_common.h"

namespace {

using json = nlohmann::json;
using kvq_web::Fail;

struct WebGenerator {
  kvq::Generator generator;
  std::string step_json;  // the last step's answer, valid until the next call
};

WebGenerator* GeneratorOf(int handle) { return reinterpret_cast<WebGenerator*>(static_cast<intptr_t>(handle)); }

// Text as JSON holds it: bytes that are not UTF-8 (a held-back character cut by the end, a byte
// token) become U+FFFD, as the page's TextDecoder would show them.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// The options JSON as GeneratorOptions; errors name the field as the page's params name it.
kvq::Result<kvq::GeneratorOptions> ParseOptions(const char* text) {
  const json j = json::parse(text != nullptr ? text : "", nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return kvq::Status::Error("expected a JSON object");
  kvq::GeneratorOptions o;
  for (const auto& [key, value] : j.items()) {
    if (key == "max_tokens") {
      if (!value.is_number_integer() || value.get<int64_t>() < INT32_MIN || value.get<int64_t>() > INT32_MAX) {
        return kvq::Status::Error("max_tokens must be a 32-bit integer");
      }
      o.max_tokens = value.get<int32_t>();
    } else if (key == "ignore_eos") {
      if (!value.is_boolean()) return kvq::Status::Error("ignore_eos must be true or false");
      o.ignore_eos = value.get<bool>();
    } else if (key == "stop") {
      if (!value.is_array()) return kvq::Status::Error("stop must be an array of strings");
      for (size_t i = 0; i < value.size(); ++i) {
        if (!value[i].is_string() || value[i].get_ref<const std::string&>().empty()) {
          return kvq::Status::Error("stop[" + std::to_string(i) + "] must be a non-empty string");
        }
        o.stop.push_back(value[i].get<std::string>());
      }
    } else {
      return kvq::Status::Error("unknown field \"" + key +
                                "\" (known: max_tokens, stop, ignore_eos)");
    }
  }
  if (kvq::Status s = kvq::Generator::Check(o); !s.ok()) return s;
  return o;
}

int Wrap(kvq::Result<kvq::Generator> made) {
  if (!made.ok()) {
    Fail(made.status().message());
    return 0;
  }
  return kvq_web::Handle(new WebGenerator{.generator = std::move(made).value()});
}

const char* Answer(WebGenerator& w, const kvq::GeneratorStep& step) {
  json j{{"text", step.text}, {"kept", step.kept}, {"run", step.run}, {"finished", step.finished},
         {"finish_reason", step.finished ? json(kvq::FinishReasonName(step.finish)) : json(nullptr)}};
  if (step.finished) j["completion"] = w.generator.text();
  w.step_json = Dump(j);
  return w.step_json.c_str();
}

}  // namespace

extern "C" {

// Prompt tokens per prefill call as kvq cuts a prompt (kPrefillBlock): the page cuts its prompt
// the same way, pausing between blocks so Stop is seen, and reads the size from here.
EMSCRIPTEN_KEEPALIVE int kvq_web_prefill_block() { return kvq::kPrefillBlock; }

// 0 when the options are valid (checked before the prompt runs), else -1 with the error.
EMSCRIPTEN_KEEPALIVE int kvq_web_generator_check(const char* options_json) {
  kvq::Result<kvq::GeneratorOptions> o = ParseOptions(options_json);
  return o.ok() ? 0 : Fail(o.status().message());
}

// The completion that follows what a session (kvq_web_session_new) holds: its prompt, run.
EMSCRIPTEN_KEEPALIVE int kvq_web_generator_new(int session, const char* options_json) {
  kvq::Result<kvq::GeneratorOptions> o = ParseOptions(options_json);
  if (!o.ok()) return Wrap(o.status());
  return Wrap(kvq::Generator::Create(*kvq_web::SessionOf(session)->session, *o));
}

// The completion of a sequence that the WebGPU runner holds (`positions` of the model's context,
// `last_token` run last): the page's GPU path.
EMSCRIPTEN_KEEPALIVE int kvq_web_generator_new_for_sequence(int model, int last_token, double positions,
                                                            const char* options_json) {
  kvq::Result<kvq::GeneratorOptions> o = ParseOptions(options_json);
  if (!o.ok()) return Wrap(o.status());
  const kvq::Model& m = *kvq_web::ModelOf(model)->model;
  return Wrap(kvq::Generator::Create(m, last_token, static_cast<int64_t>(positions), m.info().context, *o));
}

// Hands the generator the token sampled after the last token run; the step as JSON.
EMSCRIPTEN_KEEPALIVE const char* kvq_web_generator_next(int generator, int token) {
  WebGenerator& w = *GeneratorOf(generator);
  return Answer(w, w.generator.Next(token));
}

// Ends the completion as cancelled (the page's Stop); the step as JSON.
EMSCRIPTEN_KEEPALIVE const char* kvq_web_generator_cancel(int generator) {
  WebGenerator& w = *GeneratorOf(generator);
  return Answer(w, w.generator.Cancel());
}

EMSCRIPTEN_KEEPALIVE void kvq_web_generator_free(int generator) { delete GeneratorOf(generator); }

}  // extern "C"
