// The banner and the prompt progress of kvq run and kvq chat (see run_report.h).
#include "cli/run_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "kvq/units.h"

namespace kvq::cli {
namespace {

// 260K, 1.24B: three significant digits and a suffix.
std::string ShortCount(int64_t n) {
  const double x = static_cast<double>(n);
  if (x >= 1e9) return fmt::format("{:.3g}B", x / 1e9);
  if (x >= 1e6) return fmt::format("{:.3g}M", x / 1e6);
  if (x >= 1e3) return fmt::format("{:.3g}K", x / 1e3);
  return std::to_string(n);
}

}  // namespace

std::string ModelBanner(const std::string& command, const Model& model, const Session& session,
                        const std::string& kv_name) {
  const ModelInfo& info = model.info();
  const int64_t context = session.context();
  // The whole cache at full context over its positions: each position's K and V in every layer.
  const int64_t per_token = context > 0 ? session.kv_plan().total_bytes / context : 0;
  const std::string state = info.state_bytes > 0 ? fmt::format(" (plus {} of recurrent state)",
                                                               FormatBytesIec(info.state_bytes))
                                                 : "";
  return fmt::format(
      "kvq {}: {}: {}, {} parameters ({}), {} layers, context {}{}; KV {}, {} bytes per token{}; {} thread{}, {}\n",
      command, std::filesystem::path(info.path).filename().string(), info.architecture, ShortCount(info.parameters),
      info.weight_types, info.n_layers, context,
      context == info.trained_context ? "" : fmt::format(" of {}", info.trained_context), kv_name,
      FormatCount(per_token), state, session.threads(), session.threads() == 1 ? "" : "s", info.simd_target);
}

std::string ProgressBar(double fraction, int width) {
  const int filled = static_cast<int>(std::clamp(fraction, 0.0, 1.0) * width);
  // fmt, not "[" + std::string(...): g++ 12 warns -Wrestrict on that (a false positive, GCC PR 105329).
  return fmt::format("[{}{}]", std::string(static_cast<size_t>(filled), '#'),
                     std::string(static_cast<size_t>(width - filled), ' '));
}

PromptProgress::PromptProgress(std::string command, bool terminal, Clock::duration delay,
                               Clock::duration line_interval)
    : command_(std::move(command)), terminal_(terminal), delay_(delay), line_interval_(line_interval) {}

void PromptProgress::Update(int64_t held, int64_t total) {
  const Clock::time_point now = Clock::now();
  if (start_ == Clock::time_point{}) start_ = now;  // the next prompt after Finish
  if (first_held_ < 0) first_held_ = held;
  if (now - start_ < delay_ || held >= total) return;  // the end is the stats line's to say
  if (drawn_ || last_ != Clock::time_point{}) {
    if (now - last_ < (terminal_ ? std::chrono::milliseconds(100) : line_interval_)) return;
  }
  last_ = now;
  const double seconds = std::chrono::duration<double>(now - start_).count();
  const double rate = seconds > 0 ? static_cast<double>(held - first_held_) / seconds : 0;
  const std::string text = fmt::format("prompt {}/{} tokens ({:.0f}%) at {:.1f} tok/s", held, total,
                                       100.0 * static_cast<double>(held) / static_cast<double>(total), rate);
  if (terminal_) {
    fmt::print(stderr, "\r{} {}\x1b[K", ProgressBar(static_cast<double>(held) / static_cast<double>(total)), text);
    drawn_ = true;
  } else {
    fmt::print(stderr, "kvq {}: {}\n", command_, text);
  }
  std::fflush(stderr);
}

void PromptProgress::Finish() {
  if (drawn_) fmt::print(stderr, "\r\x1b[K");
  drawn_ = false;
  start_ = last_ = Clock::time_point{};  // ready for another prompt (kvq chat's next turn)
  first_held_ = -1;
}

}  // namespace kvq::cli
