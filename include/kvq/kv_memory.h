// KV-cache memory for a model shape and a format, in exact bytes, and the decode-speed ceiling a
// smaller format can at most buy (docs/design.md §5). `kvq plan` prints these.
#pragma once

#include <cstdint>
#include <span>

#include "kvq/format.h"
#include "kvq/kv_spec.h"
#include "kvq/status.h"

namespace kvq {

/// The attention shape that sizes the KV cache.
struct KvShape {
  int64_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  RowShape row() const { return {.n_kv_heads = n_kv_heads, .head_dim = head_dim}; }
};

/// Steady-state per-position costs (KIVI: complete key groups) and fixed costs.
struct KvMemory {
  int64_t key_bytes_per_layer_position = 0;
  int64_t value_bytes_per_layer_position = 0;
  int64_t bytes_per_layer_position = 0;  ///< K + V, one layer, one position
  int64_t bytes_per_token = 0;           ///< bytes_per_layer_position × n_layers
  int64_t fixed_bytes = 0;               ///< per-tensor state over all layers (fp8: f32 scales)
  double bits_per_number = 0;            ///< K and V averaged
};

/// Validates the shape (positive, storable by the format, no 64-bit overflow) and sizes it.
Result<KvMemory> PlanKvMemory(const FormatDesc& format, KvShape shape);

/// Exact bytes held for `context` positions: every layer's K and V rows (KIVI: complete groups
/// plus the f32 residual of the incomplete one) plus the fixed per-tensor state. Errors on
/// non-positive context or 64-bit overflow.
Result<int64_t> KvBytesForContext(const FormatDesc& format, KvShape shape, int64_t context);

/// Exact bytes of one tensor (one layer's K or V) holding `context` positions in `spec`, where
/// `codec` is the spec format's K or V codec: the blocks of the encoded rows, the f32 residual and
/// sink rows (SpecBytesForRows) and the per-tensor state (TensorStateBytes). Overflow-checked;
/// errors on a negative context.
Result<int64_t> TensorBytesForContext(const Codec& codec, const KvTransforms& transforms, RowShape row,
                                      int64_t context);

/// The same for specs per layer: `layers` holds one LayerFormats for every layer or exactly
/// shape.n_layers of them. Every spec is checked against the shape (CheckKvSpec). With one plain
/// format for all layers this equals KvBytesForContext(format, shape, context).
Result<int64_t> KvBytesForContext(std::span<const LayerFormats> layers, KvShape shape, int64_t context);

/// Bits per number of that cache, counted exactly at `context` positions: 8 · bytes over every K
/// and V number held (2 · n_layers · context · n_kv_heads · head_dim). At a context where KIVI's
/// groups are complete and with no transforms or per-tensor state it equals the formats'
/// BitsPerNumber averaged; sinks, residual rows and fp8's scale make it larger.
Result<double> KvBitsPerNumber(std::span<const LayerFormats> layers, KvShape shape, int64_t context);

/// Upper bound on decode speedup from shrinking KV bytes to a fraction `bytes_ratio` of the
/// reference, when KV is `kv_share` of the bytes a step reads: 1 / (1 − kv_share · (1 − r)).
/// Assumes dequantisation is free (seed 002), so real speedups are lower.
double SpeedupCeiling(double kv_share, double bytes_ratio);

}  // namespace kvq
