// Integer score arithmetic for integer-coded keys (int8 / int4 per token): the query quantised to
// int8 per head, as the weights' activations are (weights/matvec.h), and q·k computed with
// integer dot products — AVX-512 VNNI vpdpbusd, AVX2 maddubs/madd, or plain C++.
//
// Numerics (per score call, per query head h of q [n_q][head_dim]):
//   1. amax = max_i |q_i| (exact). A head holding an inf or NaN gets d = NaN and codes 0, so its
//      scores are NaN (the f32 product would not be finite either). A head with amax < 2^-64
//      (zeros, or too small for any softmax to tell from 0) gets d = 0 and codes 0: scores ±0.
//      Otherwise d = amax / 127 and inv = 127 / amax (two f32 divisions, once per head), and
//      qq_i = round-half-even(clamp(q_i · inv, −127, 127)) ∈ [−127, 127] — one f32 multiply per
//      element (not matvec's division, which costs ~10× as much per tile), then RNE.
//   2. Per (row, head), with c_i = raw_i − 2^(b−1) the key's centred codes and s_k its f16 scale:
//      I = Σ_i c_i·qq_i exactly in int32 (|I| ≤ head_dim·128·127 < 2^24 for head_dim ≤ 1024, so
//      the conversion to f32 is exact too); the order of the integer sum is irrelevant, so every
//      path (VNNI, AVX2, portable) and every tile gives the same I.
//   3. score = fl(fl(s_k·d)·I): two f32 roundings, the only f32 steps. So the score is bit-identical
//      on every path and every target, and independent of the tile (first row, n_rows).
// The bound against the exact product of the stored key and the unquantised query: per element,
// q_i·inv carries at most 3 roundings (inv, the product, and d's in the comparison), so
// |q_i/d − fl(q_i·inv)| ≤ 127·3.01·2^-24 and |q_i − d·qq_i| ≤ d·(1/2 + 2^-15) (for d > 0; for the
// tiny heads, |q_i| ≤ amax). Hence, with Q_h = d·(1/2 + 2^-15) (or amax when d = 0),
//   |score − s_k·Σ_i q_i·c_i| ≤ s_k·Q_h·Σ_i |c_i|  +  γ_2·|s_k·d·I|        (γ_n = n·u/(1 − n·u))
// and against the f32-arithmetic kernel (score_f32, itself within γ_{d+1}·s_k·Σ|q_i·c_i| of the
// exact product) that bound plus γ_{d+1}·s_k·Σ_i|q_i·c_i| (barring overflow and underflow).
// tests/formats/int_score_test.cc checks both, that the first is nearly attained, and strict
// equality with a plain C++ oracle on every path.
// Codec::kernels() hands this out as CodecKernels::score by default (ScoreArithmetic, set by the
// CLI's --score-arithmetic); the measured effect on fidelity is in docs/fidelity.md.
#pragma once

#include <cstdint>

#include "kvq/format.h"

namespace kvq::int_score {

/// How the integer dot products are computed. Every path gives the same bits.
enum class Path { kPortable, kAvx2, kAvx512Vnni };
/// Whether this CPU (and build) can run `path`.
bool Supported(Path path);
/// The fastest supported path, resolved once.
Path Best();
const char* PathName(Path path);

/// One query head quantised by step 1 above, in natural element order: q [head_dim] -> qq
/// [head_dim], *d, and *sum = Σ qq. Plain C++ (std::nearbyint): the oracle the paths match.
void QuantizeHeadReference(const float* q, int32_t head_dim, int8_t* qq, float* d, int32_t* sum);

/// The score of CodecKernels for int_token keys of `bits` (8 or 4) on `path` (which must be
/// Supported; a path whose vector width does not divide the head row falls back to a narrower
/// one, with the same bits). Arguments and scores layout as CodecKernels::score.
void IntTokenScore(Path path, int32_t bits, const float* q, int32_t n_q, const RowTile& tile,
                   int32_t kv_head, const CodecArgs& args, float* scores);

/// IntTokenScore split in two, for callers that score many tiles against one query: the heads
/// quantised once (step 1) into prepared [n_q][PreparedHeadBytes(head_dim)] bytes (64-byte
/// aligned; the layout is `path`'s own), then scored from those. ScorePrepared on any run of
/// prepared heads gives exactly the bits of IntTokenScore on the same heads and path.
int64_t PreparedHeadBytes(int32_t head_dim);
void PrepareQuery(Path path, int32_t bits, const float* q, int32_t n_q, const CodecArgs& args,
                  uint8_t* prepared);
void ScorePrepared(Path path, int32_t bits, const uint8_t* prepared, int32_t n_q, const RowTile& tile,
                   int32_t kv_head, const CodecArgs& args, float* scores);

/// CodecKernels::score_int for int8 / int4 keys: IntTokenScore on Best().
void Int8TokenScore(const float* q, int32_t n_q, const RowTile& tile, int32_t kv_head,
                    const CodecArgs& args, float* scores);
void Int4TokenScore(const float* q, int32_t n_q, const RowTile& tile, int32_t kv_head,
                    const CodecArgs& args, float* scores);

/// CodecKernels' prepared-query hooks for int8 / int4 keys (the integer score): PrepareQuery and
/// ScorePrepared on Best().
int64_t PreparedQueryHeadBytes(const CodecArgs& args);
void Int8PrepareQuery(const float* q, int32_t n_q, const CodecArgs& args, uint8_t* prepared);
void Int4PrepareQuery(const float* q, int32_t n_q, const CodecArgs& args, uint8_t* prepared);
void Int8ScorePrepared(const uint8_t* prepared, int32_t n_q, const RowTile& tile, int32_t kv_head,
                       const CodecArgs& args, float* scores);
void Int4ScorePrepared(const uint8_t* prepared, int32_t n_q, const RowTile& tile, int32_t kv_head,
                       const CodecArgs& args, float* scores);

}  // namespace kvq::int_score
