// The C API's generator (include/kvq.h: kvq_generator_*) over kvq::Generator: a C caller running
// its own sampling loop, or its own runner, gets the completion rules of kvq_session_generate from
// the one implementation of them.
#include <limits>
#include <span>
#include <string>
#include <utility>

#include "api/c_api_internal.h"
#include "kvq/generator.h"

struct kvq_generator {
  std::shared_ptr<const kvq::Model> model;  // the vocabulary the generator reads (kept alive)
  kvq::Generator generator;
  std::string step_text;  // the last step's text, valid until the next call
};

namespace {

using kvq::capi::Fail;
using kvq::capi::Guard;
using kvq::capi::Missing;

// The GeneratorOptions of the caller's kvq_generate_options; false with the error set.
bool OptionsFromC(const char* what, const kvq_generate_options* options, kvq::GeneratorOptions& out) {
  kvq_generate_options o;
  kvq::GenerateRequest request;
  if (!kvq::capi::ReadGenerateOptions(what, options, o) || !kvq::capi::RequestFromC(what, o, request)) {
    return false;
  }
  out = {.max_tokens = request.max_tokens,
         .stop = std::move(request.stop),
         .ignore_eos = request.ignore_eos,
         .grammar = std::move(request.grammar)};
  return true;
}

kvq_generator* Wrap(const char* what, std::shared_ptr<const kvq::Model> model,
                    kvq::Result<kvq::Generator> made) {
  if (!made.ok()) {
    Fail(std::string(what) + ": " + made.status().message());
    return nullptr;
  }
  return new kvq_generator{.model = std::move(model), .generator = std::move(made).value(), .step_text = {}};
}

// Writes `s` to the caller's step; its text stays in `g` until the next call.
int StepToC(kvq_generator* g, kvq::GeneratorStep s, kvq_generator_step* out) {
  g->step_text = std::move(s.text);
  out->text = g->step_text.c_str();
  out->text_bytes = static_cast<int64_t>(g->step_text.size());
  out->kept = s.kept ? 1 : 0;
  out->run = s.run ? 1 : 0;
  out->finished = s.finished ? 1 : 0;
  out->finish_reason = s.finished ? kvq::capi::FinishToC(s.finish) : -1;
  return KVQ_OK;
}

// The caller's step struct: present, and of this library's size (its first and only version).
bool StepStructOk(const char* what, const kvq_generator_step* step) {
  if (Missing(step, (std::string(what) + ": step").c_str())) return false;
  return kvq::capi::CheckStructSize(what, "kvq_generator_step", step->struct_size, sizeof(kvq_generator_step),
                                    sizeof(kvq_generator_step));
}

}  // namespace

extern "C" {

kvq_generator* kvq_generator_new(const kvq_session* session, const kvq_generate_options* options) {
  constexpr const char* kWhat = "kvq_generator_new";
  if (Missing(session, "kvq_generator_new: session")) return nullptr;
  return Guard(kWhat, static_cast<kvq_generator*>(nullptr), [&]() -> kvq_generator* {
    kvq::GeneratorOptions o;
    if (!OptionsFromC(kWhat, options, o)) return nullptr;
    return Wrap(kWhat, session->model, kvq::Generator::Create(*session->session, o));
  });
}

kvq_generator* kvq_generator_new_for_sequence(const kvq_model* model, int32_t last_token,
                                              int64_t positions, int64_t context,
                                              const kvq_generate_options* options) {
  constexpr const char* kWhat = "kvq_generator_new_for_sequence";
  if (Missing(model, "kvq_generator_new_for_sequence: model")) return nullptr;
  return Guard(kWhat, static_cast<kvq_generator*>(nullptr), [&]() -> kvq_generator* {
    kvq::GeneratorOptions o;
    if (!OptionsFromC(kWhat, options, o)) return nullptr;
    return Wrap(kWhat, model->model,
                kvq::Generator::Create(*model->model, last_token, positions, context, o));
  });
}

void kvq_generator_free(kvq_generator* generator) { delete generator; }

int kvq_generator_constrain(kvq_generator* generator, float* logits, int64_t n) {
  constexpr const char* kWhat = "kvq_generator_constrain";
  if (Missing(generator, "kvq_generator_constrain: generator")) return KVQ_ERROR;
  const int64_t vocab = generator->model->info().vocab_size;
  if (logits == nullptr || n != vocab) {
    return Fail(std::string(kWhat) + ": expected logits[" + std::to_string(vocab) +
                "] (the vocabulary), got " + (logits == nullptr ? "NULL" : "n = " + std::to_string(n)));
  }
  return Guard(kWhat, KVQ_ERROR, [&] {
    generator->generator.Constrain(std::span<float>(logits, static_cast<size_t>(n)));
    return KVQ_OK;
  });
}

int kvq_generator_next(kvq_generator* generator, int32_t token, kvq_generator_step* step) {
  constexpr const char* kWhat = "kvq_generator_next";
  if (Missing(generator, "kvq_generator_next: generator") || !StepStructOk(kWhat, step)) return KVQ_ERROR;
  return Guard(kWhat, KVQ_ERROR, [&] { return StepToC(generator, generator->generator.Next(token), step); });
}

int kvq_generator_cancel(kvq_generator* generator, kvq_generator_step* step) {
  constexpr const char* kWhat = "kvq_generator_cancel";
  if (Missing(generator, "kvq_generator_cancel: generator") || !StepStructOk(kWhat, step)) return KVQ_ERROR;
  return Guard(kWhat, KVQ_ERROR, [&] { return StepToC(generator, generator->generator.Cancel(), step); });
}

const char* kvq_generator_text(const kvq_generator* generator, int64_t* bytes) {
  if (bytes != nullptr) *bytes = 0;
  if (Missing(generator, "kvq_generator_text: generator")) return nullptr;
  const std::string& text = generator->generator.text();
  if (bytes != nullptr) *bytes = static_cast<int64_t>(text.size());
  return text.c_str();
}

int64_t kvq_generator_tokens(const kvq_generator* generator, int32_t* ids, int64_t capacity) {
  if (Missing(generator, "kvq_generator_tokens: generator")) return -1;
  if (capacity < 0 || (ids == nullptr && capacity > 0)) {
    Fail("kvq_generator_tokens: ids is NULL or capacity is negative");
    return -1;
  }
  const std::span<const int32_t> t = generator->generator.tokens();
  return kvq::capi::CopyIds(std::vector<int32_t>(t.begin(), t.end()), ids, capacity);
}

}  // extern "C"
