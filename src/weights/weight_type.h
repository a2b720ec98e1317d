// The weight-type registry: everything kvq knows about a weight type, in one table
// (weight_types.cc), as ggml's type_traits. One folder per type (src/weights/<name>/) holds its
// byte layout, its scalar reference and its SIMD row kernels; MatVec, the decoders, the GGUF
// loader, synth, the benches and the tests look a type up here instead of switching on it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "kvq/status.h"
#include "weights/matrix.h"

namespace kvq {

/// Largest block_elems of any registered type (DecodeWeight decodes one block on the stack).
inline constexpr int64_t kMaxWeightBlockElems = 256;

/// One token's activation quantised by QuantizeActivation (matvec.h, "Numerics, quantised
/// activation"), as the quantised-activation row kernels read it: int8 codes per block of 32
/// whatever the weight type's own block size (a type with blocks of 64, 128 or 256 reads 2, 4 or 8
/// activation blocks per weight block).
struct QuantizedX {
  const int8_t* q = nullptr;  // [cols] codes in [-127, 127]
  const float* d = nullptr;   // [cols / 32] scale per block
  // [cols / 32] Σ q over each block of 32 (exact int32): the term a weight type with an offset
  // (Q4_1's min, a K-quant's sub-block min, Q1_0's −d) multiplies, so no kernel re-sums codes.
  const int32_t* sum = nullptr;
  // [cols · offset_bytes_per_elem / 4] (cols bytes unless the kernels ask for more) type-defined
  // side data the type's kernels derive from q once per call (WeightKernels::activation_offsets
  // of the matrix's type fills it). Mostly what each int32 lane
  // of the x86 kernels starts from: minus the unsigned-byte bias times the sum of the 4 codes the
  // lane covers, so the lane ends exactly at Σ code·q (or a fixed power-of-two multiple of it);
  // Q1_0 on AVX3_DL: the codes permuted by bit position, then lookup tables of partial sums (q1_0.h).
  const int32_t* offset = nullptr;
};

/// A type's row kernels for one SIMD target. MatVec fetches them once per call (WeightTypeDesc::
/// kernels, one Highway dispatch) and hands the pointers to the pool's threads.
struct WeightKernels {
  const char* target;  ///< Highway target name, e.g. "AVX3"
  /// Plain types (quantized_activation false): y[r] = Σ_c W[r][c]·x[c] for r in [r0, r1).
  /// w is the whole matrix [rows][row bytes]; x [cols]; y [rows].
  void (*rows)(const uint8_t* w, const float* x, float* y, int64_t cols, int64_t r0, int64_t r1);
  /// Quantised-activation types: fills x.offset [n · offset_bytes_per_elem / 4] from the codes q
  /// [n] of one token (n = cols) as this type's kernels on this target start their int32 lanes
  /// (a no-op where they do not use it).
  void (*activation_offsets)(const int8_t* q, int64_t n, int32_t* offset);
  /// Quantised-activation types: rows [r0, r1) of y = W x from the quantised x.
  void (*quant_rows)(const uint8_t* w, const QuantizedX& x, float* y, int64_t cols, int64_t r0, int64_t r1);
  /// Q4_0 / Q8_0 / Q1_0 / Q2_0 and the K-quants Q2_K..Q6_K (null for the others): rows [r0, r1) (multiples of 16 below rows −
  /// rows % 16) of a MatrixLayout::kInterleaved16 matrix (weights/repack.h) times n_tokens quantised tokens, x0
  /// the first (token t's codes at x0.q + t·cols, its scales and sums at t·cols/32) ->
  /// y [n_tokens][y_stride] at column r. Per row and token the same operations whatever n_tokens.
  void (*interleaved_rows)(const uint8_t* w, const QuantizedX& x0, int64_t n_tokens, float* y, int64_t y_stride,
                           int64_t cols, int64_t r0, int64_t r1) = nullptr;
  /// Bytes of x.offset per activation element that activation_offsets fills (≥ 1;
  /// token t's offsets start at t·cols·offset_bytes_per_elem / 4 int32 words).
  int64_t offset_bytes_per_elem = 1;
};

/// A registered weight type. A row of `cols` elements is cols / block_elems blocks of
/// block_bytes bytes, rows back to back.
struct WeightTypeDesc {
  WeightType type;
  const char* name;          ///< the CLI name, lower case: "q4_0"
  const char* label;         ///< ggml's type name, for messages and tables: "Q4_0"
  uint32_t gguf_type;        ///< ggml's type id in GGUF tensor infos (ggml.h enum ggml_type)
  uint32_t gguf_file_type;   ///< llama_ftype of a file whose matrices are all this type (general.file_type)
  int64_t block_elems;       ///< elements per block: 1 for plain types
  int64_t block_bytes;       ///< bytes per block
  /// The matvec quantises the activation to int8 per block of 32 and sums integer dots (matvec.h);
  /// such a type has block_elems a multiple of 32 and quant_rows kernels.
  bool quantized_activation;
  /// The scalar reference decoder: one block -> out [block_elems] f32, as ggml's dequantize_row
  /// computes it (exact for one-scale types; a two-term type, d·code − m, rounds as ggml does).
  void (*dequantize_block_ref)(const uint8_t* block, float* out);
  /// Quantised-activation types: one block -> w [block_elems], each weight's real value in double
  /// (exact: products of f16 scales and small integers), and abs [block_elems], the sum of the
  /// magnitudes of the terms the kernels add for it (|d·code| + |m| for d·code − m; |w| for one
  /// term). The matvec's rounding bound scales with abs (matvec.h); null for plain types.
  void (*exact_block_ref)(const uint8_t* block, double* w, double* abs);
  /// Quantised-activation types: roundings per term the kernels take beyond one per activation
  /// block (matvec.h: the bound is γ_{n_blocks + matvec_roundings}·abs_sum); 4 for Q8_0/Q4_0.
  int32_t matvec_roundings;
  /// The scalar reference encoder: x [block_elems] f32 -> one block (ggml's reference rounding
  /// for block types, round to nearest even for F16/BF16).
  void (*quantize_block_ref)(const float* x, uint8_t* block);
  /// One-scale types with blocks of 32 (Q8_0, Q4_0, Q5_0: weight i = scale · code i): code i of a
  /// block; null for every other type (BlockDotReference serves these only).
  int32_t (*code_ref)(const uint8_t* block, int64_t i);
  /// With code_ref: the block's scale d; null otherwise.
  float (*scale_ref)(const uint8_t* block);
  /// The row kernels for the best SIMD target this CPU supports (or the one a test selects).
  const WeightKernels& (*kernels)();
};

/// Every registered type, in registry order.
std::span<const WeightTypeDesc> WeightTypes();
/// The type's entry, or null for a value outside the registry.
const WeightTypeDesc* FindWeightType(WeightType type);
/// By CLI name or label, any case ("q4_0", "Q4_0"); the error lists the names.
Result<const WeightTypeDesc*> FindWeightTypeByName(std::string_view name);
/// By ggml type id, or null.
const WeightTypeDesc* FindWeightTypeByGgufId(uint32_t gguf_type);
/// "F32, F16, BF16, Q8_0, Q4_0": the labels, for error messages.
std::string WeightTypeLabelList();
/// "f32, f16, bf16, q8_0, q4_0": the CLI names, for help text.
std::string WeightTypeNameList();

/// x [n] -> n / block_elems blocks of `type` (n a multiple of block_elems), block by block.
void QuantizeRowRef(const WeightTypeDesc& type, const float* x, int64_t n, uint8_t* out);

}  // namespace kvq
