// What a fidelity measurement is given and what it reports, over include/ and plan/ alone, so
// measure/ (which runs them on the model layer) and its clients (the CLI, through
// fidelity_eval/fidelity_eval.h) share one definition: the arms of `kvq eval fidelity` and its
// report and plot, and the llama.cpp comparison's statistics (measure/kl_divergence.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvq/format.h"
#include "kvq/kv_spec.h"
#include "kvq/status.h"
#include "plan/kv_plan_search.h"  // FidelityRow

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

// The llama.cpp comparison (measure/kl_divergence.h): llama-perplexity --kl-divergence's statistics.

struct ValueWithError {
  double value = 0;
  double error = 0;  ///< llama.cpp's ± (a standard error; 0 below 11 positions)
};

/// A point of a sorted distribution: "max", "99.9%", ..., "median", ..., "min".
struct Quantile {
  std::string name;
  double fraction = 0;
  double value = 0;
};

/// llama.cpp's "Perplexity", "KL divergence" and "Token probability" statistics over positions.
struct KlSummary {
  int64_t count = 0;
  ValueWithError ppl, ppl_base;       ///< exp(mean nll), exp(mean nll_base)
  ValueWithError ln_ppl_ratio;        ///< mean nll − mean nll_base
  ValueWithError ppl_ratio;           ///< PPL / PPL(base)
  ValueWithError ppl_diff;            ///< PPL − PPL(base)
  double ln_ppl_correlation = 0;      ///< Cor(nll, nll_base) over positions (0 below 10 positions)
  ValueWithError kl;                  ///< mean KL, nats
  std::vector<Quantile> kl_quantiles;      ///< max, 99.9, 99, 95, 90, median, 10, 5, 1, 0.1 %, min
  ValueWithError p_diff;                   ///< mean Δp (a fraction; llama.cpp prints percent)
  std::vector<Quantile> p_diff_quantiles;  ///< as kl_quantiles plus 75 % and 25 %
  ValueWithError p_diff_rms;               ///< sqrt(mean Δp²)
  ValueWithError same_top;                 ///< the share of positions whose top-1 agrees
  int64_t same_top_count = 0;
};
struct KlReport {
  int32_t n_ctx = 0, n_chunk = 0;
  int64_t positions = 0;  ///< scored positions: n_chunk·(n_ctx − 1 − n_ctx/2)
  double ppl = 0;         ///< kvq's perplexity over the scored positions
  bool compared = false;  ///< a base file was given: `summary` holds the comparison
  KlSummary summary;
};

}  // namespace kvq
