// AttendWindow: the window driver (see kvq/attention.h). Work is split into (query token, KV
// head) items across threads; each item walks the window's positions up to its query's own
// position, either one at a time through the codecs' reference dot/axpy (kScalar) or in tiles
// through the codecs' SIMD kernels (kSimd). Positions are never split across threads, so no
// partial states are merged and the result does not depend on the thread count.
#include "kvq/attention.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

#include "attention/softmax_tile.h"
#include "format/f32/f32.h"
#include "simd/dispatch.h"

namespace kvq {
namespace {

// Where rows [r, r + n) of a view come from for the SIMD kernels: a tile that stays inside one
// block of a group codec and inside either the blocks or the f32 residual.
struct TileSource {
  const CodecKernels* kernels;
  const CodecArgs* args;
  RowTile tile;
};

// The longest tile starting at view row r (at most max_rows) that one kernel call can read.
TileSource TileAt(const RowsView& view, const CodecKernels& kernels, const CodecKernels& f32,
                  const CodecArgs& f32_args, int64_t r, int32_t max_rows) {
  if (r >= view.n_block_rows) {  // f32 residual of an incomplete group
    const int64_t row_bytes = view.args.shape.elems() * 4;
    const auto* base = reinterpret_cast<const uint8_t*>(view.residual + (r - view.n_block_rows) *
                                                                          view.args.shape.elems());
    const int64_t n = std::min<int64_t>(max_rows, view.n_rows - r);
    return {&f32, &f32_args, {base, row_bytes, 0, static_cast<int32_t>(n)}};
  }
  const int64_t stored = view.first_row + r;
  const int32_t per_block = view.codec->rows_per_block;
  const int64_t block_bytes = view.codec->block_bytes(view.args.shape);
  const uint8_t* block = view.blocks + (stored / per_block) * block_bytes;
  const int32_t in_block = static_cast<int32_t>(stored % per_block);
  int64_t n = std::min<int64_t>(max_rows, view.n_block_rows - r);
  if (per_block > 1) n = std::min<int64_t>(n, per_block - in_block);
  return {&kernels, &view.args, {block, block_bytes, in_block, static_cast<int32_t>(n)}};
}

// Reference dot / axpy of view row r, head h: the codec's own for block rows, plain f32 for the
// residual (summed in the same order as the codec's reference dot).
float RowDot(const RowsView& v, const float* q, int64_t r, int32_t h) {
  const int32_t d = v.args.shape.head_dim;
  if (r >= v.n_block_rows) {
    const float* x = v.residual + (r - v.n_block_rows) * v.args.shape.elems() + int64_t{h} * d;
    float sum = 0.0f;
    for (int32_t i = 0; i < d; ++i) sum += q[i] * x[i];
    return sum;
  }
  const int64_t stored = v.first_row + r;
  const int32_t per_block = v.codec->rows_per_block;
  return v.codec->dot(q, v.blocks + (stored / per_block) * v.codec->block_bytes(v.args.shape),
                      static_cast<int32_t>(stored % per_block), h, v.args);
}

void RowAxpy(const RowsView& v, float w, int64_t r, int32_t h, float* acc) {
  const int32_t d = v.args.shape.head_dim;
  if (r >= v.n_block_rows) {
    const float* x = v.residual + (r - v.n_block_rows) * v.args.shape.elems() + int64_t{h} * d;
    for (int32_t i = 0; i < d; ++i) acc[i] += w * x[i];
    return;
  }
  const int64_t stored = v.first_row + r;
  const int32_t per_block = v.codec->rows_per_block;
  v.codec->axpy(w, v.blocks + (stored / per_block) * v.codec->block_bytes(v.args.shape),
                static_cast<int32_t>(stored % per_block), h, acc, v.args);
}

// One (query token, KV head) item, reference kernel: positions [0, n) of the window, in order.
void AttendScalar(const AttentionOptions& o, const KvWindow& w, int64_t n, const float* q,
                  int32_t n_q, int32_t kv_head, float* m, float* l, float* acc) {
  const int32_t d = w.k.args.shape.head_dim;
  for (int64_t r = 0; r < n; ++r) {
    for (int32_t h = 0; h < n_q; ++h) {
      float s = o.scale * RowDot(w.k, q + h * d, r, kv_head);
      if (o.softcap > 0.0f) s = o.softcap * std::tanh(s / o.softcap);
      if (s == -INFINITY) continue;  // adds nothing; (−inf) − (−inf) must not reach exp
      const float next = std::fmax(m[h], s);
      const float c = next == m[h] ? 1.0f : std::exp(m[h] - next);
      const float e = std::exp(s - next);
      l[h] = l[h] * c + e;
      float* a = acc + h * d;
      if (c != 1.0f) {
        for (int32_t i = 0; i < d; ++i) a[i] *= c;
      }
      RowAxpy(w.v, e, r, kv_head, a);
      m[h] = next;
    }
  }
}

struct SimdContext {
  const CodecKernels* k;
  const CodecKernels* v;
  const CodecKernels* f32;
  CodecArgs f32_args;
  attention_internal::SoftmaxTileFn softmax;
};

// One (query token, KV head) item, SIMD kernel: tiles of up to kMaxTileRows positions.
void AttendSimd(const AttentionOptions& o, const SimdContext& ctx, const KvWindow& w, int64_t n,
                const float* q, int32_t n_q, int32_t kv_head, float* m, float* l, float* acc,
                float* scores, float* c) {
  for (int64_t r = 0; r < n;) {
    const int32_t max_rows = static_cast<int32_t>(std::min<int64_t>(kMaxTileRows, n - r));
    TileSource ks = TileAt(w.k, *ctx.k, *ctx.f32, ctx.f32_args, r, max_rows);
    TileSource vs = TileAt(w.v, *ctx.v, *ctx.f32, ctx.f32_args, r, max_rows);
    const int32_t rows = std::min(ks.tile.n_rows, vs.tile.n_rows);
    ks.tile.n_rows = rows;
    vs.tile.n_rows = rows;
    ks.kernels->score(q, n_q, ks.tile, kv_head, *ks.args, scores);
    ctx.softmax(scores, c, n_q, rows, o.scale, o.softcap, m, l);
    vs.kernels->accumulate(c, scores, n_q, vs.tile, kv_head, *vs.args, acc);
    r += rows;
  }
}

}  // namespace

AttentionState::AttentionState(AttentionShape shape, int32_t n_tokens)
    : shape_(shape), n_tokens_(n_tokens) {
  Reset();
}

void AttentionState::Reset() {
  const int64_t heads = int64_t{n_tokens_} * shape_.n_heads;
  m.assign(heads, -std::numeric_limits<float>::infinity());
  l.assign(heads, 0.0f);
  acc.assign(heads * shape_.head_dim, 0.0f);
  attended.assign(n_tokens_, 0);
}

void AttendWindow(const AttentionOptions& o, const float* q, int64_t first_query_position,
                  const KvWindow& w, AttentionState& state) {
  const AttentionShape shape = state.shape();
  assert(w.k.n_rows == w.v.n_rows);
  assert(shape.n_heads % shape.n_kv_heads == 0);
  assert(w.k.args.shape.head_dim == shape.head_dim && w.k.args.shape.n_kv_heads == shape.n_kv_heads);
  const int32_t group = shape.n_heads / shape.n_kv_heads;
  const int32_t d = shape.head_dim;
  const int32_t n_tokens = state.n_tokens();

  // Causal: token t sees window rows [0, visible(t)).
  auto visible = [&](int32_t t) {
    return std::clamp<int64_t>(first_query_position + t - w.first_position + 1, 0, w.k.n_rows);
  };
  for (int32_t t = 0; t < n_tokens; ++t) state.attended[t] += visible(t);

  SimdContext ctx{};
  if (o.kernel == AttentionKernel::kSimd) {
    ctx = {&w.k.codec->kernels(), &w.v.codec->kernels(), &F32Format().key.kernels(),
           CodecArgs{.shape = w.k.args.shape}, attention_internal::SoftmaxTileForThisCpu()};
  }
  const int64_t items = int64_t{n_tokens} * shape.n_kv_heads;
#pragma omp parallel num_threads(std::max(1, o.threads)) if (o.threads > 1 && items > 1)
  {
    std::vector<float> scores(int64_t{group} * kMaxTileRows, 0.0f);
    std::vector<float> c(int64_t{group} * kMaxTileRows, 0.0f);
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      const int32_t t = static_cast<int32_t>(item / shape.n_kv_heads);
      const int32_t g = static_cast<int32_t>(item % shape.n_kv_heads);
      const int64_t n = visible(t);
      if (n == 0) continue;
      const int64_t head0 = int64_t{t} * shape.n_heads + int64_t{g} * group;
      const float* qg = q + head0 * d;
      float* m = state.m.data() + head0;
      float* l = state.l.data() + head0;
      float* acc = state.acc.data() + head0 * d;
      if (o.kernel == AttentionKernel::kScalar) {
        AttendScalar(o, w, n, qg, group, g, m, l, acc);
      } else {
        AttendSimd(o, ctx, w, n, qg, group, g, m, l, acc, scores.data(), c.data());
      }
    }
  }
}

void FinishAttention(const AttentionState& state, float* out) {
  const int64_t heads = int64_t{state.n_tokens()} * state.shape().n_heads;
  const int32_t d = state.shape().head_dim;
  for (int64_t h = 0; h < heads; ++h) {
    const float l = state.l[h];
    for (int32_t i = 0; i < d; ++i) out[h * d + i] = l > 0.0f ? state.acc[h * d + i] / l : 0.0f;
  }
}

const char* AttentionSimdTarget() { return simd::DispatchedTargetName(); }

}  // namespace kvq
