// The C API (include/kvq.h) over the C++ API: handles wrap Model and Session; errors land in a
// thread-local string that kvq_last_error returns.
#include "kvq.h"

#include <cstring>
#include <string>
#include <vector>

#include "kvq/log.h"
#include "kvq/model.h"
#include "kvq/session.h"

struct kvq_model {
  std::unique_ptr<kvq::Model> model;
};
struct kvq_session {
  std::unique_ptr<kvq::Session> session;
  int last_finish = -1;  // kvq_finish_reason of the last successful generate; -1: none
};

namespace {

thread_local std::string last_error;

int Fail(const std::string& message) {
  last_error = message;
  return KVQ_ERROR;
}

int Check(const kvq::Status& s) { return s.ok() ? KVQ_OK : Fail(s.message()); }

// Every entry point runs its body through Guard: a C++ exception (std::bad_alloc, a throwing
// callback) never crosses into C; it becomes the call's error.
template <typename T, typename F>
T Guard(const char* what, T on_error, F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    Fail(std::string(what) + ": " + e.what());
  } catch (...) {
    Fail(std::string(what) + ": unknown C++ exception");
  }
  return on_error;
}

// For handles and option structs: NULL is an error with a message, not a crash.
bool Missing(const void* p, const char* what) {
  if (p != nullptr) return false;
  Fail(std::string(what) + " is NULL");
  return true;
}

std::string Str(const char* s, const char* fallback = "") { return s != nullptr ? s : fallback; }

kvq::SamplerOptions Sampling(const kvq_generate_options& o) {
  return {.temperature = o.temperature, .top_k = o.top_k, .top_p = o.top_p, .min_p = o.min_p, .seed = o.seed};
}

int FinishToC(kvq::FinishReason reason) {
  switch (reason) {
    case kvq::FinishReason::kStop: return KVQ_FINISH_STOP;
    case kvq::FinishReason::kLength: return KVQ_FINISH_LENGTH;
    case kvq::FinishReason::kContext: return KVQ_FINISH_CONTEXT;
    case kvq::FinishReason::kCancelled: return KVQ_FINISH_CANCELLED;
  }
  return KVQ_FINISH_STOP;
}

kvq::KvOptions KvFromC(const kvq_model_options& o) {
  kvq::KvOptions kv;
  kv.key_format = Str(o.kv_key_format, "f16");
  kv.value_format = Str(o.kv_value_format, "f16");
  kv.budgets.device_bytes = o.kv_device_budget_bytes;
  kv.budgets.host_bytes = o.kv_host_budget_bytes;
  kv.budgets.disk_dir = Str(o.kv_disk_dir);
  for (int32_t l = 0; l < o.n_kv_layers; ++l) {
    kv.layers.push_back({.key = Str(o.kv_layer_key_formats ? o.kv_layer_key_formats[l] : nullptr, "f16"),
                         .value = Str(o.kv_layer_value_formats ? o.kv_layer_value_formats[l] : nullptr, "f16")});
  }
  return kv;
}

}  // namespace

