// `kvq plan --auto`: a per-layer KV plan (plan/kv_plan.h) chosen from measured fidelity under a
// memory budget. docs/fidelity.md describes it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kvq/kv_spec.h"
#include "kvq/status.h"
#include "measure/fidelity.h"
#include "model/decoder.h"
#include "plan/kv_plan.h"
#include "plan/kv_plan_search.h"  // AutoPlanConfig, AutoPlanResult

namespace kvq {

/// One choice for one tensor in ChooseKvPlan.
struct KvPlanOption {
  int64_t bytes = 0;  ///< the tensor's exact bytes in this option
  double kl = 0;      ///< the damage it adds
};

/// The multiple-choice knapsack: one option per group, minimising Σ kl with Σ bytes ≤ budget, by
/// dynamic programming over bytes in units of their greatest common divisor (exact). When that
/// needs more than kMaxPlanStates states, the unit grows to ⌈budget / kMaxPlanStates⌉ and each
/// option's bytes are rounded up to it: the plan still fits the budget, but may miss the optimum by
/// less than one unit per group. Ties go to fewer bytes, then to the earlier option. Errors when no
/// choice fits, naming the cheapest total.
inline constexpr int64_t kMaxPlanStates = int64_t{1} << 18;
struct KvPlanChoice {
  std::vector<int> option;  ///< per group, the index chosen
  int64_t bytes = 0;        ///< Σ exact bytes of the chosen options
  double kl = 0;            ///< Σ kl of the chosen options
  bool exact = true;        ///< false when bytes were rounded up to a coarser unit
};
Result<KvPlanChoice> ChooseKvPlan(const std::vector<std::vector<KvPlanOption>>& groups, int64_t budget_bytes);

/// Measures every candidate on every tensor (one RunFidelity: 2 · n_layers · candidates arms),
/// chooses with ChooseKvPlan, and runs the chosen plan once more for its measured KL.
Result<AutoPlanResult> AutoPlan(DecoderModel& model, std::span<const int32_t> tokens,
                                const ModelFingerprint& fingerprint, const AutoPlanConfig& config,
                                const std::function<void(const std::string&)>& progress);

}  // namespace kvq
