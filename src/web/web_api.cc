// The JS-facing C shim of the WebAssembly build: kvq's public API (kvq/model.h, session.h) behind
// plain C functions taking ints, floats, doubles and pointers only, as Module.ccall/cwrap can pass
// them (docs/architecture.md, "The WebAssembly module's boundary"). Handles are the objects' addresses; 0 means failure and
// kvq_web_last_error() says why. Returned JSON stays valid until the next call of that function.
#include <emscripten/emscripten.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "kvq/kv_memory.h"
#include "kvq/kv_spec.h"
#include "kvq/model.h"
#include "kvq/session.h"
#include "simd/dispatch.h"
#include "web/web_common.h"

namespace {

using kvq_web::Fail;
using kvq_web::Handle;
using kvq_web::LastError;
using kvq_web::ModelOf;
using kvq_web::SessionOf;
using kvq_web::WebModel;
using kvq_web::WebSession;

// Steady-state K+V bytes per token over all layers for these specs (transform rows held in f32
// — sinks, residual — are not per-token costs): seed 000's 2·layers·kv_heads·head_dim·bits/8 with
// the formats' scales, from kv_memory's PlanKvMemory.
kvq::Result<int64_t> BytesPerToken(const kvq::ModelInfo& info, const std::string& key_spec,
                                   const std::string& value_spec) {
  const kvq::KvShape shape{.n_layers = info.n_layers, .n_kv_heads = info.n_kv_heads, .head_dim = info.head_dim};
  kvq::Result<kvq::KvSpec> k = kvq::ParseKvSpec(key_spec);
  if (!k.ok()) return k.status();
  kvq::Result<kvq::KvSpec> v = kvq::ParseKvSpec(value_spec);
  if (!v.ok()) return v.status();
  kvq::Result<kvq::KvMemory> km = kvq::PlanKvMemory(*k->format, shape);
  if (!km.ok()) return km.status();
  kvq::Result<kvq::KvMemory> vm = kvq::PlanKvMemory(*v->format, shape);
  if (!vm.ok()) return vm.status();
  return shape.n_layers * (km->key_bytes_per_layer_position + vm->value_bytes_per_layer_position);
}

}  // namespace

