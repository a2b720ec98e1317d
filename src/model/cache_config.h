// The one owner of a model's KV cache configuration: which layers hold KV (a hybrid's attention
// layers only), the recurrent state beside them, the RoPE a "prerope" key spec needs, the page
// size and the checks. The public API (sessions), every measurement and the CLI ask it rather
// than assembling a KvCacheConfig from DecoderConfig by hand.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvq/kv_cache.h"
#include "kvq/kv_memory.h"
#include "kvq/kv_spec.h"
#include "kvq/status.h"
#include "model/decoder_weights.h"

namespace kvq {

/// What a caller chooses about a model's cache; everything else comes from the model.
struct CacheChoice {
  /// One entry used for every layer with KV, or exactly one per such layer
  /// (DecoderConfig::n_attention_layers: a per-layer plan, in cache-layer order).
  std::vector<LayerFormats> layers;
  KvBudgets budgets;
  /// Positions per page: a positive multiple of 32; 0: DefaultPagePositions(max_positions).
  int32_t page_positions = 0;
};

/// The cache of model `c` holding at most `max_positions` positions: n_layers = the layers that
/// attend, state_floats = the recurrent layers' state, key_rope = the model's RoPE; checked
/// (per-layer plan length, page size, specs against the shape, budgets via KvCache::Plan) but not
/// allocated. Errors say what was given and what the model expects.
Result<KvCacheConfig> ModelCacheConfig(const DecoderConfig& c, int64_t max_positions,
                                       const CacheChoice& choice);

/// ModelCacheConfig, then KvCache::Create.
Result<std::unique_ptr<KvCache>> CreateModelCache(const DecoderConfig& c, int64_t max_positions,
                                                  const CacheChoice& choice);

/// The shape of the model's KV rows: its cache layers (a hybrid's attention layers), KV heads
/// and head size — what KV byte counts of the model are computed over.
KvShape ModelKvShape(const DecoderConfig& c);

/// [cache layer] the model layer each cache layer belongs to (the inverse of
/// DecoderConfig::cache_layer over the attention layers): 0, 1, ... for a model without recurrent
/// layers, e.g. 3, 7 for a hybrid whose every fourth layer attends.
std::vector<int32_t> ModelLayersOfCache(const DecoderConfig& c);

}  // namespace kvq
