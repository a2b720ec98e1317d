// What `kvq plan --auto` measures and returns (measure/kv_plan_auto.h runs the search; the CLI
// prints it through plan_search/auto_plan.h): types over include/ and the plan alone, so the
// commands that print them need not see the model layer the measurement runs on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvq/kv_spec.h"
#include "plan/kv_plan.h"

namespace kvq {

/// One arm's fidelity against the f32 reference over the same positions.
struct FidelityRow {
  std::string format;          ///< FidelityArm::name
  double bits_per_number = 0;  ///< 8 · kv_bytes over every K and V number held (KvBitsPerNumber): exact
                               ///< at `positions`, sinks, residual rows and per-tensor state included
  int64_t kv_bytes = 0;        ///< KvBytesForContext(arm's layers, model shape, positions)
  double memory_vs_f16 = 0;    ///< kv_bytes / KvBytesForContext(f16, model shape, positions)
  double logit_drift = 0;      ///< mean |logit_cand − logit_ref| over positions × vocab
  double kl = 0;               ///< mean over positions of KL(ref ‖ cand) of the softmaxes, nats
  int64_t top1_agree = 0;      ///< positions whose argmax equals the reference's argmax
  int64_t positions = 0;       ///< positions compared (every position of the sequence)
  double ppl = 0;              ///< exp(mean −log p_cand(token p+1)) over positions 0..n−2
};

/// The candidates `kvq plan --auto` tries when none are given (≤ 8-bit elements, with rotation,
/// sinks and residual variants); those the model's shape cannot store are skipped.
std::vector<KvSpec> DefaultKvPlanCandidates();

struct AutoPlanConfig {
  std::vector<KvSpec> candidates;
  KvPlanBudget budget;
};

/// One tensor's sensitivity: the model with only this layer's K (or V) in `spec`, every other
/// tensor f32, against the f32 reference.
struct KvTensorCost {
  int64_t layer = 0;   ///< the cache layer (a hybrid counts its attention layers only)
  bool value = false;  ///< false: K, true: V
  KvSpec spec;
  int64_t bytes = 0;   ///< TensorBytesForContext at the evaluated length
  double kl = 0;       ///< mean KL per position, nats
  int64_t top1_agree = 0;
};

struct AutoPlanResult {
  KvPlan plan;
  std::vector<KvTensorCost> costs;   ///< every measured (layer, K|V, candidate), layer-major
  std::vector<std::string> skipped;  ///< candidates the shape cannot store, with the reason
  int64_t budget_bytes = 0;          ///< KvPlanBudget::Bytes at the evaluated length
  bool exact = true;                 ///< KvPlanChoice::exact
  FidelityRow measured;              ///< the whole plan's fidelity run
  std::vector<int32_t> model_layers;  ///< [cache layer] the model layer it is (a hybrid's attention layers)
};

}  // namespace kvq
