// RowSequence (see row_sequence.h).
#include "formats/row_sequence.h"

#include <algorithm>
#include <cassert>

namespace kvq {

RowSequence::RowSequence(const Codec& codec, RowShape shape)
    : codec_(codec), shape_(shape), args_{.shape = shape} {}

void RowSequence::Append(const float* rows, int64_t n) {
  const int64_t elems = shape_.elems();
  if (codec_.calibrated && !calibrated_ && n > 0) {
    args_.tensor_scale = codec_.calibrate(rows, n * elems);
    calibrated_ = true;
  }
  const int64_t block_bytes = codec_.block_bytes(shape_);
  for (int64_t r = 0; r < n; ++r) {
    residual_.insert(residual_.end(), rows + r * elems, rows + (r + 1) * elems);
    if (residual_rows() == codec_.rows_per_block) {
      const size_t at = blocks_.size();
      blocks_.resize(at + block_bytes);
      codec_.encode_block(residual_.data(), blocks_.data() + at, args_);
      residual_.clear();
    }
  }
  n_rows_ += n;
}

RowsView RowSequence::View(int64_t first, int64_t n) const {
  assert(first >= 0 && n >= 0 && first + n <= n_rows_);
  const int64_t in_blocks = n_rows_ - residual_rows();
  RowsView v;
  v.codec = &codec_;
  v.args = args_;
  v.blocks = blocks_.data();
  v.first_row = first;
  v.n_block_rows = std::clamp<int64_t>(in_blocks - first, 0, n);
  v.residual = residual_.data() + std::max<int64_t>(first - in_blocks, 0) * shape_.elems();
  v.n_rows = n;
  return v;
}

void RowSequence::DecodeRow(int64_t p, float* out) const {
  assert(p >= 0 && p < n_rows_);
  const int64_t in_blocks = n_rows_ - residual_rows();
  if (p >= in_blocks) {
    const float* x = residual_.data() + (p - in_blocks) * shape_.elems();
    for (int64_t i = 0; i < shape_.elems(); ++i) out[i] = x[i];
    return;
  }
  const int64_t block = p / codec_.rows_per_block;
  codec_.decode_row(blocks_.data() + block * codec_.block_bytes(shape_),
                    static_cast<int32_t>(p % codec_.rows_per_block), out, args_);
}

float RowSequence::Dot(const float* q, int64_t p, int32_t head) const {
  const int64_t in_blocks = n_rows_ - residual_rows();
  if (p >= in_blocks) {
    const float* x = residual_.data() + (p - in_blocks) * shape_.elems() +
                     static_cast<int64_t>(head) * shape_.head_dim;
    float sum = 0.0f;
    for (int32_t i = 0; i < shape_.head_dim; ++i) sum += q[i] * x[i];
    return sum;
  }
  return codec_.dot(q, blocks_.data() + p / codec_.rows_per_block * codec_.block_bytes(shape_),
                    static_cast<int32_t>(p % codec_.rows_per_block), head, args_);
}

void RowSequence::Axpy(float w, int64_t p, int32_t head, float* acc) const {
  const int64_t in_blocks = n_rows_ - residual_rows();
  if (p >= in_blocks) {
    const float* x = residual_.data() + (p - in_blocks) * shape_.elems() +
                     static_cast<int64_t>(head) * shape_.head_dim;
    for (int32_t i = 0; i < shape_.head_dim; ++i) acc[i] += w * x[i];
    return;
  }
  codec_.axpy(w, blocks_.data() + p / codec_.rows_per_block * codec_.block_bytes(shape_),
              static_cast<int32_t>(p % codec_.rows_per_block), head, acc, args_);
}

}  // namespace kvq
