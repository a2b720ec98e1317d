// KV number formats: how one token's K or V row for one layer is stored, and exactly how many bytes
// that takes. Every memory figure kvq prints comes from these byte counts.
//
// A format has a codec for keys and a codec for values (the same one for all formats but KIVI,
// which quantises keys per channel and values per token). A codec stores rows in blocks: one row
// per block for per-token formats, G rows per block for KIVI keys (a group). The codec functions
// take raw pointers and know nothing of caches or models; attention reads them through dot/axpy.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "kvq/status.h"

namespace kvq {

/// Stable numeric ids: written into snapshot and page headers, so a value never changes meaning.
enum class FormatId : uint16_t {
  kF32 = 1,
  kF16 = 2,
  kBf16 = 3,
  // 4 was fp8-e4m3 with one calibrated f32 scale per tensor (retired: a snapshot with 4 is refused).
  kInt8 = 5,
  kInt4 = 6,
  kInt2 = 7,
  kInt4Kivi = 8,
  kInt2Kivi = 9,
  kFp4E2m1 = 10,
  kFp8E4m3 = 11,  ///< fp8-e4m3 with power-of-two scales per head per key group / per value row
};

/// Largest head_dim any format accepts (reference kernels keep one head on the stack).
inline constexpr int32_t kMaxHeadDim = 1024;

/// Geometry of one cached row: one token's K (or V) for one layer.
struct RowShape {
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int64_t elems() const { return static_cast<int64_t>(n_kv_heads) * head_dim; }
};

/// What a codec's functions need besides the bytes.
struct CodecArgs {
  RowShape shape;
  /// Per-tensor scale (tensor = one layer's K or V), for codecs with `calibrated` set
  /// (fp8-e4m3): stored value = code × tensor_scale. Ignored by every other codec.
  float tensor_scale = 1.0f;
};

/// Up to kMaxTileRows consecutive rows of one tensor that SIMD kernels read in one call. A tile
/// never crosses a block boundary of a group codec.
inline constexpr int32_t kMaxTileRows = 32;
struct RowTile {
  const uint8_t* block;  ///< the block holding the tile's first row
  int64_t stride_bytes;  ///< one-row-block codecs: bytes from one row to the next (usually block_bytes)
  int32_t first_row;     ///< group codecs: the first row's index within `block` (else 0)
  int32_t n_rows;        ///< 1..kMaxTileRows
};

/// SIMD kernels of a codec, for the SIMD target chosen at run time. They dequantise in registers
/// (no dequantised copy of rows) and read each row once for all n_q query heads sharing it.
struct CodecKernels {
  const char* target;  ///< Highway target name, e.g. "AVX3"
  /// scores[h · kMaxTileRows + i] ≈ Σ_d q[h][d] · x'_i[kv_head][d] for h < n_q, i < n_rows.
  /// q: [n_q][head_dim]. Each score is computed the same way whatever the tile (its first row,
  /// n_rows), so windowed attention stays bit-identical. A head's result depends on n_q only
  /// through its class: heads [0, 4·⌊n_q/4⌋) may be reduced four at a time, the rest one at a
  /// time, and within a class the bits are the same whatever n_q and whichever heads share the
  /// call; attention's query blocks rely on this (attention.cc). This is the kernel attention
  /// calls: score_int where the codec has one and ScoreArithmetic() is kInteger, else score_f32.
  void (*score)(const float* q, int32_t n_q, const RowTile& tile, int32_t kv_head,
                const CodecArgs& args, float* scores);
  /// The f32-arithmetic score: dequantise in registers, f32 FMAs, the summation order fixed per
  /// row; within γ_d·Σ|q·x'| of the codec's reference dot.
  void (*score_f32)(const float* q, int32_t n_q, const RowTile& tile, int32_t kv_head,
                    const CodecArgs& args, float* scores);
  /// Integer score arithmetic (int8 / int4 per-token keys; see formats/int_score.h for the
  /// numerics and the bound), or null where the codec has none.
  void (*score_int)(const float* q, int32_t n_q, const RowTile& tile, int32_t kv_head,
                    const CodecArgs& args, float* scores);
  /// For each row i in order and each h < n_q: acc[h] = acc[h] · c[h·kMaxTileRows + i] +
  /// e[h·kMaxTileRows + i] · x'_i[kv_head] (one fused multiply-add per lane; a multiply by exactly
  /// 1 may be skipped). acc: [n_q][head_dim]. Lanes are independent, so results do not depend on
  /// how rows are grouped into tiles.
  void (*accumulate)(const float* c, const float* e, int32_t n_q, const RowTile& tile,
                     int32_t kv_head, const CodecArgs& args, float* acc);
  /// Optional, all three or none: `score` split in two for callers that score many tiles against
  /// one query (attention, per call), so the query's own work (the integer score quantises each
  /// head) is done once rather than per tile. prepare_query: q [n_q][head_dim] -> prepared
  /// [n_q][prepared_head_bytes(args)] bytes, 64-byte aligned, each head's bytes independent of
  /// the others. score_prepared on any run of n_q prepared heads writes exactly the bits `score`
  /// writes for the same heads and tile. Null where `score` has nothing to hoist.
  int64_t (*prepared_head_bytes)(const CodecArgs& args) = nullptr;
  void (*prepare_query)(const float* q, int32_t n_q, const CodecArgs& args, uint8_t* prepared) = nullptr;
  void (*score_prepared)(const uint8_t* prepared, int32_t n_q, const RowTile& tile, int32_t kv_head,
                         const CodecArgs& args, float* scores) = nullptr;
  /// True when score multiplies on int8 dot products (the query quantised per head) rather than
  /// f32 FMAs: `kvq bench attention` then holds its score half to the int8 dot peak.
  bool int8_scores = false;
};

/// How scores against integer-coded keys are computed (CodecKernels::score_int / score_f32).
enum class ScoreArithmetic {
  kInteger,  ///< the query quantised to int8 per head, integer dot products (the default)
  kF32,      ///< dequantised keys, f32 FMAs (kept to measure and test the integer path against)
};
/// Process-wide choice that Codec::kernels() hands out as CodecKernels::score; the CLI sets it
/// once from --score-arithmetic before any attention runs. Not for changing mid-computation:
/// attention calls read it when they resolve a window's kernels.
void SetScoreArithmetic(ScoreArithmetic arithmetic);
ScoreArithmetic GetScoreArithmetic();
/// "int" or "f32".
const char* ScoreArithmeticName(ScoreArithmetic arithmetic);

/// One way of storing rows. All functions are the portable scalar reference; SIMD kernels that
/// fuse dequantisation live in attention/ and are tested against these.
struct Codec {
  const char* element;  ///< what each number is stored as, e.g. "int4 offset-binary"
  const char* scale;    ///< what scales it, e.g. "f16 per head row"
  const char* layout;   ///< byte layout of a block, one line (the header beside the code has more)
  int32_t element_bits;
  /// Rows per block: 1, or G for a codec that quantises a group of rows together. Rows of an
  /// incomplete group are held in f32 (the residual) until the group completes; see BytesForRows.
  int32_t rows_per_block;
  /// True when encoding needs a tensor_scale from Calibrate first.
  bool calibrated;

