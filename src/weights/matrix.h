// A weight matrix as the kernels see it: a type, a layout and a view of its bytes (row-major in a
// mapped file, or repacked at load for the Q4_0/Q8_0 kernels: weights/repack.h).
#pragma once

#include <cstdint>

namespace kvq {

// Values are kvq's own (the registry maps them to ggml ids); declared here for every type the
// registry has or is getting, so type folders can be added independently.
enum class WeightType { kF32, kF16, kBf16, kQ8_0, kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ1_0, kQ2_0, kQ2_K, kQ3_K, kQ4_K, kQ5_K, kQ6_K };
const char* WeightTypeName(WeightType type);

/// How a matrix's blocks are ordered in memory.
enum class MatrixLayout {
  kRowMajor,      ///< rows back to back, each row its blocks in order (the file's layout)
  kInterleaved16,  ///< Q4_0/Q8_0/Q1_0/Q2_0/Q4_K/Q5_K/Q6_K only: groups of 16 rows interleaved per block, the last
                   ///< rows % 16 rows row-major after them (weights/repack.h,
                   ///< weights/kquant_repack.h); the same bytes in all
};

/// A matrix [rows][cols] stored in `type` (block types: whole blocks along a row).
struct Matrix {
  WeightType type = WeightType::kF32;
  const uint8_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  MatrixLayout layout = MatrixLayout::kRowMajor;
};

}  // namespace kvq
