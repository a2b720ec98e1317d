// The position loops of attention (see kvq/attention.h) over one window's rows, for the driver in
// attention.cc: the reference loop through the codecs' dot/axpy, and the SIMD loops that read the
// rows in tiles through the codecs' fused kernels. Each continues the (m, l, acc) state it is given;
// a position's operations do not depend on the rows around it, so splitting the rows anywhere
// (windows, chunks, tiles) gives the same bits.
#pragma once

#include <cstdint>

#include "attention/softmax_tile.h"
#include "kvq/attention.h"
#include "kvq/format.h"

namespace kvq::attention_internal {

/// Query rows per score/softmax/accumulate call in a block: a multiple of 4 (see attention.cc's
/// BlockRows), and small enough that the call's q, acc, scores and c ([32][128] f32 each at most)
/// stay in L1.
inline constexpr int32_t kBlockRowsPerCall = 32;

struct SimdContext {
  const CodecKernels* k;
  const CodecKernels* v;
  const CodecKernels* f32;
  CodecArgs f32_args;
  SoftmaxTileFn softmax;
  float* rope_rows;  // [kMaxTileRows][n_kv_heads][head_dim]: a K tile of pre-RoPE keys, roped
  // [rows][k->prepared_head_bytes(K args)], 64-byte aligned, rows ≥ the query rows of any one
  // AttendSimd / AttendRowsSimd call: the call's query prepared once for k's tiles; null where k
  // has no prepare_query.
  uint8_t* prepared_q = nullptr;
};

/// One (query token, KV head) item, reference kernel: window rows [r0, r1), in order, for the
/// n_q query heads q ([n_q][head_dim]) of KV head kv_head. m, l: [n_q]; acc: [n_q][head_dim].
/// rope_row: [n_kv_heads][head_dim] scratch for pre-RoPE keys.
void AttendScalar(const AttentionOptions& o, const KvWindow& w, int64_t r0, int64_t r1, const float* q,
                  int32_t n_q, int32_t kv_head, float* m, float* l, float* acc, float* rope_row);

/// One (query token, KV heads [g0, g1)) item, SIMD kernel: window rows [r0, r1) in tiles of up to
/// kMaxTileRows positions; within a tile, every head of the item, so each tile's rows are read
/// while they are in cache. q, acc: [n_heads][head_dim] and m, l: [n_heads] of the token (head h
/// reads KV head h / group); scores, c: [group][kMaxTileRows].
void AttendSimd(const AttentionOptions& o, const SimdContext& ctx, const KvWindow& w, int64_t r0, int64_t r1,
                int32_t group, int32_t g0, int32_t g1, const float* q, float* m, float* l,
                float* acc, float* scores, float* c);

/// Rows [r0, r1) of the window for n_q query rows of KV head g, `chunk` rows per kernel call.
/// q, acc: [n_q][head_dim]; m, l: [n_q]; scores, c: [chunk][kMaxTileRows]. The per-(row,
/// position) operations are those of AttendSimd; only which rows share a call differs.
void AttendRowsSimd(const AttentionOptions& o, const SimdContext& ctx, const KvWindow& w, int64_t r0,
                    int64_t r1, int32_t g, int32_t n_q, int32_t chunk, const float* q, float* m,
                    float* l, float* acc, float* scores, float* c);

}  // namespace kvq::attention_internal
