// f32: each number stored as IEEE f32 (4 bytes, little-endian).
//
// Block = one row (rows_per_block = 1), 4 bytes per number, no scale:
//   [head 0: x0 x1 ... x(head_dim-1)] [head 1: ...] ... [head n_kv_heads-1: ...]
//   byte offset of (head h, element i) = (h * head_dim + i) * 4
#pragma once

#include "kvq/format.h"

namespace kvq {
const FormatDesc& F32Format();
const CodecKernels& F32Kernels();  ///< SIMD kernels, best target here
}  // namespace kvq
