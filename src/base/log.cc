// SetLogCallback and Log (see include/kvq/log.h): one process-wide callback behind a mutex, copied
// out of it before the call so that a callback may itself log or install another.
#include "kvq/log.h"

#include <cstdio>
#include <memory>
#include <mutex>

namespace kvq {
namespace {

std::mutex& LogMutex() {
  static std::mutex m;
  return m;
}

std::shared_ptr<const LogCallback>& CurrentCallback() {
  static std::shared_ptr<const LogCallback> callback;
  return callback;
}

}  // namespace

void SetLogCallback(LogCallback callback) {
  std::shared_ptr<const LogCallback> next =
      callback ? std::make_shared<const LogCallback>(std::move(callback)) : nullptr;
  std::lock_guard<std::mutex> lock(LogMutex());
  CurrentCallback() = std::move(next);
}

void Log(LogLevel level, const std::string& message) {
  std::shared_ptr<const LogCallback> callback;
  {
    std::lock_guard<std::mutex> lock(LogMutex());
    callback = CurrentCallback();
  }
  if (callback) {
    (*callback)(level, message);
    return;
  }
  std::fprintf(stderr, "kvq: %s\n", message.c_str());
}

}  // namespace kvq
