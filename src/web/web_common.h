// What the WebAssembly shim's files share: the last error (kvq_web_last_error), handles, the
// loaded model and its sessions.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "kvq/model.h"
#include "kvq/sampling.h"
#include "kvq/session.h"

/// Threads a model can run with in this build (web_load.cc): 1 without pthreads.
extern "C" int kvq_web_max_threads(void);

namespace kvq_web {

inline std::string& LastError() {
  static std::string error;
  return error;
}

/// Records the error for kvq_web_last_error and returns -1 (the shim's failure value).
inline int Fail(const std::string& message) {
  LastError() = message;
  return -1;
}

/// An object's address as the int JS holds (addresses < 2^31: MAXIMUM_MEMORY).
template <typename T>
int Handle(T* p) {
  return static_cast<int>(reinterpret_cast<intptr_t>(p));
}

/// A loaded model (kvq_web_model_load's handle), shared by the shim's files.
struct WebModel {
  /// The model file's bytes when kvq_web_model_load_bytes loaded it (the model maps them: declared
  /// first, so freed after the model); null for a model loaded from a MEMFS path.
  std::unique_ptr<uint8_t, void (*)(void*)> file_data{nullptr, &std::free};
  std::unique_ptr<kvq::Model> model;
  int64_t file_bytes = 0;
  std::string info_json;
  std::string gpu_program_json;  // kvq_web_gpu_program's answer, kept while the model lives
};

inline WebModel* ModelOf(int handle) { return reinterpret_cast<WebModel*>(static_cast<intptr_t>(handle)); }

/// A session of a loaded model (kvq_web_session_new's handle): the page's WebAssembly path.
struct WebSession {
  std::unique_ptr<kvq::Session> session;
  const WebModel* model = nullptr;
  std::string key_spec, value_spec;
  double device_budget_bytes = 0;
  int64_t kv_bytes_per_token = 0, kv_f16_bytes_per_token = 0;
  std::string stats_json;
};

inline WebSession* SessionOf(int handle) { return reinterpret_cast<WebSession*>(static_cast<intptr_t>(handle)); }

/// The page's sampler settings as kvq's (web_sampler.cc; both paths take them so): settings [8]
/// {temperature, top_k, top_p, min_p, repeat_penalty, frequency_penalty, presence_penalty,
/// repeat_last_n}, the seed's low and high 32 bits (two words: kvq::SamplerOptions::seed is 64-bit,
/// as `kvq run --seed` takes it, and a wasm argument is 32), logit_bias [n_bias][token id, the bias's
/// f32 bits]. Returns what is out of range, naming the field and the value ('' when nothing).
std::string WebSamplerOptions(const float* settings, uint32_t seed_low, uint32_t seed_high, const int32_t* bias,
                              int n_bias, kvq::SamplerOptions* out);

}  // namespace kvq_web
