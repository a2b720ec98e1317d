// `kvq eval fidelity`: what each KV format does to a real model's predictions, teacher-forced
// (seeds 002 and 004, docs/design.md §5). One token sequence goes through the model twice per format —
// once with an f32 cache (the reference), once with the candidate format for K and V — one decode
// step per token, and the logits are compared at every position. Free-run divergence (let both
// arms generate and see where they part) is greedy chaos, not a fidelity number, and is not measured.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvq/format.h"
#include "kvq/kv_spec.h"
#include "kvq/status.h"
#include "model/decoder.h"
#include "plan/kv_plan_search.h"  // FidelityRow
#include "text/tokenizer.h"

namespace kvq {

/// One candidate cache: KV specs per layer (K and V each a format plus transforms).
struct FidelityArm {
  std::string name;                  ///< the row's name: a spec's canonical text, or a plan's
  std::vector<LayerFormats> layers;  ///< one for every layer, or one per cache layer
                                     ///< (a hybrid's attention layers: ModelKvShape)
  /// The arm of one spec for K and V of every layer, named by its canonical text.
  static FidelityArm Uniform(const KvSpec& spec);
  static FidelityArm Uniform(const FormatDesc* format) { return Uniform(KvSpec{format, {}}); }
};

struct FidelityConfig {
  /// Candidate caches. f32 with no transforms may be one of them: it is then compared with the
  /// reference run and must come out identical.
  std::vector<FidelityArm> arms;
};

struct FidelityReport {
  int64_t positions = 0;     ///< tokens run, BOS included
  double reference_ppl = 0;  ///< the same perplexity under the f32 reference
  std::vector<FidelityRow> formats;  ///< in FidelityConfig::arms order
};

/// The token sequence a fidelity run feeds: `text` encoded with BOS first when the vocabulary
/// asks for one, cut to the first `context` ids.
struct FidelityInput {
  std::vector<int32_t> tokens;
  int64_t full_count = 0;  ///< ids the whole text gives; > tokens.size() when it was cut
};
FidelityInput MakeFidelityInput(const Tokenizer& tokenizer, std::string_view text, int64_t context);

/// Runs `tokens` (2 ≤ n ≤ the model's seq_len, each id < vocab_size) through an f32 reference
/// cache and then through a cache of each arm, one Forward per token, and compares the
/// logits position by position. Softmax, KL and perplexity are computed in double. The result
/// does not depend on the model's thread count. `progress` (may be empty) gets one line per arm.
Result<FidelityReport> RunFidelity(DecoderModel& model, std::span<const int32_t> tokens,
                                   const FidelityConfig& config,
                                   const std::function<void(const std::string&)>& progress);

/// What the memory-vs-damage scatter puts on its y axis.
enum class FidelityPlotMetric { kKl, kLogitDrift };

struct FidelityPlotOptions {
  std::string output;  ///< ".png" or ".svg" (case-insensitive); the extension picks the terminal
  FidelityPlotMetric metric = FidelityPlotMetric::kKl;
  std::string title;   ///< first title line, e.g. the model and text
};

/// Ok when `output` ends in .png or .svg (case-insensitive), else an error naming it.
Status CheckFidelityPlotPath(const std::string& output);

/// A gnuplot script drawing one labelled point per format: x = % of f16 memory, y = KL or logit
/// drift on a log axis. A format whose y is 0 (f32 is identical to the reference) cannot sit on a
/// log axis; it is named in a note on the plot instead. Errors on another extension, or when no
/// format has a y above 0.
Result<std::string> FidelityPlotScript(const FidelityReport& report, const FidelityPlotOptions& options);

}  // namespace kvq
