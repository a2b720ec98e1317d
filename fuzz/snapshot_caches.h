// The caches the snapshot fuzz target loads into and the seed corpus saves from: one small shape
// (2 layers x 2 KV heads x head_dim 8, 64 positions) in several K/V specs, so every format family,
// transform (rot, sinkN, resN, prerope) and K/V split is reached.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "kvq/format.h"
#include "kvq/kv_cache.h"
#include "kvq/kv_spec.h"
#include "kvq/rope.h"

namespace kvq::fuzz {

inline constexpr ModelFingerprint kSnapshotModel{.n_layers = 2, .n_kv_heads = 2, .head_dim = 8,
                                                 .weights_hash = 0x6b76712d66757a7aull};  // "kvq-fuzz"

/// K spec, V spec per config; every one is created (a spec that no longer parses is a crash).
inline constexpr std::array<std::array<const char*, 2>, 6> kSnapshotSpecs{{
    {"f32", "f32"},
    {"int4+rot", "int8"},
    {"int2-kivi+sink4+res16", "int4-kivi"},
    {"fp8-e4m3+prerope", "f16+res8"},
    {"bf16+sink2", "fp4-e2m1+rot"},
    {"int8+prerope+sink1+res32", "int2+sink3"},
}};

/// The cache config of kSnapshotSpecs[i], or an error (the caller fails loudly).
inline Result<KvCacheConfig> SnapshotCacheConfig(size_t i) {
  Result<KvSpec> k = ParseKvSpec(kSnapshotSpecs[i][0]);
  if (!k.ok()) return k.status();
  Result<KvSpec> v = ParseKvSpec(kSnapshotSpecs[i][1]);
  if (!v.ok()) return v.status();
  KvCacheConfig c;
  c.n_layers = kSnapshotModel.n_layers;
  c.n_kv_heads = kSnapshotModel.n_kv_heads;
  c.head_dim = kSnapshotModel.head_dim;
  c.layers = {LayerFormats::Of(*k, *v)};
  c.key_rope = RopeConfig{};
  c.max_positions = 64;
  c.page_positions = 32;
  return c;
}

}  // namespace kvq::fuzz
