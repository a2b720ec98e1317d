// Per-layer KV plans (issue 15 item 4): a KV spec for each layer's K and V, chosen from measured
// fidelity under a memory budget by `kvq plan --auto`, and the plan file that `kvq run`,
// `kvq eval fidelity` and others take with --kv-plan. docs/fidelity.md describes both.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvq/kv_cache.h"
#include "kvq/kv_memory.h"
#include "kvq/kv_spec.h"
#include "kvq/status.h"
#include "measure/fidelity.h"
#include "model/decoder.h"

namespace kvq {

/// What a plan may spend. Exactly one of the two is set (> 0). Both are counted exactly at the
/// plan's evaluated length (KvPlan::positions): every byte the cache holds there — blocks, f32
/// residual and sink rows, per-tensor state.
struct KvPlanBudget {
  double kv_bits = 0;           ///< average bits per number over every K and V number held
  int64_t bytes_per_token = 0;  ///< KV bytes (all layers, K + V) divided by the positions held
  /// The budget in bytes of a cache of `shape` holding `positions`: ⌊kv_bits · numbers / 8⌋ or
  /// bytes_per_token · positions.
  int64_t Bytes(KvShape shape, int64_t positions) const;
  /// "4.5 bits per number" or "1,200 bytes per token".
  std::string Describe() const;
};

/// A plan: one LayerFormats per layer for one model, with what it was chosen under.
struct KvPlan {
  ModelFingerprint model;
  int64_t positions = 0;  ///< the length its bytes and KL were counted at
  KvPlanBudget budget;
  std::vector<LayerFormats> layers;  ///< exactly model.n_layers
  int64_t kv_bytes = 0;              ///< KvBytesForContext(layers, shape, positions)
  double bits_per_number = 0;        ///< KvBitsPerNumber(layers, shape, positions)
  double predicted_kl = 0;  ///< Σ over tensors of the KL measured with that tensor alone in its spec
  double measured_kl = 0;   ///< KL of the whole plan, measured in one more fidelity run
};

/// The plan file: {"kvq_plan": 1, "model": {n_layers, n_kv_heads, head_dim, weights_hash (16 hex
/// digits)}, "positions", "budget": {"kv_bits"} or {"bytes_per_token"}, "layers": [{"k": SPEC,
/// "v": SPEC}, ...], "kv_bytes", "bits_per_number", "predicted_kl", "measured_kl"}.
std::string KvPlanJson(const KvPlan& plan);
/// Parses a plan file's text; the error says what was missing, malformed or unknown (a spec names
/// its layer). Checks only the file itself: CheckKvPlanModel checks it against a model.
Result<KvPlan> ParseKvPlan(std::string_view json);
/// Refuses a plan for another model: another shape or weights hash (both described), or a layer
/// list whose length is not the model's layer count.
Status CheckKvPlanModel(const KvPlan& plan, const ModelFingerprint& model);
/// Refuses a plan whose bits per number, recounted at its positions, exceed max_bits.
Status CheckKvPlanBits(const KvPlan& plan, double max_bits);
/// Reads, parses and checks a plan file against `model`; every error starts with the path.
Result<KvPlan> ReadKvPlan(const std::string& path, const ModelFingerprint& model);
/// Writes KvPlanJson(plan) to path.
Status WriteKvPlan(const std::string& path, const KvPlan& plan);

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
};

/// Measures every candidate on every tensor (one RunFidelity: 2 · n_layers · candidates arms),
/// chooses with ChooseKvPlan, and runs the chosen plan once more for its measured KL.
Result<AutoPlanResult> AutoPlan(DecoderModel& model, std::span<const int32_t> tokens,
                                const ModelFingerprint& fingerprint, const AutoPlanConfig& config,
                                const std::function<void(const std::string&)>& progress);

}  // namespace kvq
