#include "cli/hub_flag.h"

#include <fmt/core.h>
#include <unistd.h>

#include <chrono>
#include <memory>

#include "cli/commands.h"
#include "cli/run_report.h"
#include "kvq/units.h"

namespace kvq::cli {
namespace {

// The state one download's messages keep between progress calls.
struct ProgressLine {
  std::string command;
  bool terminal = false;
  std::chrono::steady_clock::time_point start, last;
  int64_t first_held = 0;  // bytes held when this transfer began (a resume's)
  bool finished = false;   // the 100% line is out (libcurl reports the end more than once)
};

// Redrawn every 0.1 s on a terminal; a line every 5 s to a file or pipe (a CI log stays short).
void Draw(ProgressLine& p, int64_t held, int64_t total) {
  const auto now = std::chrono::steady_clock::now();
  const bool done = total > 0 && held >= total;
  if (p.finished) return;
  p.finished = done;
  if (!done &&
      now - p.last < (p.terminal ? std::chrono::milliseconds(100) : std::chrono::seconds(5)))
    return;
  p.last = now;
  const double seconds = std::chrono::duration<double>(now - p.start).count();
  const double rate = seconds > 0 ? (held - p.first_held) / seconds : 0;
  const std::string of_total =
      total > 0 ? fmt::format(" of {} ({:.0f}%)", FormatBytesIec(total), 100.0 * held / total) : "";
  const std::string text = fmt::format("{}{} at {}/s", FormatBytesIec(held), of_total,
                                       FormatBytesIec(static_cast<int64_t>(rate)));
  if (p.terminal) {
    const double fraction = total > 0 ? static_cast<double>(held) / static_cast<double>(total) : 0;
    fmt::print(stderr, "\r{} {}\x1b[K", ProgressBar(fraction), text);
    if (done) fmt::print(stderr, "\n");
  } else {
    fmt::print(stderr, "kvq {}: {}\n", p.command, text);
  }
}

}  // namespace

CLI::Option* AddHfRepoFlag(CLI::App* cmd, SharedOptions* o) {
  return cmd
      ->add_option(
          "--hf-repo", o->hf_repo,
          "(also -hf) A GGUF from a Hugging Face repository, user/name[:quant] (default quant "
          "Q4_K_M); downloaded into the Hugging Face cache when missing (kvq pull)")
      ->check(CLI::Validator(
          [](std::string& s) {
            const Result<hub::RepoRef> r = hub::ParseRepoRef(s);
            return r.ok() ? std::string() : r.status().message();
          },
          ""))
      ->type_name("USER/NAME[:QUANT]");
}

hub::PullEvents DownloadMessages(const std::string& command, bool quiet) {
  if (quiet) return {};
  auto line = std::make_shared<ProgressLine>(
      ProgressLine{.command = command, .terminal = isatty(STDERR_FILENO) != 0});
  hub::PullEvents events;
  events.on_download = [line](const std::string& file, int64_t bytes, int64_t held) {
    line->start = line->last = std::chrono::steady_clock::now();
    line->first_held = held;
    line->finished = false;
    fmt::print(stderr, "kvq {}: downloading {} ({}){}\n", line->command, file,
               FormatBytesIec(bytes),
               held > 0 ? fmt::format(", asking for the rest after the {} bytes already held",
                                      FormatCount(held))
                        : "");
  };
  events.on_progress = [line](int64_t held, int64_t total) { Draw(*line, held, total); };
  return events;
}

int ResolveModelFlag(const std::string& command, SharedOptions* o) {
  if (o->hf_repo.empty()) return 0;
  if (!o->model.empty()) {
    return BadInput(command, fmt::format("-m {} and -hf {} both name the model: give one", o->model,
                                         o->hf_repo));
  }
  const Result<hub::RepoRef> ref = hub::ParseRepoRef(o->hf_repo);
  if (!ref.ok()) return BadInput(command, "-hf: " + ref.status().message());
  const hub::HubOptions hub_options = hub::HubOptionsFromEnv();
  Result<hub::PullResult> pulled =
      hub::PullGguf(*ref, hub_options, DownloadMessages(command, false));
  if (!pulled.ok()) {
    fmt::print(stderr, "kvq {}: error: -hf {}\n", command, pulled.status().message());
    return 1;
  }
  if (!pulled->offline_reason.empty()) {
    fmt::print(stderr, "kvq {}: using the cached {} ({})\n", command, pulled->model.path,
               pulled->offline_reason);
  } else if (pulled->downloaded) {
    fmt::print(stderr, "kvq {}: saved {}\n", command, pulled->model.path);
  }
  o->model = pulled->model.path;
  return 0;
}

}  // namespace kvq::cli
