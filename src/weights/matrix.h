// A weight matrix as the kernels see it: a type and a view of row-major bytes in a mapped file.
#pragma once

#include <cstdint>

namespace kvq {

enum class WeightType { kF32, kF16, kBf16, kQ8_0, kQ4_0 };
const char* WeightTypeName(WeightType type);

/// A row-major matrix [rows][cols] stored in `type` (block types: blocks of 32 along a row).
struct Matrix {
  WeightType type = WeightType::kF32;
  const uint8_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};

}  // namespace kvq
