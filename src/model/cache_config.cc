// ModelCacheConfig and the model's KV shape (see cache_config.h).
#include "model/cache_config.h"

#include <fmt/format.h>

#include "model/decoder.h"

namespace kvq {

Result<KvCacheConfig> ModelCacheConfig(const DecoderConfig& c, int64_t max_positions,
                                       const CacheChoice& choice) {
  const int32_t attending = c.n_attention_layers();
  if (choice.layers.empty()) return Status::Error("no KV spec given for the cache's layers");
  if (choice.layers.size() != 1 && static_cast<int64_t>(choice.layers.size()) != attending) {
    return Status::Error(fmt::format(
        "the per-layer plan has {} entries; the model has {} layers{} (give one per layer, or one "
        "for all)",
        choice.layers.size(), attending,
        attending < c.n_layers
            ? fmt::format(" that attend (its other {} are recurrent)", c.n_layers - attending)
            : ""));
  }
  if (choice.page_positions < 0 || choice.page_positions % 32 != 0) {
    return Status::Error(fmt::format(
        "page_positions must be 0 or a positive multiple of 32 (got {})", choice.page_positions));
  }
  // A hybrid model's cache holds its attention layers and its recurrent layers' fixed state.
  KvCacheConfig config{.n_layers = attending,
                       .n_kv_heads = c.n_kv_heads,
                       .head_dim = c.head_dim(),
                       .layers = choice.layers,
                       .key_rope = ModelRopeConfig(c),
                       .max_positions = max_positions,
                       .page_positions = choice.page_positions > 0
                                             ? choice.page_positions
                                             : DefaultPagePositions(max_positions),
                       .budgets = choice.budgets,
                       .state_floats = c.state_floats()};
  if (Result<KvTierPlan> plan = KvCache::Plan(config); !plan.ok()) return plan.status();
  return config;
}

Result<std::unique_ptr<KvCache>> CreateModelCache(const DecoderConfig& c, int64_t max_positions,
                                                  const CacheChoice& choice) {
  Result<KvCacheConfig> config = ModelCacheConfig(c, max_positions, choice);
  if (!config.ok()) return config.status();
  return KvCache::Create(*config);
}

KvShape ModelKvShape(const DecoderConfig& c) {
  return {.n_layers = c.n_attention_layers(), .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim()};
}

std::vector<int32_t> ModelLayersOfCache(const DecoderConfig& c) {
  std::vector<int32_t> layers;  // [cache layer] model layer
  for (int32_t l = 0; l < c.n_layers; ++l) {
    if (!c.is_recurrent(l)) layers.push_back(l);
  }
  return layers;
}

}  // namespace kvq