  /// Empty when the shape can be stored, else why not (e.g. "head_dim must be even").
  std::string (*check_shape)(RowShape shape);
  /// Exact storage bytes of one block of rows_per_block rows.
  int64_t (*block_bytes)(RowShape shape);
  /// rows: [rows_per_block][n_kv_heads][head_dim] f32 -> block: block_bytes(shape) bytes.
  void (*encode_block)(const float* rows, uint8_t* block, const CodecArgs& args);
  /// block, row r of it -> out: [n_kv_heads][head_dim] f32.
  void (*decode_row)(const uint8_t* block, int32_t row, float* out, const CodecArgs& args);
  /// Σ_i q[i] · x'[head][i] over head_dim, summed in f32 in order of i (x' = decoded row r).
  float (*dot)(const float* q, const uint8_t* block, int32_t row, int32_t head,
               const CodecArgs& args);
  /// acc[i] += w · x'[head][i] for i < head_dim.
  void (*axpy)(float w, const uint8_t* block, int32_t row, int32_t head, float* acc,
               const CodecArgs& args);
  /// Tensor scale from the first values written (normally the prefill); null if not calibrated.
  float (*calibrate)(const float* values, int64_t n);
  /// The codec's accuracy contract: the largest |x − x'| it may produce when x was stored at
  /// (row, head, element i) of this block, derived from the block's own scales. The conformance
  /// suite checks every round trip against it; 0 for f32.
  float (*error_bound)(float x, const uint8_t* block, int32_t row, int32_t head, int32_t i,
                       const CodecArgs& args);
  /// The SIMD kernels for the best target this CPU supports (resolved once, then cached).
  const CodecKernels& (*kernels)();
};

/// Consecutive rows of one tensor as stored, for readers such as attention, in three runs: f32
/// head rows (attention sinks), rows in encoded blocks, f32 residual rows (the newest rows not yet
/// encoded: KIVI's incomplete group, a "res" transform). View row r is head row r while
/// r < n_head_rows, stored row first_row + r counted from `blocks` while r < n_block_rows, and
/// residual row r − n_block_rows after that.
struct RowsView {
  const Codec* codec = nullptr;
  CodecArgs args;
  const float* head = nullptr;       ///< [n_head_rows][n_kv_heads][head_dim] f32
  int64_t n_head_rows = 0;           ///< view rows [0, n_head_rows) are head rows
  const uint8_t* blocks = nullptr;   ///< block 0 of the stored rows
  int64_t first_row = 0;             ///< stored-row index of view row 0
  int64_t n_block_rows = 0;          ///< view rows [n_head_rows, n_block_rows) are in blocks
  const float* residual = nullptr;   ///< [n_rows − n_block_rows][n_kv_heads][head_dim] f32
  int64_t n_rows = 0;
};

/// A registered KV format.
struct FormatDesc {
  FormatId id;
  const char* name;     ///< the CLI token, e.g. "int4"
  const char* summary;  ///< one line for listings
  Codec key;
  Codec value;
  /// Where kvq's bits-per-number differs from a figure printed in the seeds, and why; or "".
  const char* note;
};

/// Every registered format, in registry order.
std::span<const FormatDesc* const> Formats();
/// The format with this CLI name, or an error listing the known names.
Result<const FormatDesc*> FindFormat(std::string_view name);
/// The format with this id, or null.
const FormatDesc* FindFormat(FormatId id);

/// Checks both codecs can store rows of this shape; the error names the format and the rule.
Status CheckShape(const FormatDesc& format, RowShape shape);

/// Exact bytes that n_rows rows of one tensor take in this codec: complete blocks, plus the
/// f32 residual rows of an incomplete group for group codecs.
int64_t BytesForRows(const Codec& codec, RowShape shape, int64_t n_rows);

/// Steady-state bits per stored number (complete blocks): block bits / numbers per block.
double BitsPerNumber(const Codec& codec, RowShape shape);

/// Bytes of per-tensor state (fp8's f32 tensor scale) for one tensor; 0 for other codecs.
int64_t TensorStateBytes(const Codec& codec);

}  // namespace kvq
