// The position loops of attention over one window's rows (see attend_kernels.h).
#include "attention/attend_kernels.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "kvq/rope.h"

namespace kvq::attention_internal {
namespace {

// Where rows [r, r + n) of a view come from for the SIMD kernels: a tile that stays inside one
// block of a group codec and inside one run of the view (head rows, blocks or residual).
struct TileSource {
  const CodecKernels* kernels;
  const CodecArgs* args;
  RowTile tile;
};

// View row r's f32 row when it is a head or residual row, else null.
const float* F32Row(const RowsView& v, int64_t r) {
  if (r < v.n_head_rows) return v.head + r * v.args.shape.elems();
  if (r >= v.n_block_rows) return v.residual + (r - v.n_block_rows) * v.args.shape.elems();
  return nullptr;
}

// The longest tile starting at view row r (at most max_rows) that one kernel call can read.
TileSource TileAt(const RowsView& view, const CodecKernels& kernels, const CodecKernels& f32,
                  const CodecArgs& f32_args, int64_t r, int32_t max_rows) {
  if (const float* x = F32Row(view, r)) {  // f32 head (sinks) or residual rows
    const int64_t row_bytes = view.args.shape.elems() * 4;
    const int64_t run_end = r < view.n_head_rows ? view.n_head_rows : view.n_rows;
    const int64_t n = std::min<int64_t>(max_rows, run_end - r);
    return {&f32, &f32_args, {reinterpret_cast<const uint8_t*>(x), row_bytes, 0, static_cast<int32_t>(n)}};
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

// View row r (all heads) as f32 into out ([n_kv_heads][head_dim]): a copy of a head or residual
// row, else the codec's decode_row.
void DecodeViewRow(const RowsView& v, int64_t r, float* out) {
  if (const float* x = F32Row(v, r)) {
    std::copy_n(x, v.args.shape.elems(), out);
    return;
  }
  const int64_t stored = v.first_row + r;
  const int32_t per_block = v.codec->rows_per_block;
  v.codec->decode_row(v.blocks + (stored / per_block) * v.codec->block_bytes(v.args.shape),
                      static_cast<int32_t>(stored % per_block), out, v.args);
}

// Window row r of pre-RoPE keys, KV heads [g0, g1), decoded and roped at its absolute position
// into row ([n_kv_heads][head_dim]; other heads hold their decoded, unroped numbers). ApplyRope
// rotates each head the same whatever heads share the call, so the bits depend on the row only.
void RopedKeyRow(const KvWindow& w, int64_t r, int32_t g0, int32_t g1, float* row) {
  const int32_t d = w.k.args.shape.head_dim;
  DecodeViewRow(w.k, r, row);
  ApplyRope(row + int64_t{g0} * d, (g1 - g0) * d, d, w.first_position + r, *w.key_rope);
}

// Reference dot / axpy of view row r, head h: the codec's own for block rows, plain f32 for head
// and residual rows (summed in the same order as the codec's reference dot).
float RowDot(const RowsView& v, const float* q, int64_t r, int32_t h) {
  const int32_t d = v.args.shape.head_dim;
  if (const float* row = F32Row(v, r)) {
    const float* x = row + int64_t{h} * d;
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
  if (const float* row = F32Row(v, r)) {
    const float* x = row + int64_t{h} * d;
    for (int32_t i = 0; i < d; ++i) acc[i] += w * x[i];
    return;
  }
  const int64_t stored = v.first_row + r;
  const int32_t per_block = v.codec->rows_per_block;
  v.codec->axpy(w, v.blocks + (stored / per_block) * v.codec->block_bytes(v.args.shape),
                static_cast<int32_t>(stored % per_block), h, acc, v.args);
}

// Σ_i q[i]·x[i] in f32, in order of i: the reference dot of an f32 row (RowDot's own sum).
float F32Dot(const float* q, const float* x, int32_t d) {
  float sum = 0.0f;
  for (int32_t i = 0; i < d; ++i) sum += q[i] * x[i];
  return sum;
}

}  // namespace

void AttendScalar(const AttentionOptions& o, const KvWindow& w, int64_t r0, int64_t r1, const float* q,
                  int32_t n_q, int32_t kv_head, float* m, float* l, float* acc, float* rope_row) {
  const int32_t d = w.k.args.shape.head_dim;
  // [head_dim]: this head of rope_row (null without key_rope: no offset may be applied to null)
  const float* roped = w.key_rope != nullptr ? rope_row + int64_t{kv_head} * d : nullptr;
  for (int64_t r = r0; r < r1; ++r) {
    if (w.key_rope != nullptr) RopedKeyRow(w, r, kv_head, kv_head + 1, rope_row);
    for (int32_t h = 0; h < n_q; ++h) {
      float s = o.scale * (w.key_rope != nullptr ? F32Dot(q + h * d, roped, d)
                                                 : RowDot(w.k, q + h * d, r, kv_head));
      if (o.softcap > 0.0f) s = o.softcap * std::tanh(s / o.softcap);
      if (s == -INFINITY) continue;  // adds nothing; (−inf) − (−inf) must not reach exp
      const float next = s > m[h] ? s : m[h];
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

namespace {

// Asks for the bytes of KV heads [g0, g1) of view rows [r, r + n) ahead of use. Each head's
// bytes are the same share of a block in every codec (heads are stored in order), so the range is
// proportional. Rows of one position are far apart when the work is split by head (the row holds
// every head), which defeats the hardware prefetcher; this restores streaming speed.
void PrefetchRows(const RowsView& v, int64_t r, int64_t n, int32_t g0, int32_t g1) {
  if (r < v.n_head_rows) {  // head rows are f32 in host memory; prefetch the blocks after them
    n -= v.n_head_rows - r;
    r = v.n_head_rows;
  }
  n = std::min(n, v.n_block_rows - r);
  if (n <= 0) return;
  const int64_t bb = v.codec->block_bytes(v.args.shape);
  const int32_t h = v.args.shape.n_kv_heads;
  const int64_t begin = bb * g0 / h, end = bb * g1 / h;
  const int32_t per = v.codec->rows_per_block;
  const int64_t first_block = (v.first_row + r) / per;
  const int64_t n_blocks = (v.first_row + r + n - 1) / per - first_block + 1;
  const uint8_t* block = v.blocks + first_block * bb;
  for (int64_t b = 0; b < n_blocks; ++b, block += bb) {
    for (int64_t off = begin; off < end; off += 64) __builtin_prefetch(block + off);
  }
}

// The K and V tiles starting at window row r (the same rows, at most kMaxTileRows, none past
// `end`). The caller prefetches the next tile (PrefetchRows).
std::pair<TileSource, TileSource> NextTiles(const SimdContext& ctx, const KvWindow& w, int64_t r, int64_t end,
                                            int32_t g0, int32_t g1) {
  const int32_t max_rows = static_cast<int32_t>(std::min<int64_t>(kMaxTileRows, end - r));
  TileSource vs = TileAt(w.v, *ctx.v, *ctx.f32, ctx.f32_args, r, max_rows);
  TileSource ks;
  if (w.key_rope != nullptr) {  // the V tile's rows, each K row decoded and roped on its own
    const int64_t elems = w.k.args.shape.elems();
    for (int32_t i = 0; i < vs.tile.n_rows; ++i) RopedKeyRow(w, r + i, g0, g1, ctx.rope_rows + i * elems);
    ks = {ctx.f32, &ctx.f32_args,
          {reinterpret_cast<const uint8_t*>(ctx.rope_rows), elems * 4, 0, vs.tile.n_rows}};
  } else {
    ks = TileAt(w.k, *ctx.k, *ctx.f32, ctx.f32_args, r, max_rows);
  }
  const int32_t rows = std::min(ks.tile.n_rows, vs.tile.n_rows);
  ks.tile.n_rows = rows;
  vs.tile.n_rows = rows;
  return {ks, vs};
}

// The query rows of one AttendSimd / AttendRowsSimd call, scored against each K tile: from
// ctx.prepared_q for tiles of the K codec that can prepare a query (prepared on the first such
// tile, once per call), else through the tile's own `score`. Either way the same bits.
class CallQuery {
 public:
  CallQuery(const SimdContext& ctx, const KvWindow& w, const float* q, int32_t n_q)
      : ctx_(ctx), args_(w.k.args), q_(q), n_q_(n_q),
        head_bytes_(ctx.prepared_q != nullptr ? ctx.k->prepared_head_bytes(w.k.args) : 0) {}

  // Rows [first, first + n) of the call's query against the tile ks.
  void Score(const TileSource& ks, int32_t first, int32_t n, int32_t kv_head, float* scores) {
    const int32_t d = args_.shape.head_dim;
    if (head_bytes_ == 0 || ks.kernels != ctx_.k) {
      ks.kernels->score(q_ + int64_t{first} * d, n, ks.tile, kv_head, *ks.args, scores);
      return;
    }
    if (!prepared_) {
      ctx_.k->prepare_query(q_, n_q_, args_, ctx_.prepared_q);
      prepared_ = true;
    }
    ctx_.k->score_prepared(ctx_.prepared_q + first * head_bytes_, n, ks.tile, kv_head, *ks.args, scores);
  }

 private:
  const SimdContext& ctx_;
  const CodecArgs& args_;
  const float* q_;  // [n_q][head_dim]
  int32_t n_q_;
  int64_t head_bytes_;  // 0: no prepared query
  bool prepared_ = false;
};

}  // namespace

void AttendSimd(const AttentionOptions& o, const SimdContext& ctx, const KvWindow& w, int64_t r0, int64_t r1,
                int32_t group, int32_t g0, int32_t g1, const float* q, float* m, float* l,
                float* acc, float* scores, float* c) {
  const int32_t d = w.k.args.shape.head_dim;
  CallQuery query(ctx, w, q + int64_t{g0} * group * d, (g1 - g0) * group);  // heads of KV heads [g0, g1)
  for (int64_t r = r0; r < r1;) {
    const auto [ks, vs] = NextTiles(ctx, w, r, r1, g0, g1);
    const int32_t rows = ks.tile.n_rows;
    const int64_t ahead = std::min<int64_t>(kMaxTileRows, r1 - r - rows);
    for (int32_t g = g0; g < g1; ++g) {
      const int64_t h0 = int64_t{g} * group;
      // The next tile's rows of this head, K before its score and V before its softmax: spread
      // over the heads' work rather than asked for all at once, since a burst of more lines
      // than the core has fill buffers for stalls the prefetching loop until memory catches up
      // (docs/performance.md has the before/after; no bit depends on it).
      PrefetchRows(w.k, r + rows, ahead, g, g + 1);
      query.Score(ks, (g - g0) * group, group, g, scores);
      PrefetchRows(w.v, r + rows, ahead, g, g + 1);
      ctx.softmax(scores, c, group, rows, o.scale, o.softcap, m + h0, l + h0);
      vs.kernels->accumulate(c, scores, group, vs.tile, g, *vs.args, acc + h0 * d);
    }
    r += rows;
  }
}

void AttendRowsSimd(const AttentionOptions& o, const SimdContext& ctx, const KvWindow& w, int64_t r0,
                    int64_t r1, int32_t g, int32_t n_q, int32_t chunk, const float* q, float* m,
                    float* l, float* acc, float* scores, float* c) {
  const int32_t d = w.k.args.shape.head_dim;
  CallQuery query(ctx, w, q, n_q);
  for (int64_t r = r0; r < r1;) {
    const auto [ks, vs] = NextTiles(ctx, w, r, r1, g, g + 1);
    const int32_t rows = ks.tile.n_rows;
    const int64_t ahead = std::min<int64_t>(kMaxTileRows, r1 - r - rows);
    PrefetchRows(w.k, r + rows, ahead, g, g + 1);
    PrefetchRows(w.v, r + rows, ahead, g, g + 1);
    for (int32_t h = 0; h < n_q; h += chunk) {
      const int32_t nh = std::min(chunk, n_q - h);
      query.Score(ks, h, nh, g, scores);
      ctx.softmax(scores, c, nh, rows, o.scale, o.softcap, m + h, l + h);
      vs.kernels->accumulate(c, scores, nh, vs.tile, g, *vs.args, acc + int64_t{h} * d);
    }
    r += rows;
  }
}

}  // namespace kvq::attention_internal
