// `kvq plan --auto` (see kv_plan_auto.h): each tensor's sensitivity to each candidate spec measured
// alone with the teacher-forced harness, then the multiple-choice knapsack over the tensors. The
// predicted KL sums the per-tensor KLs (damage assumed additive); the measured KL is the plan's own
// fidelity run, printed beside it so the assumption can be judged.
#include <fmt/core.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>

#include "measure/kv_plan_auto.h"
#include "model/cache_config.h"

namespace kvq {
namespace {

const char* TensorName(bool value) { return value ? "V" : "K"; }

}  // namespace

Result<KvPlanChoice> ChooseKvPlan(const std::vector<std::vector<KvPlanOption>>& groups, int64_t budget_bytes) {
  if (groups.empty()) return Status::Error("nothing to plan: no tensors");
  int64_t cheapest = 0, unit = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].empty()) return Status::Error(fmt::format("tensor {} has no candidate", g));
    int64_t least = INT64_MAX;
    for (const KvPlanOption& o : groups[g]) {
      if (o.bytes <= 0) return Status::Error(fmt::format("tensor {}: an option of {} bytes", g, o.bytes));
      least = std::min(least, o.bytes);
      unit = std::gcd(unit, o.bytes);
    }
    cheapest += least;
  }
  if (cheapest > budget_bytes) {
    return Status::Error(fmt::format("no choice fits: the cheapest candidates take {} bytes, the budget is {}",
                                     cheapest, budget_bytes));
  }
  // States: bytes spent, in units. Exact with the gcd; else a coarser unit with bytes rounded up.
  KvPlanChoice choice;
  if (budget_bytes / unit > kMaxPlanStates) {
    unit = (budget_bytes + kMaxPlanStates - 1) / kMaxPlanStates;
    choice.exact = false;
  }
  const int64_t states = budget_bytes / unit + 1;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> best(states, kInf), next(states);  // [states]: least Σ kl spending exactly s units
  std::vector<std::vector<int16_t>> pick(groups.size(), std::vector<int16_t>(states, -1));  // [group][states]
  best[0] = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    std::fill(next.begin(), next.end(), kInf);
    for (size_t o = 0; o < groups[g].size(); ++o) {
      const int64_t cost = (groups[g][o].bytes + unit - 1) / unit;
      for (int64_t s = cost; s < states; ++s) {
        const double kl = best[s - cost] + groups[g][o].kl;
        if (kl < next[s]) {  // strict: an earlier option keeps a tie
          next[s] = kl;
          pick[g][s] = static_cast<int16_t>(o);
        }
      }
    }
    best.swap(next);
  }
  int64_t at = 0;
  for (int64_t s = 1; s < states; ++s) {
    if (best[s] < best[at]) at = s;  // strict: fewer bytes keep a tie
  }
  if (best[at] == kInf) return Status::Error("no choice fits the budget once bytes are rounded to the planning unit");
  choice.option.assign(groups.size(), 0);
  choice.kl = best[at];  // summed in group order, as the caller would
  for (size_t g = groups.size(); g-- > 0;) {
    const int o = pick[g][at];
    choice.option[g] = o;
    choice.bytes += groups[g][o].bytes;
    at -= (groups[g][o].bytes + unit - 1) / unit;
  }
  return choice;
}

