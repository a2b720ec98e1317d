// Per-layer KV plans: a KV spec for each layer's K and V, and the plan file that `kvq run`,
// `kvq serve`, `kvq eval fidelity` and others take with --kv-plan (a runtime input, so it sits
// below the measurements: `kvq plan --auto` chooses plans in measure/kv_plan_auto.h and writes
// them here). docs/fidelity.md describes both.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvq/kv_cache.h"
#include "kvq/kv_memory.h"
#include "kvq/kv_spec.h"
#include "kvq/status.h"

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

}  // namespace kvq
