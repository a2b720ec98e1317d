// KvCache's private state, shared by kv_cache.cc (pages, tiers, attention) and
// kv_cache_snapshot.cc (export / import).
#pragma once

#include <array>
#include <memory>
#include <vector>

#include "cache/page_store.h"
#include "cache/staging.h"
#include "kvq/kv_cache.h"

namespace kvq {

inline int64_t AlignUp64(int64_t x) { return (x + 63) / 64 * 64; }

struct KvCache::Impl {
  struct Layer {
    int64_t positions = 0;
    std::array<CodecArgs, 2> args{};           // K, V (tensor scales)
    std::array<bool, 2> calibrated{false, false};
    std::array<std::vector<float>, 2> residual;  // f32 rows of an incomplete group, K and V
  };

  KvCacheConfig config;
  KvTierPlan plan;
  RowShape row;
  std::vector<LayerFormats> formats;  // per layer
  std::vector<Layer> layers;
  std::vector<int64_t> page_bytes;  // per layer, padded to 64
  int64_t max_pages = 0;
  std::unique_ptr<PageStore> store;
  std::unique_ptr<StagingArena> arena;      // null when resident
  std::unique_ptr<PageStreamer> streamer;   // null when resident
  /// Set by an I/O error that left pages inconsistent; every later call returns it.
  Status broken;
  Status Break(const Status& error);

  const Codec& Key(int64_t l) const { return formats[l].key->key; }
  const Codec& Value(int64_t l) const { return formats[l].value->value; }
  /// Encoded bytes of one tensor (K or V) for a full page.
  int64_t TensorPageBytes(const Codec& codec) const;
  /// Page layout: [K region, padded to 64 bytes][V region].
  int64_t KeyRegionBytes(int64_t layer) const { return AlignUp64(TensorPageBytes(Key(layer))); }
  int64_t PageBytes(int64_t layer) const { return KeyRegionBytes(layer) + TensorPageBytes(Value(layer)); }
  const uint8_t* TensorRegion(const uint8_t* page, int64_t layer, int which) const {
    return which == 0 ? page : page + KeyRegionBytes(layer);
  }
  /// Largest f32 residual (K and V) a layer can hold, in bytes.
  int64_t ResidualBytesMax(int64_t layer) const;
  /// The window for one page: its bytes, and the residual rows when it is the last page.
  KvWindow Window(int64_t layer, int64_t page, const uint8_t* page_data, const float* residual_k,
                  const float* residual_v) const;
};

}  // namespace kvq
