// `kvq eval attention`'s entry over the public API: attention error vs context per KV spec
// (measure/attention_error.h) on a loaded Model's captured q, K, V, or on synthetic rows. This
// header is over include/ and measure_report/ alone, so the CLI calls it without seeing the model
// layer the measurement runs on (measure/ linked privately, as plan_search/ links it).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvq/model.h"
#include "kvq/status.h"
#include "measure_report/attention_error_report.h"

namespace kvq {

/// [attention layer] the model layer index of each layer with a KV cache, ascending: 0, 1, ... for
/// a model without recurrent layers (ModelLayersOfCache).
std::vector<int32_t> AttentionLayersOf(const Model& model);

/// The ids model rows run on for `text` (MakeAttentionTextInput on the model's vocabulary).
AttentionTextInput AttentionTextOf(const Model& model, std::string_view text, int64_t n);

/// Model rows: MeasureModelAttentionError on a forward pass of the model's own weights
/// (ModelInfo::threads threads). `progress` (may be empty) gets a line per stage.
Result<AttentionErrorReport> EvalModelAttentionError(const Model& model, std::span<const int32_t> tokens,
                                                     const AttentionErrorConfig& config,
                                                     const std::function<void(const std::string&)>& progress);

/// Synthetic rows: MeasureSyntheticAttentionError (no model).
Result<AttentionErrorReport> EvalSyntheticAttentionError(const SyntheticShape& shape, uint64_t seed,
                                                         const AttentionErrorConfig& config,
                                                         const std::function<void(const std::string&)>& progress);

}  // namespace kvq
