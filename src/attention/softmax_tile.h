// The format-independent middle of the SIMD attention kernel: turns a tile of raw q·k dot
// products into the online-softmax factors c (rescale of the old state) and e (weight of the new
// position), and advances m and l. Dispatched once per AttendWindows call.
#pragma once

#include <cstdint>

namespace kvq::attention_internal {

/// For each of n_q heads: scores[h·kMaxTileRows + i], i < n, are raw dot products; on return
/// c[h·kMaxTileRows + i] and e[...] hold the factors for position i, and m[h], l[h] the state
/// after the tile. All kMaxTileRows lanes go through the same vector exp whatever n is.
using SoftmaxTileFn = void (*)(float* scores, float* c, int32_t n_q, int32_t n, float scale,
                               float softcap, float* m, float* l);

SoftmaxTileFn SoftmaxTileForThisCpu();

}  // namespace kvq::attention_internal
