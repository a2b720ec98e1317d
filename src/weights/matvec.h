// Weight matrix × activation vector, the bulk of a decode step's work: y = W x for W [rows][cols].
// A SIMD kernel per weight type (Highway dispatch, once per call) split across the thread pool by
// rows, and plain scalar references beside it for tests.
//
// Weight types: the registry (weight_type.h) lists them; each one's row layout, scalar reference
// and kernels are in src/weights/<name>/ (f32, f16, bf16; q8_0, q4_0, q4_1, q5_0, q5_1; q1_0,
// q2_0; q2_k .. q6_k). A row of cols elements is cols / block_elems blocks, rows back to back, no
// padding. Every block type quantises the activation (below). The one-scale types with blocks of
// 32 (Q8_0, Q4_0, Q5_0) store an f16 scale d and 32 integer codes, weight = d·code (exact in f32):
// the "code" below is qs[i] for Q8_0 and the nibble − 8 for Q4_0; the others' layouts and their
// integer forms are in their folders' headers (kquant.h for the K-quants).
//
// Numerics, F32/F16/BF16. MatVecReference sums the products w·x in column order in f32; MatVec
// sums the same products in another order (lane-parallel partial sums), so the two differ by
// rounding only: |MatVec − Reference| ≤ 2·(cols + 4)·2^-24·Σ_c |w·x| per row (derivation in
// tests/weights/matvec_test.cc).
//
// Numerics, quantised activation (Q8_0, Q4_0 and every block type with quantized_activation):
// the activation is quantised per block of 32, as ggml does with its vec_dot_type q8_0 — for
// every such type, whatever its own block size (ggml quantises per 256 for K-quants; per 32 is
// finer, and the sub-block scales of every K-quant align with it).
//   1. Once per call and token, x is cut into blocks of 32 and each block quantised
//      (QuantizeActivation): amax = max |x_i|, d_x = amax / 127 (one f32 division),
//      q_i = round-half-even(x_i / d_x) ∈ [−127, 127] (int8; clamped to ±127, which never binds
//      when d_x is a normal f32). A block of zeros (or whose amax/127 underflows to 0) has d_x = 0
//      and q = 0; a block holding an inf or NaN has d_x = NaN and q = 0, so every row's result is
//      NaN, as the unquantised product would be non-finite.
//   2. Per row and block, I_b = Σ code_i·q_i is exact in int32 (|I_b| ≤ 32·128·127), and
//      y = Σ_b (d_w·d_x)·I_b in f32: the scale product is rounded once and the blocks are added
//      in f32 (lane-parallel partial sums of exact integers on SIMD targets). A type whose weight
//      has two terms (d·code − m: Q4_1, Q5_1, K-quant mins) adds (m·d_x)·Σq the same way, with
//      Σq the activation block's exact sum (QuantizedX::sum); sub-block scales (K-quants) are
//      integers folded into I_b exactly.
//   Error from quantising x, per element: x/d_x is rounded once (|x/d_x| ≤ 127·(1 + 2u), u =
//   2^-24), then to an integer, so |x − d_x·q| ≤ d_x·(1/2 + 2^-17). Hence, per row,
//       |Σ_b d_w·d_x·I_b − Σ_i w_i·x_i| ≤ Σ_b d_x,b·(1/2 + 2^-17)·Σ_{i∈b} |w_i|    (x_error_bound)
//   for blocks whose d_x is a normal f32 (amax ≥ 127·2^-126).
//   Error from the f32 arithmetic: each term d_w·d_x·(lane partial of I_b) is rounded at most
//   n_blocks + 4 times (the scale product, one FMA or add per block, a reduction over ≤ 8 lanes),
//   so |MatVec − Σ_b d_w·d_x·I_b| ≤ γ_{n_blocks+4}·Σ_b |d_w·d_x|·Σ_i |code_i·q_i|  (abs_sum),
//   γ_n = n·u/(1 − n·u), barring underflow and overflow. In general abs_sum = Σ_b d_x·Σ_i abs_i·|q_i|
//   with abs_i the magnitude of weight i's terms (WeightTypeDesc::exact_block_ref), and a type
//   states in its header how many roundings per term its kernels take (at most n_blocks + 8). MatVecQuantizedReference gives both sums
//   and the exact value; the tests check both bounds, and that the first is tight.
//   Kernels (quant_rows-inl.h, with each type's block dot product in its folder): AVX3_DL uses
//   AVX-512 VNNI (vpdpbusd), AVX2 and AVX3 maddubs/madd, other targets plain integer loops; all on
//   256-bit or narrower vectors. K-quants (Q2_K .. Q6_K, super-blocks of 256): kquant_rows-inl.h,
//   the same paths, with the sub-block scales folded in and the rounding count (5) derived there.
//   Repacked Q4_0 / Q8_0 / Q2_0 (MatrixLayout::kInterleaved16, weights/repack.h; LoadModel repacks
//   every projection and the classifier, Q2_0 on AVX3_DL only): interleaved_rows-inl.h, 16 rows × up
//   to 10 tokens per step (2 on AVX2 / AVX3),
//   512-bit vpdpbusd on AVX3_DL. Lane j of one int32 accumulator is row j's whole block dot I_b,
//   so there is no lane reduction: each term is rounded at most n_blocks + 1 times (the scale
//   product, one FMA per block) — within the γ_{n_blocks+4} of matvec_roundings = 4, which still
//   covers the rows % 16 tail rows the row kernels serve; the tests check the tighter
//   γ_{n_blocks+1}. The 16-row groups give the same bits on every target (std::fma on scalar).
//   Repacked Q2_K..Q6_K (weights/kquant_repack.h, kquant_interleaved-inl.h): the same per-32
//   activation quantisation (so the same x_error_bound), 16 rows × up to 4 tokens per step; a
//   second accumulator per row (Q2_K's, Q4_K's and Q5_K's mins, Q3_K's and Q6_K's odd sub-blocks of 16) and the add joining the
//   two: at most n_blocks + 2 roundings per term, within γ_{n_blocks+5} (matvec_roundings = 5);
//   tests/weights/repack_test.cc checks γ_{n_blocks+2} and the same bits on every target.
//   Repacked Q1_0 (the same 16-row groups): lookup tables of partial sums on AVX3_DL, giving
//   each target's row-kernel bits (q1_0.h), so matvec_roundings = 4 covers it.
//
// Results depend on the SIMD target (lane count) and the layout, but not on the thread count, and
// MatMul equals n_tokens MatVec calls bit for bit (the same activation quantisation, and per row
// and token the same kernel operations).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/thread_pool.h"
#include "kvq/status.h"
#include "weights/matrix.h"
#include "weights/weight_type.h"