Result<AutoPlanResult> AutoPlan(DecoderModel& model, std::span<const int32_t> tokens,
                                const ModelFingerprint& fingerprint, const AutoPlanConfig& config,
                                const std::function<void(const std::string&)>& progress) {
  const DecoderConfig& c = model.config();
  // The tensors planned are the cache's: a hybrid's recurrent layers hold no KV.
  const KvShape shape = ModelKvShape(c);
  const std::vector<int32_t> model_layer = ModelLayersOfCache(c);  // [cache layer] for the arms' names
  const int64_t n = static_cast<int64_t>(tokens.size());
  if ((config.budget.kv_bits > 0) == (config.budget.bytes_per_token > 0)) {
    return Status::Error("give one budget: bits per number or bytes per token");
  }
  AutoPlanResult result;
  result.model_layers = model_layer;
  std::vector<KvSpec> candidates;
  for (const KvSpec& spec : config.candidates) {
    if (Status s = CheckKvSpec(spec, shape.row()); !s.ok()) {
      result.skipped.push_back(fmt::format("{}: {}", KvSpecName(spec), s.message()));
    } else if (std::find(candidates.begin(), candidates.end(), spec) == candidates.end()) {
      candidates.push_back(spec);
    }
  }
  if (candidates.empty()) return Status::Error("no candidate spec can store this model's KV rows");
  if (candidates.size() > INT16_MAX) return Status::Error("too many candidates");
  result.budget_bytes = config.budget.Bytes(shape, n);

  // One arm per (layer, K|V, candidate): that tensor in the candidate, every other one f32.
  const FormatDesc* f32 = FindFormat(FormatId::kF32);
  const LayerFormats all_f32{f32, f32};
  FidelityConfig sensitivity;
  for (int64_t l = 0; l < shape.n_layers; ++l) {
    for (const bool value : {false, true}) {
      for (const KvSpec& spec : candidates) {
        std::vector<LayerFormats> layers(static_cast<size_t>(shape.n_layers), all_f32);
        LayerFormats& at = layers[static_cast<size_t>(l)];
        at = value ? LayerFormats::Of(at.Key(), spec) : LayerFormats::Of(spec, at.Value());
        sensitivity.arms.push_back({fmt::format("layer {} {} {}", model_layer[static_cast<size_t>(l)],
                                                TensorName(value), KvSpecName(spec)),
                                    layers});
        const Codec& codec = value ? spec.format->value : spec.format->key;
        const Result<int64_t> bytes = TensorBytesForContext(codec, spec.transforms, shape.row(), n);
        if (!bytes.ok()) return bytes.status();
        result.costs.push_back({.layer = l, .value = value, .spec = spec, .bytes = *bytes});
      }
    }
  }
  Result<FidelityReport> measured = RunFidelity(model, tokens, sensitivity, progress);
  if (!measured.ok()) return measured.status();
  std::vector<std::vector<KvPlanOption>> groups(static_cast<size_t>(2 * shape.n_layers));  // [layer·2 + V]
  for (size_t i = 0; i < result.costs.size(); ++i) {
    KvTensorCost& cost = result.costs[i];
    cost.kl = measured->formats[i].kl;
    cost.top1_agree = measured->formats[i].top1_agree;
    groups[static_cast<size_t>(2 * cost.layer + (cost.value ? 1 : 0))].push_back({cost.bytes, cost.kl});
  }
  const Result<KvPlanChoice> choice = ChooseKvPlan(groups, result.budget_bytes);
  if (!choice.ok()) {
    return Status::Error(fmt::format("budget {} ({} bytes at {} positions): {}", config.budget.Describe(),
                                     result.budget_bytes, n, choice.status().message()));
  }
  result.exact = choice->exact;

  KvPlan& plan = result.plan;
  plan.model = fingerprint;
  plan.positions = n;
  plan.budget = config.budget;
  plan.predicted_kl = choice->kl;
  for (int64_t l = 0; l < shape.n_layers; ++l) {
    const KvSpec& k = candidates[static_cast<size_t>(choice->option[static_cast<size_t>(2 * l)])];
    const KvSpec& v = candidates[static_cast<size_t>(choice->option[static_cast<size_t>(2 * l + 1)])];
    plan.layers.push_back(LayerFormats::Of(k, v));
  }
  const FidelityConfig whole{.arms = {{.name = "plan", .layers = plan.layers}}};
  Result<FidelityReport> run = RunFidelity(model, tokens, whole, progress);
  if (!run.ok()) return run.status();
  result.measured = run->formats[0];
  plan.kv_bytes = result.measured.kv_bytes;
  plan.bits_per_number = result.measured.bits_per_number;
  plan.measured_kl = result.measured.kl;
  if (plan.kv_bytes != choice->bytes) {  // the knapsack's per-tensor sum and the cache's total must agree
    return Status::Error(fmt::format("internal: the plan's bytes {} differ from the chosen tensors' {}", plan.kv_bytes,
                                     choice->bytes));
  }
  return result;
}

}  // namespace kvq
