// Weight matrix × activation vector, the bulk of a decode step's work: y = W x for W [rows][cols].
// A SIMD kernel per weight type (Highway dispatch, once per call) split across the thread pool by
// rows, and a plain scalar reference beside it for tests.
//
// Weight types and their row layouts (little-endian, rows back to back, no padding):
//   F32   cols × 4 bytes
//   F16   cols × 2 bytes, IEEE binary16
//   BF16  cols × 2 bytes, the high half of an f32
//   Q8_0  cols/32 blocks of 34 bytes (ggml block_q8_0): f16 scale d, then 32 int8 qs;
//         element i of the block = d · qs[i]
//   Q4_0  cols/32 blocks of 18 bytes (ggml block_q4_0): f16 scale d, then 16 bytes qs;
//         element i   (0 ≤ i < 16) = d · ((qs[i] & 0x0F) − 8)
//         element i+16             = d · ((qs[i] >> 4) − 8)
//         (elements i and i+16 share a byte: the low nibbles are the first half of the block)
// Every decoded weight is exact in f32 (d has 11 significant bits, the code at most 8).
//
// Numerics. MatVecReference sums the products decoded_w·x in column order in f32. MatVec sums the
// same products in another order (lane-parallel partial sums; for Q8_0/Q4_0 it sums code·x over a
// block in f32 and multiplies by d once per block; x is never quantised), so the two differ by
// rounding only: |MatVec − Reference| ≤ 2·(cols + 4)·2^-24·Σ_c |w·x| per row (derivation in
// tests/model/matvec_test.cc). Results depend on the SIMD target (lane count) but not on the
// thread count.
#pragma once

#include <cstdint>

#include "kvq/status.h"
#include "model/weights.h"

namespace kvq {

/// Ok if MatVec and the decoders below can serve `w`: a known type, rows ≥ 0, cols ≥ 1, and for
/// Q8_0/Q4_0 cols a multiple of 32 (a row is whole blocks). Does not look at `data`.
Status CheckMatrix(const Matrix& w);

/// Bytes of one row of `cols` elements of `type` (cols a multiple of 32 for Q8_0/Q4_0).
int64_t MatrixRowBytes(WeightType type, int64_t cols);

/// y[r] = Σ_c W[r][c] · x[c], rows split across `threads`. `w` must pass CheckMatrix (not
/// re-checked here); x has w.cols floats, y w.rows.
void MatVec(const Matrix& w, const float* x, float* y, int32_t threads);

/// Y = X Wᵀ for a block of tokens: x [n_tokens][cols] -> y [n_tokens][rows], the weights read
/// once per call (prefill). Equal, bit for bit, to n_tokens calls of MatVec.
void MatMul(const Matrix& w, const float* x, int64_t n_tokens, float* y, int32_t threads);

/// MatVec, one row at a time in plain C++ (scalar decode, sequential sums): the oracle for tests.
void MatVecReference(const Matrix& w, const float* x, float* y);

/// W[row][col] decoded to f32 by the layout above (plain scalar code).
float DecodeWeight(const Matrix& w, int64_t row, int64_t col);

/// out[c] = W[row][c] for c in [0, cols).
void DecodeWeightRow(const Matrix& w, int64_t row, float* out);

/// Name of the SIMD target MatVec dispatches to here ("AVX3", "AVX2", "SCALAR", ...).
const char* MatVecTargetName();

}  // namespace kvq
