// What the WebAssembly shim's files share: the last error (kvq_web_last_error) and handles.
#pragma once

#include <cstdint>
#include <string>

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

}  // namespace kvq_web