extern "C" {

const char* kvq_version(void) { return kvq::Version(); }

const char* kvq_last_error(void) { return last_error.c_str(); }

void kvq_set_log_callback(kvq_log_fn fn, void* user_data) {
  Guard("kvq_set_log_callback", 0, [&] {
    if (fn == nullptr) {
      kvq::SetLogCallback({});
    } else {
      kvq::SetLogCallback([fn, user_data](kvq::LogLevel level, const std::string& message) {
        fn(static_cast<int>(level), message.c_str(), user_data);
      });
    }
    return 0;
  });
}

void kvq_model_options_init(kvq_model_options* o) {
  if (Missing(o, "kvq_model_options_init: options")) return;
  *o = {};
  o->kv_key_format = "f16";
  o->kv_value_format = "f16";
}

kvq_model* kvq_model_load(const char* path, const kvq_model_options* options) {
  if (Missing(path, "kvq_model_load: path")) return nullptr;
  return Guard("kvq_model_load", static_cast<kvq_model*>(nullptr), [&]() -> kvq_model* {
    kvq_model_options defaults;
    kvq_model_options_init(&defaults);
    const kvq_model_options& o = options != nullptr ? *options : defaults;
    const kvq::ModelOptions mo{.tokenizer_path = Str(o.tokenizer_path), .threads = o.threads,
                               .context = o.context, .kv = KvFromC(o)};
    kvq::Result<std::unique_ptr<kvq::Model>> m = kvq::Model::Load(path, mo);
    if (!m.ok()) {
      Fail(m.status().message());
      return nullptr;
    }
    return new kvq_model{std::move(m).value()};
  });
}

void kvq_model_free(kvq_model* model) { delete model; }

void kvq_model_get_info(const kvq_model* model, kvq_model_info* info) {
  if (Missing(model, "kvq_model_get_info: model") || Missing(info, "kvq_model_get_info: info")) return;
  const kvq::ModelInfo& i = model->model->info();
  *info = {.architecture = i.architecture.c_str(), .n_layers = i.n_layers, .dim = i.dim,
           .hidden_dim = i.hidden_dim, .n_heads = i.n_heads, .n_kv_heads = i.n_kv_heads,
           .head_dim = i.head_dim, .vocab_size = i.vocab_size, .trained_context = i.trained_context,
           .context = i.context, .threads = i.threads, .bos = i.bos, .eos = i.eos,
           .n_attention_layers = i.n_attention_layers, .state_bytes = i.state_bytes,
           .chat_template = i.chat_template.c_str()};
}

int64_t kvq_tokenize(const kvq_model* model, const char* text, int add_bos, int32_t* ids, int64_t capacity) {
  if (Missing(model, "kvq_tokenize: model") || Missing(text, "kvq_tokenize: text")) return -1;
  if (capacity < 0 || (ids == nullptr && capacity > 0)) {
    Fail("kvq_tokenize: ids is NULL with a capacity, or the capacity is negative");
    return -1;
  }
  return Guard("kvq_tokenize", int64_t{-1}, [&] {
    const kvq::AddBos bos =
        add_bos < 0 ? kvq::AddBos::kModelDefault : add_bos ? kvq::AddBos::kYes : kvq::AddBos::kNo;
    const std::vector<int32_t> t = model->model->Tokenize(text, bos);
    const int64_t n = static_cast<int64_t>(t.size());
    if (n > 0 && capacity > 0) std::memcpy(ids, t.data(), sizeof(int32_t) * std::min(n, capacity));
    return n;
  });
}

int64_t kvq_detokenize(const kvq_model* model, const int32_t* ids, int64_t n, char* out, int64_t capacity) {
  if (Missing(model, "kvq_detokenize: model")) return -1;
  if (n < 0 || (ids == nullptr && n > 0) || capacity < 0 || (out == nullptr && capacity > 0)) {
    Fail("kvq_detokenize: bad arguments (NULL buffer with a length, or a negative length)");
    return -1;
  }
  return Guard("kvq_detokenize", int64_t{-1}, [&]() -> int64_t {
    kvq::Result<std::string> text = model->model->Detokenize({ids, static_cast<size_t>(n)});
    if (!text.ok()) {
      Fail(text.status().message());
      return -1;
    }
    const int64_t len = static_cast<int64_t>(text->size());
    if (capacity > 0) {
      const int64_t copied = std::min(len, capacity - 1);
      std::memcpy(out, text->data(), copied);
      out[copied] = '\0';
    }
    return len;
  });
}

int kvq_is_end_of_generation(const kvq_model* model, int32_t token) {
  return model != nullptr && model->model->IsEndOfGeneration(token) ? 1 : 0;
}

kvq_session* kvq_session_new(const kvq_model* model, const kvq_model_options* kv_override) {
  if (Missing(model, "kvq_session_new: model")) return nullptr;
  return Guard("kvq_session_new", static_cast<kvq_session*>(nullptr), [&]() -> kvq_session* {
    kvq::Result<std::unique_ptr<kvq::Session>> s =
        kv_override != nullptr ? model->model->NewSession(KvFromC(*kv_override)) : model->model->NewSession();
    if (!s.ok()) {
      Fail(s.status().message());
      return nullptr;
    }
    return new kvq_session{std::move(s).value()};
  });
}

void kvq_session_free(kvq_session* session) { delete session; }

int kvq_session_prefill(kvq_session* session, const int32_t* ids, int64_t n) {
  if (Missing(session, "kvq_session_prefill: session")) return KVQ_ERROR;
  if (n < 0 || (ids == nullptr && n > 0)) return Fail("kvq_session_prefill: ids is NULL or n is negative");
  return Guard("kvq_session_prefill", KVQ_ERROR,
               [&] { return Check(session->session->Prefill({ids, static_cast<size_t>(n)})); });
}

int kvq_session_prefill_logits_at(kvq_session* session, const int32_t* ids, int64_t n,
                                  const int32_t* logits_at, int64_t n_at) {
  if (Missing(session, "kvq_session_prefill_logits_at: session")) return KVQ_ERROR;
  if (n < 0 || (ids == nullptr && n > 0)) {
    return Fail("kvq_session_prefill_logits_at: ids is NULL or n is negative");
  }
  if (n_at < 0 || (logits_at == nullptr && n_at > 0)) {
    return Fail("kvq_session_prefill_logits_at: logits_at is NULL or n_at is negative");
  }
  return Guard("kvq_session_prefill_logits_at", KVQ_ERROR, [&] {
    return Check(session->session->Prefill({ids, static_cast<size_t>(n)},
                                           {logits_at, static_cast<size_t>(n_at)}));
  });
}

const float* kvq_session_chosen_logits(const kvq_session* session, int64_t* n_rows) {
  if (n_rows != nullptr) *n_rows = 0;
  if (Missing(session, "kvq_session_chosen_logits: session")) return nullptr;
  const std::span<const float> rows = session->session->chosen_logits();
  if (rows.empty()) return nullptr;
  if (n_rows != nullptr) *n_rows = static_cast<int64_t>(rows.size()) / session->session->logits().size();
  return rows.data();
}

int kvq_session_decode(kvq_session* session, int32_t token) {
  if (Missing(session, "kvq_session_decode: session")) return KVQ_ERROR;
  return Guard("kvq_session_decode", KVQ_ERROR, [&] { return Check(session->session->Decode(token)); });
}

int kvq_session_run_batch(kvq_session* const* sessions, const int32_t* const* tokens,
                          const int64_t* n_tokens, int32_t n_items) {
  if (n_items < 1) {
    return Fail("kvq_session_run_batch: n_items must be at least 1 (got " +
                std::to_string(n_items) + ")");
  }
  if (Missing(sessions, "kvq_session_run_batch: sessions") ||
      Missing(tokens, "kvq_session_run_batch: tokens") ||
      Missing(n_tokens, "kvq_session_run_batch: n_tokens")) {
    return KVQ_ERROR;
  }
  return Guard("kvq_session_run_batch", KVQ_ERROR, [&] {
    std::vector<kvq::BatchItem> items(static_cast<size_t>(n_items));
    for (int32_t i = 0; i < n_items; ++i) {
      const std::string item = "kvq_session_run_batch: item " + std::to_string(i) + ": ";
      if (sessions[i] == nullptr) return Fail(item + "the session is NULL");
      if (n_tokens[i] < 1) {
        return Fail(item + "n_tokens is " + std::to_string(n_tokens[i]) + "; at least 1");
      }
      if (tokens[i] == nullptr) return Fail(item + "the token list is NULL");
      items[i] = {.session = sessions[i]->session.get(),
                  .tokens = {tokens[i], static_cast<size_t>(n_tokens[i])}};
    }
    return Check(kvq::Session::RunBatch(items));
  });
}

int kvq_session_set_threads(kvq_session* session, int32_t threads) {
  if (Missing(session, "kvq_session_set_threads: session")) return KVQ_ERROR;
  return Guard("kvq_session_set_threads", KVQ_ERROR,
               [&] { return Check(session->session->SetThreads(threads)); });
}

int kvq_session_set_abort_callback(kvq_session* session, kvq_abort_fn fn, void* user) {
  if (Missing(session, "kvq_session_set_abort_callback: session")) return KVQ_ERROR;
  return Guard("kvq_session_set_abort_callback", KVQ_ERROR, [&] {
    if (fn == nullptr) {
      session->session->SetAbortCallback({});
    } else {
      session->session->SetAbortCallback([fn, user] { return fn(user) != 0; });
    }
    return KVQ_OK;
  });
}

const float* kvq_session_logits(const kvq_session* session) {
  if (Missing(session, "kvq_session_logits: session")) return nullptr;
  const std::span<const float> l = session->session->logits();
  return l.empty() ? nullptr : l.data();
}

int64_t kvq_session_positions(const kvq_session* session) {
  return Missing(session, "kvq_session_positions: session") ? -1 : session->session->positions();
}

int64_t kvq_session_kv_bytes(const kvq_session* session) {
  return Missing(session, "kvq_session_kv_bytes: session") ? -1 : session->session->kv_bytes();
}

int kvq_session_truncate(kvq_session* session, int64_t n) {
  if (Missing(session, "kvq_session_truncate: session")) return KVQ_ERROR;
  return Guard("kvq_session_truncate", KVQ_ERROR, [&] { return Check(session->session->Truncate(n)); });
}

int kvq_session_clear(kvq_session* session) {
  if (Missing(session, "kvq_session_clear: session")) return KVQ_ERROR;
  return Guard("kvq_session_clear", KVQ_ERROR, [&] { return Check(session->session->Clear()); });
}

int kvq_session_save_prefix(const kvq_session* session, const char* path) {
  if (Missing(session, "kvq_session_save_prefix: session") || Missing(path, "kvq_session_save_prefix: path")) {
    return KVQ_ERROR;
  }
  return Guard("kvq_session_save_prefix", KVQ_ERROR, [&] { return Check(session->session->SavePrefix(path)); });
}

int64_t kvq_session_load_prefix(kvq_session* session, const char* path) {
  if (Missing(session, "kvq_session_load_prefix: session") || Missing(path, "kvq_session_load_prefix: path")) {
    return -1;
  }
  return Guard("kvq_session_load_prefix", int64_t{-1}, [&]() -> int64_t {
    kvq::Result<int64_t> n = session->session->LoadPrefix(path);
    if (!n.ok()) {
      Fail(n.status().message());
      return -1;
    }
    return *n;
  });
}

void kvq_generate_options_init(kvq_generate_options* o) {
  if (Missing(o, "kvq_generate_options_init: options")) return;
  const kvq::SamplerOptions d;
  *o = {.max_tokens = 256, .temperature = d.temperature, .top_k = d.top_k, .top_p = d.top_p, .min_p = d.min_p,
        .seed = d.seed, .stop = nullptr, .n_stop = 0, .ignore_eos = 0};
}

void kvq_session_set_sampler(kvq_session* session, const kvq_generate_options* options) {
  if (Missing(session, "kvq_session_set_sampler: session") || Missing(options, "kvq_session_set_sampler: options")) {
    return;
  }
  session->session->SetSampler(Sampling(*options));
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

int kvq_session_generate(kvq_session* session, const char* prompt, const kvq_generate_options* options,
                         kvq_token_fn on_token, void* user_data, int64_t* n_generated) {
  if (n_generated != nullptr) *n_generated = 0;
  if (Missing(session, "kvq_session_generate: session") || Missing(prompt, "kvq_session_generate: prompt")) {
    return KVQ_ERROR;
  }
  session->last_finish = -1;  // until this call succeeds
  return Guard("kvq_session_generate", KVQ_ERROR, [&] {
    kvq_generate_options defaults;
    kvq_generate_options_init(&defaults);
    const kvq_generate_options& o = options != nullptr ? *options : defaults;
    kvq::TokenCallback callback;
    if (on_token != nullptr) {
      callback = [on_token, user_data](int32_t token, const std::string& piece) {
        return on_token(token, piece.c_str(), user_data) != 0;
      };
    }
    kvq::GenerateRequest request{.max_tokens = o.max_tokens, .sampling = Sampling(o), .ignore_eos = o.ignore_eos != 0};
    if (o.n_stop < 0 || (o.n_stop > 0 && o.stop == nullptr)) {
      return Fail("kvq_session_generate: options->n_stop is " + std::to_string(o.n_stop) +
                  (o.n_stop < 0 ? "; expected 0 or more" : " but options->stop is NULL"));
    }
    for (int32_t i = 0; i < o.n_stop; ++i) {
      if (o.stop[i] == nullptr) return Fail("kvq_session_generate: options->stop[" + std::to_string(i) + "] is NULL");
      request.stop.emplace_back(o.stop[i]);
    }
    kvq::Result<kvq::Completion> c = session->session->Generate(prompt, request, callback);
    if (!c.ok()) return Fail(c.status().message());
    if (n_generated != nullptr) *n_generated = static_cast<int64_t>(c->tokens.size());
    session->last_finish = FinishToC(c->finish);
    return KVQ_OK;
  });
}

int kvq_session_finish_reason(const kvq_session* session) {
  return Missing(session, "kvq_session_finish_reason: session") ? -1 : session->last_finish;
}

}  // extern "C"