namespace kvq {

/// Ok if MatVec and the decoders below can serve `w`: a registered type, rows ≥ 0, cols ≥ 1, and
/// cols a multiple of the type's block_elems (a row is whole blocks). Does not look at `data`.
Status CheckMatrix(const Matrix& w);

/// Bytes of one row of `cols` elements of `type` (cols a multiple of its block_elems); 0 for a
/// type outside the registry.
int64_t MatrixRowBytes(WeightType type, int64_t cols);

/// y[r] = Σ_c W[r][c] · x[c], rows split across the pool's threads. `w` must pass CheckMatrix
/// (not re-checked here); x has w.cols floats, y w.rows. Q8_0/Q4_0 quantise x first (see above).
void MatVec(const Matrix& w, const float* x, float* y, ThreadPool& pool);

/// Y = X Wᵀ for a block of tokens: x [n_tokens][cols] -> y [n_tokens][rows], the weights read
/// once per call (prefill). Equal, bit for bit, to n_tokens calls of MatVec.
void MatMul(const Matrix& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool);

/// One product of a MatMulGroup: y [n_tokens][w->rows] = X W.
struct MatMulOutput {
  const Matrix* w = nullptr;
  float* y = nullptr;
};

/// The most products one MatMulGroup takes.
inline constexpr size_t kMaxMatMulGroup = 8;

/// Several products of one input — x [n_tokens][cols], every matrix with cols columns (q/k/v of a
/// layer, its gate and up) — as one hand-off to the pool instead of one per matrix: the
/// activation is quantised once (once per distinct kernel set when the types differ) and the
/// row items of all the matrices are handed out together. Each product equals MatMul of it alone
/// bit for bit (the same quantised activation, the same kernel per row and token), whatever the
/// pool's thread count. At most kMaxMatMulGroup products; a matrix with no rows is skipped.
void MatMulGroup(std::span<const MatMulOutput> products, const float* x, int64_t n_tokens, ThreadPool& pool);

/// One product of a MatMulRuns: tokens [first_token, first_token + n_tokens) of the call's input
/// through w, into y [n_tokens][w->rows].
struct MatMulRun {
  const Matrix* w = nullptr;
  int64_t first_token = 0;
  int64_t n_tokens = 0;
  float* y = nullptr;
};

/// Products of any number of matrices, each over its own run of consecutive tokens of one input
/// x [n_tokens][cols] (every matrix with cols columns) — a mixture of experts' block, each expert
/// over the rows routed to it, gathered by expert — as one hand-off to the pool: x is quantised
/// once (once per distinct kernel set), and the row items of all the runs are handed out
/// together, instead of a hand-off per expert of a few rows each. Each run equals MatMul(*w,
/// x + first_token·cols, n_tokens, y) bit for bit (quantisation is per token and block of 32, so
/// quantising x whole gives each token the codes it gets alone), whatever the thread count. A run
/// with no tokens or a matrix with no rows is skipped.
void MatMulRuns(std::span<const MatMulRun> runs, const float* x, int64_t n_tokens,
                ThreadPool& pool);

/// The unquantised product, one row at a time in plain C++ (scalar decode, x as given, products
/// summed in column order in f32): the oracle for the plain types and the "true" product the
/// Q8_0/Q4_0 result is bounded against.
void MatVecReference(const Matrix& w, const float* x, float* y);

/// W[row][col] decoded to f32 by the type's dequantize_block_ref (plain scalar code).
float DecodeWeight(const Matrix& w, int64_t row, int64_t col);

/// out[c] = W[row][c] for c in [0, cols).
void DecodeWeightRow(const Matrix& w, int64_t row, float* out);

// ---- The quantised activation (Q8_0/Q4_0 products) ----

inline constexpr int64_t kActivationBlockElems = 32;
inline constexpr int64_t kActivationLaneElems = 4;  // elements one int32 lane of an x86 byte dot sums

/// Quantised activations for n_tokens tokens as one type's kernels read them (QuantizedX).
struct QuantizedActivation {
  int64_t cols = 0;
  std::vector<int8_t> q;        // [n_tokens][cols]
  std::vector<float> d;         // [n_tokens][cols / 32]
  std::vector<int32_t> sum;     // [n_tokens][cols / 32]
  std::vector<int32_t> offset;  // [n_tokens][offset_stride]
  int64_t offset_stride = 0;    // int32 words of offset per token: cols·offset_bytes_per_elem / 4
  QuantizedX Token(int64_t token) const;
};

/// x [n_tokens][cols] -> out: QuantizeActivation, the block sums and the offsets kernels `k`
/// start from. Reuses out's storage (no allocation once the sizes have been seen).
void QuantizeActivationFor(const WeightKernels& k, const float* x, int64_t cols, int64_t n_tokens,
                           QuantizedActivation* out);

/// x [cols] (cols a multiple of 32) -> q [cols] and d [cols/32] by step 1 above; SIMD, dispatched.
/// Equal bit for bit to QuantizeActivationReference on every target.
void QuantizeActivation(const float* x, int64_t cols, int8_t* q, float* d);

/// QuantizeActivation in plain C++ (std::nearbyint under the default rounding mode): the oracle.
void QuantizeActivationReference(const float* x, int64_t cols, int8_t* q, float* d);

/// Σ_i code_i·q[32·block + i] over block `block` of row `row`, in plain integer arithmetic (exact).
/// `w` is a one-scale type with a code_ref (Q8_0, Q4_0, ...); q is a whole quantised row of w.cols codes.
int32_t BlockDotReference(const Matrix& w, int64_t row, int64_t block, const int8_t* q);

/// Per row, the quantised product and the sums its two error bounds scale with (see above).
struct QuantizedProductReference {
  double y = 0;              ///< Σ_b d_x·Σ_i w_i·q_i, w_i exact; in double (error ≤ (cols + n_blocks)·2^-53·abs_sum)
  double abs_sum = 0;        ///< Σ_b d_x·Σ_i abs_i·|q_i| (= Σ_b |d_w·d_x|·Σ_i |code_i·q_i| for one-scale types)
  double x_error_bound = 0;  ///< Σ_b d_x·(1/2 + 2^-17)·Σ_i |w_i|: bound on |y − Σ_i w_i·x_i|
};

/// The quantised product of step 1 and 2 in plain C++ (QuantizeActivationReference, then the
/// type's exact_block_ref per block): out has w.rows entries.
void MatVecQuantizedReference(const Matrix& w, const float* x, QuantizedProductReference* out);

/// Name of the SIMD target MatVec dispatches to here ("AVX3_DL", "AVX3", "AVX2", "SCALAR", ...).
const char* MatVecTargetName();

}  // namespace kvq
