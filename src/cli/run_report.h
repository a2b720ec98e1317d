// What `kvq run` and `kvq chat` say on stderr around a generation: the banner after loading, and
// the prompt's progress while a long one runs (the core reports blocks through
// GenerateRequest::on_prompt_progress; this only draws).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "kvq/model.h"
#include "kvq/session.h"

namespace kvq::cli {

/// One line: the file, architecture, parameters, weight types, layers, context, the KV specs and
/// their bytes per position, threads and SIMD target; e.g. "kvq run: model.gguf: llama, 1.24B
/// parameters (q4_0 96%, q6_k 4%), 16 layers, context 4096 of 131072; KV int4+rot, 12,345 bytes
/// per token; 8 threads, AVX2".
std::string ModelBanner(const std::string& command, const Model& model, const Session& session,
                        const std::string& kv_name);

/// "[########      ]": `fraction` of `width` cells filled (clamped to [0, 1]).
std::string ProgressBar(double fraction, int width = 30);

/// Draws a prompt's progress on stderr: nothing until `delay` has passed (a short prompt says
/// nothing); then, on a terminal, a bar redrawn in place at most every 0.1 s and erased at the
/// end; elsewhere (a file, a pipe) a line every `line_interval`.
class PromptProgress {
 public:
  using Clock = std::chrono::steady_clock;
  PromptProgress(std::string command, bool terminal, Clock::duration delay = std::chrono::seconds(1),
                 Clock::duration line_interval = std::chrono::seconds(3));
  /// What GenerateRequest::on_prompt_progress is given: tokens held now, the prompt's tokens.
  void Update(int64_t held, int64_t total);
  /// The prompt is done (or stopped): a drawn bar is erased (its line is then free for the reply),
  /// and the next Update starts another prompt's clock.
  void Finish();

 private:
  std::string command_;
  bool terminal_;
  Clock::duration delay_, line_interval_;
  Clock::time_point start_ = Clock::now(), last_{};
  int64_t first_held_ = -1;  // held at the first call: the reused part, not counted in the rate
  bool drawn_ = false;       // a bar is on the terminal's current line
};

}  // namespace kvq::cli
