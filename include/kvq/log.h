// Where kvq's diagnostics go. The library prints nothing itself except through this callback:
// by default messages go to stderr as "kvq: <message>"; an embedding application installs its own
// callback (or one that drops everything) before loading a model.
#pragma once

#include <functional>
#include <string>

namespace kvq {

enum class LogLevel { kInfo = 0, kWarning = 1, kError = 2 };

/// Receives every diagnostic: a level and one line of text without a trailing newline.
using LogCallback = std::function<void(LogLevel level, const std::string& message)>;

/// Installs `callback` for the whole process (empty: back to the default stderr printer).
/// Thread-safe. The callback may be called from any thread kvq runs on, possibly concurrently,
/// and may call into kvq (even SetLogCallback); a call already under way may still use the
/// previous callback for a moment after SetLogCallback returns.
void SetLogCallback(LogCallback callback);

/// Sends one message to the current callback.
void Log(LogLevel level, const std::string& message);

}  // namespace kvq
