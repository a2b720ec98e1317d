// SetLogCallback and Log (see include/kvq/log.h): one process-wide callback behind a mutex.
#include "kvq/log.h"

#include <cstdio>
#include <mutex>

namespace kvq {
namespace {

std::mutex& LogMutex() {
  static std::mutex m;
  return m;
}

LogCallback& CurrentCallback() {
  static LogCallback callback;
  return callback;
}

}  // namespace

void SetLogCallback(LogCallback callback) {
  std::lock_guard<std::mutex> lock(LogMutex());
  CurrentCallback() = std::move(callback);
}

void Log(LogLevel level, const std::string& message) {
  std::lock_guard<std::mutex> lock(LogMutex());
  if (CurrentCallback()) {
    CurrentCallback()(level, message);
    return;
  }
  std::fprintf(stderr, "kvq: %s\n", message.c_str());
}

}  // namespace kvq
