// `kvq plan --auto`'s entry over the public API: the automatic plan search (measure/kv_plan_auto.h)
// on a loaded Model. This header is over include/ and plan/ alone, so the CLI calls it without
// seeing the model layer the measurement runs on (linked privately, as synth/ links its writers).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "kvq/model.h"
#include "kvq/status.h"
#include "plan/kv_plan_search.h"

namespace kvq {

/// Measures every candidate of `config` on every K and V tensor of `model` over `tokens`
/// (2 ≤ n ≤ the model's trained context), chooses the plan within the budget and measures it:
/// AutoPlan on a forward pass of the model's own weights, with ModelInfo::threads threads (the
/// numbers do not depend on them). `progress` (may be empty) gets one line per measured arm.
Result<AutoPlanResult> AutoPlanModel(const Model& model, std::span<const int32_t> tokens,
                                     const AutoPlanConfig& config,
                                     const std::function<void(const std::string&)>& progress);

}  // namespace kvq
