// The C API (include/kvq.h) over the C++ API: handles wrap Model and Session; errors land in a
// thread-local string that kvq_last_error returns. Generation and chat: c_api_generate.cc.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "api/c_api_internal.h"
#include "kvq/log.h"

namespace kvq::capi {
namespace {
thread_local std::string last_error;
}  // namespace

int Fail(const std::string& message) {
  last_error = message;
  return KVQ_ERROR;
}

int Check(const Status& s) { return s.ok() ? KVQ_OK : Fail(s.message()); }

bool Missing(const void* p, const char* what) {
  if (p != nullptr) return false;
  Fail(std::string(what) + " is NULL");
  return true;
}

int64_t CopyIds(const std::vector<int32_t>& ids, int32_t* out, int64_t capacity) {
  const int64_t n = static_cast<int64_t>(ids.size());
  if (n > 0 && capacity > 0) std::memcpy(out, ids.data(), sizeof(int32_t) * std::min(n, capacity));
  return n;
}

int64_t CopyText(const std::string& text, char* out, int64_t capacity) {
  const int64_t len = static_cast<int64_t>(text.size());
  if (capacity > 0) {
    const int64_t copied = std::min(len, capacity - 1);
    std::memcpy(out, text.data(), copied);
    out[copied] = '\0';
  }
  return len;
}

bool CheckStructSize(const char* what, const char* name, size_t got, size_t first_size, size_t size) {
  if (got >= first_size && got <= size) return true;
  if (got > size) {
    Fail(fmt::format("{}: struct_size is {}, larger than this libkvq {}'s {} ({} bytes): the program was "
                     "built against a newer kvq.h than the library it loaded",
                     what, got, Version(), name, size));
  } else {
    const std::string older = first_size < size ? fmt::format(", or {} as first published", first_size) : "";
    Fail(fmt::format("{}: struct_size is {}; this libkvq {} takes {} ({} bytes{}): set struct_size = sizeof({}), "
                     "as {}_init does",
                     what, got, Version(), name, size, older, name, name));
  }
  return false;
}

}  // namespace kvq::capi

namespace {

using kvq::capi::Check;
using kvq::capi::Fail;
using kvq::capi::Guard;
using kvq::capi::Missing;
using kvq::capi::Str;

static_assert(KVQ_REPACK_AUTO == static_cast<int>(kvq::Repack::kAuto) &&
              KVQ_REPACK_ALL == static_cast<int>(kvq::Repack::kAll) &&
              KVQ_REPACK_NONE == static_cast<int>(kvq::Repack::kNone));

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

const char* kvq_last_error(void) { return kvq::capi::last_error.c_str(); }

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
  o->struct_size = sizeof(kvq_model_options);
  o->kv_key_format = "f16";
  o->kv_value_format = "f16";
}

kvq_model* kvq_model_load(const char* path, const kvq_model_options* options) {
  if (Missing(path, "kvq_model_load: path")) return nullptr;
  return Guard("kvq_model_load", static_cast<kvq_model*>(nullptr), [&]() -> kvq_model* {
    kvq_model_options o;
    kvq_model_options_init(&o);
    if (options != nullptr && !kvq::capi::ReadStruct("kvq_model_load: options", "kvq_model_options",
                                                     kvq::capi::kModelOptionsFirstSize, *options, o)) {
      return nullptr;
    }
    if (o.repack != KVQ_REPACK_AUTO && o.repack != KVQ_REPACK_ALL && o.repack != KVQ_REPACK_NONE) {
      Fail(fmt::format("kvq_model_load: options->repack must be KVQ_REPACK_AUTO, KVQ_REPACK_ALL or "
                       "KVQ_REPACK_NONE (0, 1, 2; got {})", o.repack));
      return nullptr;
    }
    const kvq::ModelOptions mo{.tokenizer_path = Str(o.tokenizer_path), .threads = o.threads,
                               .context = o.context, .kv = KvFromC(o),
                               .repack = static_cast<kvq::Repack>(o.repack),
                               .repack_memory_available = o.repack_memory_available};
    kvq::Result<std::unique_ptr<kvq::Model>> m = kvq::Model::Load(path, mo);
    if (!m.ok()) {
      Fail(m.status().message());
      return nullptr;
    }
    return new kvq_model{std::move(m).value()};
  });
}

void kvq_model_free(kvq_model* model) { delete model; }

void kvq_model_info_init(kvq_model_info* info) {
  if (Missing(info, "kvq_model_info_init: info")) return;
  *info = {};
  info->struct_size = sizeof(kvq_model_info);
}

int kvq_model_get_info(const kvq_model* model, kvq_model_info* info) {
  if (Missing(model, "kvq_model_get_info: model") || Missing(info, "kvq_model_get_info: info")) return KVQ_ERROR;
  if (!kvq::capi::CheckStructSize("kvq_model_get_info: info", "kvq_model_info", info->struct_size,
                                  kvq::capi::kModelInfoFirstSize, sizeof(kvq_model_info))) {
    return KVQ_ERROR;
  }
  const kvq::ModelInfo& i = model->model->info();
  // Filled whole here, then copied as far as the caller's struct reaches.
  const kvq_model_info full{.struct_size = info->struct_size,
                            .architecture = i.architecture.c_str(),
                            .n_layers = i.n_layers,
                            .dim = i.dim,
                            .hidden_dim = i.hidden_dim,
                            .n_heads = i.n_heads,
                            .n_kv_heads = i.n_kv_heads,
                            .head_dim = i.head_dim,
                            .vocab_size = i.vocab_size,
                            .trained_context = i.trained_context,
                            .context = i.context,
                            .threads = i.threads,
                            .bos = i.bos,
                            .eos = i.eos,
                            .n_attention_layers = i.n_attention_layers,
                            .state_bytes = i.state_bytes,
                            .chat_template = i.chat_template.c_str()};
  std::memcpy(static_cast<void*>(info), &full, info->struct_size);
  return KVQ_OK;
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
    return kvq::capi::CopyIds(model->model->Tokenize(text, bos), ids, capacity);
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
    return kvq::capi::CopyText(*text, out, capacity);
  });
}

int kvq_is_end_of_generation(const kvq_model* model, int32_t token) {
  return model != nullptr && model->model->IsEndOfGeneration(token) ? 1 : 0;
}

kvq_session* kvq_session_new(const kvq_model* model, const kvq_model_options* kv_override) {
  if (Missing(model, "kvq_session_new: model")) return nullptr;
  return Guard("kvq_session_new", static_cast<kvq_session*>(nullptr), [&]() -> kvq_session* {
    kvq_model_options kv;
    kvq_model_options_init(&kv);
    if (kv_override != nullptr && !kvq::capi::ReadStruct("kvq_session_new: kv_override", "kvq_model_options",
                                                         kvq::capi::kModelOptionsFirstSize, *kv_override, kv)) {
      return nullptr;
    }
    kvq::Result<std::unique_ptr<kvq::Session>> s =
        kv_override != nullptr ? model->model->NewSession(KvFromC(kv)) : model->model->NewSession();
    if (!s.ok()) {
      Fail(s.status().message());
      return nullptr;
    }
    return new kvq_session{.model = model->model, .session = std::move(s).value()};
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

}  // extern "C"
