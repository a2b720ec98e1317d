// What the WebAssembly shim's files share: the last error (kvq_web_last_error), handles and the
// loaded model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kvq/model.h"

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
  std::unique_ptr<kvq::Model> model;
  int64_t file_bytes = 0;
  std::string info_json;
  std::string gpu_program_json;  // kvq_web_gpu_program's answer, kept while the model lives
};

inline WebModel* ModelOf(int handle) { return reinterpret_cast<WebModel*>(static_cast<intptr_t>(handle)); }

}  // namespace kvq_web