extern "C" {

EMSCRIPTEN_KEEPALIVE const char* kvq_web_last_error(void) { return LastError().c_str(); }

EMSCRIPTEN_KEEPALIVE int kvq_web_model_load(const char* path, const char* tokenizer_path) {
  // One thread: this build has no pthreads, and ThreadPool(1) runs jobs on the caller's thread.
  kvq::ModelOptions options{.tokenizer_path = tokenizer_path != nullptr ? tokenizer_path : "", .threads = 1};
  kvq::Result<std::unique_ptr<kvq::Model>> model = kvq::Model::Load(path, options);
  if (!model.ok()) {
    Fail(model.status().message());
    return 0;
  }
  auto web = std::make_unique<WebModel>();
  web->model = std::move(model).value();
  struct stat st {};
  if (::stat(path, &st) == 0) web->file_bytes = st.st_size;
  return Handle(web.release());
}

EMSCRIPTEN_KEEPALIVE const char* kvq_web_model_info(int model) {
  WebModel* m = ModelOf(model);
  const kvq::ModelInfo& info = m->model->info();
  m->info_json = nlohmann::json{{"architecture", info.architecture},
                                {"n_layers", info.n_layers},
                                {"dim", info.dim},
                                {"n_heads", info.n_heads},
                                {"n_kv_heads", info.n_kv_heads},
                                {"head_dim", info.head_dim},
                                {"vocab_size", info.vocab_size},
                                {"context", info.context},
                                {"bos", info.bos},
                                {"eos", info.eos},
                                {"weight_bytes", m->file_bytes}}  // the model file: its weights and metadata
                     .dump();
  return m->info_json.c_str();
}

EMSCRIPTEN_KEEPALIVE void kvq_web_model_free(int model) { delete ModelOf(model); }

EMSCRIPTEN_KEEPALIVE int kvq_web_session_new(int model, const char* kv_k, const char* kv_v,
                                             double device_budget_bytes) {
  const WebModel* m = ModelOf(model);
  if (!(device_budget_bytes >= 0) || device_budget_bytes > 9.0e15) {
    Fail("device_budget_bytes must be 0 (none) or a positive byte count");
    return 0;
  }
  // Each spec checked here first, so a bad one is named as the page names it (K format, V format)
  // rather than by the option it would have filled.
  const kvq::RowShape shape{.n_kv_heads = m->model->info().n_kv_heads, .head_dim = m->model->info().head_dim};
  for (const auto& [label, text, is_value] : {std::tuple{"K format", kv_k, false}, std::tuple{"V format", kv_v, true}}) {
    kvq::Result<kvq::KvSpec> spec = kvq::ParseKvSpec(text);
    kvq::Status fits = spec.ok() ? (is_value ? kvq::CheckValueSpec(*spec, shape) : kvq::CheckKvSpec(*spec, shape))
                                 : spec.status();
    if (!fits.ok()) {
      Fail(std::string(label) + " \"" + text + "\": " + fits.message());
      return 0;
    }
  }
  kvq::KvOptions kv{.key_format = kv_k, .value_format = kv_v};
  kv.budgets.device_bytes = static_cast<int64_t>(device_budget_bytes);
  kvq::Result<std::unique_ptr<kvq::Session>> session = m->model->NewSession(kv);
  if (!session.ok()) {
    Fail(session.status().message());
    return 0;
  }
  auto web = std::make_unique<WebSession>();
  web->session = std::move(session).value();
  web->model = m;
  web->key_spec = kv_k;
  web->value_spec = kv_v;
  web->device_budget_bytes = device_budget_bytes;
  kvq::Result<int64_t> per_token = BytesPerToken(m->model->info(), web->key_spec, web->value_spec);
  kvq::Result<int64_t> f16_per_token = BytesPerToken(m->model->info(), "f16", "f16");
  if (!per_token.ok() || !f16_per_token.ok()) {
    Fail((per_token.ok() ? f16_per_token.status() : per_token.status()).message());
    return 0;
  }
  web->kv_bytes_per_token = *per_token;
  web->kv_f16_bytes_per_token = *f16_per_token;
  return Handle(web.release());
}

EMSCRIPTEN_KEEPALIVE void kvq_web_session_free(int session) { delete SessionOf(session); }

// Threads the session's forward passes use (1..the module's kvq_web_max_threads()); 0 or -1.
EMSCRIPTEN_KEEPALIVE int kvq_web_session_set_threads(int session, int threads) {
  // Checked here: kvq's pool would start threads that a build without pthreads cannot run.
  if (threads < 1 || threads > kvq_web_max_threads()) {
    return Fail("threads must be between 1 and " + std::to_string(kvq_web_max_threads()) + " in this build");
  }
  const kvq::Status s = SessionOf(session)->session->SetThreads(threads);
  return s.ok() ? 0 : Fail(s.message());
}

EMSCRIPTEN_KEEPALIVE int kvq_web_tokenize(int model, const char* text, int add_bos, int32_t* ids, int capacity) {
  if (add_bos < -1 || add_bos > 1) return Fail("add_bos must be -1 (model default), 0 or 1");
  const kvq::AddBos mode = add_bos < 0 ? kvq::AddBos::kModelDefault : add_bos ? kvq::AddBos::kYes : kvq::AddBos::kNo;
  const std::vector<int32_t> tokens = ModelOf(model)->model->Tokenize(text, mode);
  const int n = static_cast<int>(tokens.size());
  if (ids != nullptr) std::copy_n(tokens.begin(), std::min(n, std::max(capacity, 0)), ids);
  return n;
}

// Writes min(bytes, capacity - 1) bytes and a NUL; returns the full byte count, so a caller whose
// buffer was too small calls again with a larger one.
EMSCRIPTEN_KEEPALIVE int kvq_web_detokenize(int model, const int32_t* ids, int n, char* out, int capacity) {
  if (n < 0) return Fail("detokenize: negative token count");
  kvq::Result<std::string> text = ModelOf(model)->model->Detokenize({ids, static_cast<size_t>(n)});
  if (!text.ok()) return Fail(text.status().message());
  if (out != nullptr && capacity > 0) {
    const size_t written = std::min(text->size(), static_cast<size_t>(capacity - 1));
    std::memcpy(out, text->data(), written);
    out[written] = '\0';
  }
  return static_cast<int>(text->size());
}

EMSCRIPTEN_KEEPALIVE int kvq_web_prefill(int session, const int32_t* ids, int n) {
  if (n < 0) return Fail("prefill: negative token count");
  const kvq::Status s = SessionOf(session)->session->Prefill({ids, static_cast<size_t>(n)});
  return s.ok() ? 0 : Fail(s.message());
}

EMSCRIPTEN_KEEPALIVE int kvq_web_decode(int session, int token) {
  const kvq::Status s = SessionOf(session)->session->Decode(token);
  return s.ok() ? 0 : Fail(s.message());
}

EMSCRIPTEN_KEEPALIVE int kvq_web_set_sampler(int session, const float* settings, uint32_t seed_low, uint32_t seed_high,
                                             const int32_t* bias, int n_bias) {
  kvq::SamplerOptions options;
  const std::string error = kvq_web::WebSamplerOptions(settings, seed_low, seed_high, bias, n_bias, &options);
  if (!error.empty()) return Fail(error);
  SessionOf(session)->session->SetSampler(std::move(options));
  return 0;
}

EMSCRIPTEN_KEEPALIVE int kvq_web_sample(int session) {
  kvq::Result<int32_t> token = SessionOf(session)->session->Sample();
  return token.ok() ? *token : Fail(token.status().message());
}

EMSCRIPTEN_KEEPALIVE const char* kvq_web_session_stats(int session) {
  WebSession* s = SessionOf(session);
  s->stats_json = nlohmann::json{{"positions", s->session->positions()},
                                 {"context", s->session->context()},
                                 {"threads", s->session->threads()},
                                 {"kv_bytes", s->session->kv_bytes()},
                                 {"kv_bytes_per_token", s->kv_bytes_per_token},
                                 {"kv_f16_bytes_per_token", s->kv_f16_bytes_per_token},
                                 {"kv_key_format", s->key_spec},
                                 {"kv_value_format", s->value_spec},
                                 {"device_budget_bytes", s->device_budget_bytes}}
                      .dump();
  return s->stats_json.c_str();
}

EMSCRIPTEN_KEEPALIVE const char* kvq_web_simd_target(void) { return kvq::simd::DispatchedTargetName(); }

}  // extern "C"
