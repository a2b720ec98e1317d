// Byte accounting and shape checks shared by every format (declared in kvq/format.h).
#include <fmt/format.h>

#include <atomic>

#include "kvq/format.h"

namespace kvq {
namespace {
std::atomic<ScoreArithmetic> score_arithmetic{ScoreArithmetic::kInteger};
}  // namespace

void SetScoreArithmetic(ScoreArithmetic arithmetic) {
  score_arithmetic.store(arithmetic, std::memory_order_relaxed);
}
ScoreArithmetic GetScoreArithmetic() { return score_arithmetic.load(std::memory_order_relaxed); }
const char* ScoreArithmeticName(ScoreArithmetic arithmetic) {
  return arithmetic == ScoreArithmetic::kInteger ? "int" : "f32";
}

Status CheckShape(const FormatDesc& format, RowShape shape) {
  if (shape.n_kv_heads <= 0 || shape.head_dim <= 0) {
    return Status::Error(fmt::format("KV heads and head_dim must be positive (got {} and {})",
                                     shape.n_kv_heads, shape.head_dim));
  }
  if (shape.head_dim > kMaxHeadDim) {
    return Status::Error(
        fmt::format("head_dim {} is larger than kvq's limit of {}", shape.head_dim, kMaxHeadDim));
  }
  for (const Codec* codec : {&format.key, &format.value}) {
    const std::string why = codec->check_shape(shape);
    if (!why.empty()) {
      return Status::Error(fmt::format("format {} cannot store {} KV heads x head_dim {}: {}",
                                       format.name, shape.n_kv_heads, shape.head_dim, why));
    }
  }
  return Status::Ok();
}

int64_t BytesForRows(const Codec& codec, RowShape shape, int64_t n_rows) {
  const int64_t full_blocks = n_rows / codec.rows_per_block;
  const int64_t residual_rows = n_rows % codec.rows_per_block;  // held in f32 until complete
  return full_blocks * codec.block_bytes(shape) + residual_rows * shape.elems() * 4;
}

double BitsPerNumber(const Codec& codec, RowShape shape) {
  return 8.0 * static_cast<double>(codec.block_bytes(shape)) /
         (static_cast<double>(codec.rows_per_block) * static_cast<double>(shape.elems()));
}

int64_t TensorStateBytes(const Codec& codec) { return codec.calibrated ? 4 : 0; }

}  // namespace kvq
