// RowSequence: an append-only run of rows for one tensor (one layer's K or V) in one codec — the
// smallest correct store for a format, used by tests, measurements and as the cache's oracle.
// It owns the two rules a store must keep: group codecs (KIVI keys) hold the newest incomplete
// group's rows in f32 until the group completes, and calibrated codecs (the interface keeps them;
// none is registered since fp8-e4m3 took per-group scales) take their tensor scale from the first rows.
#pragma once

#include <cstdint>
#include <vector>

#include "kvq/format.h"

namespace kvq {

class RowSequence {
 public:
  RowSequence(const Codec& codec, RowShape shape);

  /// Appends n rows: [n][n_kv_heads][head_dim] f32. The first call calibrates a calibrated codec.
  void Append(const float* rows, int64_t n);

  int64_t size() const { return n_rows_; }
  /// Rows not yet in a complete block (always 0 for one-row-block codecs).
  int64_t residual_rows() const { return static_cast<int64_t>(residual_.size()) / shape_.elems(); }
  /// Exact bytes held: complete blocks plus the f32 residual (equals BytesForRows).
  int64_t bytes() const { return static_cast<int64_t>(blocks_.size()) + residual_rows() * shape_.elems() * 4; }
  const CodecArgs& args() const { return args_; }

  /// Rows [first, first + n) as a view for readers (attention); valid until the next Append.
  RowsView View(int64_t first, int64_t n) const;

  /// Row p as stored: out [n_kv_heads][head_dim].
  void DecodeRow(int64_t p, float* out) const;
  /// Codec dot / axpy of row p, head h (residual rows: exact f32 arithmetic, same order).
  float Dot(const float* q, int64_t p, int32_t head) const;
  void Axpy(float w, int64_t p, int32_t head, float* acc) const;

 private:
  const Codec& codec_;
  RowShape shape_;
  CodecArgs args_;
  bool calibrated_ = false;
  int64_t n_rows_ = 0;
  std::vector<uint8_t> blocks_;  // complete blocks, block_bytes(shape) each
  std::vector<float> residual_;  // [residual_rows][n_kv_heads][head_dim]
};

}  // namespace kvq
