// bf16: each number stored as bfloat16 (2 bytes, little-endian).
//
// Block = one row (rows_per_block = 1), 2 bytes per number, no scale:
//   [head 0: x0 x1 ... x(head_dim-1)] [head 1: ...] ... [head n_kv_heads-1: ...]
//   byte offset of (head h, element i) = (h * head_dim + i) * 2
#pragma once

#include "kvq/format.h"

namespace kvq {
const FormatDesc& Bf16Format();
const CodecKernels& Bf16Kernels();  ///< SIMD kernels, best target here
}  // namespace kvq
