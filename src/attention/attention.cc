// AttendWindows: the window driver (see kvq/attention.h). Work is split into (query block, run of
// KV heads) items, and the items into one share per thread, in a single thread-pool job
// per call; each share walks every window in order and, within a window, each item's positions up
// to its queries' own, either one at a time through the codecs' reference dot/axpy (kScalar, one
// token per item) or in tiles through the codecs' SIMD kernels (kSimd), each tile once for all the
// block's query rows. Positions are never split across threads, so no partial states are merged
// and the result depends neither on the thread count, nor on the windows, nor on the block.
// Pre-RoPE keys (KvWindow::key_rope) are decoded row by row into the share's scratch, roped at
// their absolute positions and scored from there with the f32 kernels (or the f32 reference dot).
#include "kvq/attention.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <memory>
#include <mutex>
#include <utility>

#include "attention/softmax_tile.h"
#include "base/thread_pool.h"
#include "formats/f32/f32.h"
#include "simd/dispatch.h"

namespace kvq {
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

// One (query token, KV head) item, reference kernel: positions [0, n) of the window, in order.
// rope_row: [n_kv_heads][head_dim] scratch for pre-RoPE keys.
void AttendScalar(const AttentionOptions& o, const KvWindow& w, int64_t n, const float* q,
                  int32_t n_q, int32_t kv_head, float* m, float* l, float* acc, float* rope_row) {
  const int32_t d = w.k.args.shape.head_dim;
  // [head_dim]: this head of rope_row (null without key_rope: no offset may be applied to null)
  const float* roped = w.key_rope != nullptr ? rope_row + int64_t{kv_head} * d : nullptr;
  for (int64_t r = 0; r < n; ++r) {
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

// Query rows per score/softmax/accumulate call in a block: a multiple of 4 (see BlockRow), and
// small enough that the call's q, acc, scores and c ([32][128] f32 each at most) stay in L1.
constexpr int32_t kBlockRowsPerCall = 32;

struct SimdContext {
  const CodecKernels* k;
  const CodecKernels* v;
  const CodecKernels* f32;
  CodecArgs f32_args;
  attention_internal::SoftmaxTileFn softmax;
  float* rope_rows;  // [kMaxTileRows][n_kv_heads][head_dim]: a K tile of pre-RoPE keys, roped
};

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
// `end`), with the next tile's bytes of KV heads [g0, g1) prefetched.
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
  const int64_t ahead = std::min<int64_t>(kMaxTileRows, end - r - rows);
  PrefetchRows(w.k, r + rows, ahead, g0, g1);
  PrefetchRows(w.v, r + rows, ahead, g0, g1);
  return {ks, vs};
}

// One (query token, KV heads [g0, g1)) item, SIMD kernel: tiles of up to kMaxTileRows positions;
// within a tile, every head of the item, so each tile's rows are read while they are in cache.
void AttendSimd(const AttentionOptions& o, const SimdContext& ctx, const KvWindow& w, int64_t n,
                int32_t group, int32_t g0, int32_t g1, const float* q, float* m, float* l,
                float* acc, float* scores, float* c) {
  const int32_t d = w.k.args.shape.head_dim;
  for (int64_t r = 0; r < n;) {
    const auto [ks, vs] = NextTiles(ctx, w, r, n, g0, g1);
    const int32_t rows = ks.tile.n_rows;
    for (int32_t g = g0; g < g1; ++g) {
      const int64_t h0 = int64_t{g} * group;
      ks.kernels->score(q + h0 * d, group, ks.tile, g, *ks.args, scores);
      ctx.softmax(scores, c, group, rows, o.scale, o.softcap, m + h0, l + h0);
      vs.kernels->accumulate(c, scores, group, vs.tile, g, *vs.args, acc + h0 * d);
    }
    r += rows;
  }
}

// Rows [r0, r1) of the window for n_q query rows of KV head g, `chunk` rows per kernel call.
// q, acc: [n_q][head_dim]; m, l: [n_q]; scores, c: [chunk][kMaxTileRows]. The per-(row,
// position) operations are those of AttendSimd; only which rows share a call differs.
void AttendRowsSimd(const AttentionOptions& o, const SimdContext& ctx, const KvWindow& w, int64_t r0,
                    int64_t r1, int32_t g, int32_t n_q, int32_t chunk, const float* q, float* m,
                    float* l, float* acc, float* scores, float* c) {
  const int32_t d = w.k.args.shape.head_dim;
  for (int64_t r = r0; r < r1;) {
    const auto [ks, vs] = NextTiles(ctx, w, r, r1, g, g + 1);
    const int32_t rows = ks.tile.n_rows;
    for (int32_t h = 0; h < n_q; h += chunk) {
      const int32_t nh = std::min(chunk, n_q - h);
      ks.kernels->score(q + int64_t{h} * d, nh, ks.tile, g, *ks.args, scores);
      ctx.softmax(scores, c, nh, rows, o.scale, o.softcap, m + h, l + h);
      vs.kernels->accumulate(c, scores, nh, vs.tile, g, *vs.args, acc + int64_t{h} * d);
    }
    r += rows;
  }
}

// Where query head k (< group) of token t (< nb) of a block sits among the block's rows. The score
// kernel reduces heads [0, 4·⌊n_q/4⌋) of a call four at a time and the rest one at a time
// (format.h), so the per-token path reduces a token's heads [0, g4 = 4·⌊group/4⌋) four at a time
// and its last group − g4 alone. The block keeps each head in its class: the g4 heads of every
// token first ([nb][g4], called kBlockRowsPerCall rows at a time), then the rest ([nb][group −
// g4], called two at a time, which the kernel reduces alone).
struct BlockRows {
  int32_t nb, group, g4;
  int64_t Row(int32_t t, int32_t k) const {
    return k < g4 ? int64_t{t} * g4 + k : int64_t{nb} * g4 + int64_t{t} * (group - g4) + (k - g4);
  }
};

}  // namespace

// The windows a source hands out are shared by the threads of one call: the first thread to
// reach window i acquires it (one at a time: `acquiring`), the others read it from `windows` once
// `acquired` passes i, and the last thread through window i releases it.
struct AttentionState::Scratch {
  ThreadPool* pool = nullptr;  // AttentionOptions::pool, or ThreadPool::Shared(pool_threads) looked up once per count
  int32_t pool_threads = 0;
  std::vector<float> tiles;       // [shares][2][group][kMaxTileRows]: SIMD scores/e, then c
  // [shares][BlockFloats]: a query block's q, acc ([block·group][head_dim] each), m, l
  // ([block·group] each), scores/e and c ([kBlockRowsPerCall][kMaxTileRows] each).
  std::vector<float> block;
  int64_t block_floats = 0;  // per share
  // [shares][kMaxTileRows][n_kv_heads][head_dim]: each share's pre-RoPE key tile, roped; sized by
  // the share itself on its first window with KvWindow::key_rope.
  std::vector<std::vector<float>> rope_rows;
  std::vector<KvWindow> windows;  // [n_windows] of the current call
  std::unique_ptr<std::atomic<int32_t>[]> users;  // [users_capacity]: threads not done with window i
  int64_t users_capacity = 0;
  std::mutex acquire_mu;
  std::condition_variable acquire_cv;  // a window was acquired, or failed
  std::atomic<int64_t> acquired{0};    // windows [0, acquired) are in `windows`
  bool acquiring = false;              // under acquire_mu: a share is in Acquire
  int64_t failed_at = -1;              // under acquire_mu: the window whose Acquire failed
  Status error;
};

AttentionState::ScratchSlot::~ScratchSlot() { delete scratch_; }

AttentionState::Scratch& AttentionState::ScratchSlot::Get() {
  if (scratch_ == nullptr) scratch_ = new Scratch();
  return *scratch_;
}

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

namespace {

// One AttendWindows call: the split into items and shares, and what each share does.
struct WindowsCall {
  const AttentionOptions& o;
  const float* q;
  int64_t first_query_position;
  KvWindowSource& source;
  AttentionState& state;
  AttentionState::Scratch& scratch;
  attention_internal::SoftmaxTileFn softmax;
  int32_t group, runs, shares;
  int32_t query_block;  // tokens per item (1: the per-token path)
  int64_t items;

  // Window i, acquired by whichever share gets here first; nullptr once an Acquire has failed.
  // No lock is held while Acquire waits for a page: a share still on an earlier window must be
  // able to finish it (that frees the slot the page is waiting for), so shares that need window
  // i wait on acquire_cv, and shares on earlier windows never wait at all.
  const KvWindow* Get(int64_t i) {
    if (scratch.acquired.load(std::memory_order_acquire) > i) return &scratch.windows[i];
    std::unique_lock<std::mutex> lock(scratch.acquire_mu);
    for (;;) {
      // Another share may have acquired window i meanwhile, and even failed on a later window
      // since: window i is still this share's to attend.
      if (scratch.acquired.load(std::memory_order_relaxed) > i) return &scratch.windows[i];
      if (scratch.failed_at >= 0) return nullptr;
      if (!scratch.acquiring) break;
      scratch.acquire_cv.wait(lock);
    }
    // Shares walk windows in order, so every window before i is acquired: this one is next.
    scratch.acquiring = true;
    lock.unlock();
    Result<KvWindow> w = source.Acquire(i);
    lock.lock();
    scratch.acquiring = false;
    const KvWindow* got = nullptr;
    if (w.ok()) {
      scratch.windows[i] = *w;
      scratch.acquired.store(i + 1, std::memory_order_release);
      got = &scratch.windows[i];
    } else {
      scratch.failed_at = i;
      scratch.error = w.status();
    }
    scratch.acquire_cv.notify_all();
    return got;
  }

  // Causal: token t sees window rows [0, n).
  int64_t SeenRows(const KvWindow& w, int32_t t) const {
    return std::clamp<int64_t>(first_query_position + t - w.first_position + 1, 0, w.k.n_rows);
  }

  // Item (query block, KV heads of run `run`) over one window: AttendWindow's work for it.
  void AttendItem(const KvWindow& w, const SimdContext& ctx, int64_t item, float* tiles, float* block) {
    const int32_t b = static_cast<int32_t>(item / runs);
    const int32_t run = static_cast<int32_t>(item % runs);
    const int32_t t0 = b * query_block;
    const int32_t nb = std::min(query_block, state.n_tokens() - t0);
    if (nb == 1) {
      AttendToken(w, ctx, t0, run, tiles);
    } else {
      AttendBlock(w, ctx, t0, nb, run, block);
    }
  }

  // Token t, KV heads of run `run`: the per-token path (decode's).
  void AttendToken(const KvWindow& w, const SimdContext& ctx, int32_t t, int32_t run, float* tiles) {
    const AttentionShape shape = state.shape();
    const int32_t d = shape.head_dim;
    const int64_t n = SeenRows(w, t);
    if (run == 0) state.attended[t] += n;  // one item per token counts it
    if (n == 0) return;
    const int32_t g0 = shape.n_kv_heads * run / runs, g1 = shape.n_kv_heads * (run + 1) / runs;
    const int64_t token_head0 = int64_t{t} * shape.n_heads;
    const float* qt = q + token_head0 * d;
    float* m = state.m.data() + token_head0;
    float* l = state.l.data() + token_head0;
    float* acc = state.acc.data() + token_head0 * d;
    if (o.kernel == AttentionKernel::kScalar) {
      for (int32_t g = g0; g < g1; ++g) {
        const int64_t h0 = int64_t{g} * group;
        AttendScalar(o, w, n, qt + h0 * d, group, g, m + h0, l + h0, acc + h0 * d, ctx.rope_rows);
      }
    } else {
      AttendSimd(o, ctx, w, n, group, g0, g1, qt, m, l, acc, tiles, tiles + group * kMaxTileRows);
    }
  }

  // Tokens [t0, t0 + nb), KV heads of run `run` (kSimd): per KV head, the block's state is
  // gathered into `block`, rows every token sees are done once for all nb·group query rows, the
  // diagonal rows (seen by the later tokens only) per token, and the state is scattered back.
  // Each (query, head) meets the same positions in the same order, with the same operations, as
  // in AttendToken.
  void AttendBlock(const KvWindow& w, const SimdContext& ctx, int32_t t0, int32_t nb, int32_t run,
                   float* block) {
    const AttentionShape shape = state.shape();
    const int32_t d = shape.head_dim;
    if (run == 0) {
      for (int32_t t = 0; t < nb; ++t) state.attended[t0 + t] += SeenRows(w, t0 + t);
    }
    const int64_t n_all = SeenRows(w, t0);  // rows [0, n_all) are seen by every token
    if (SeenRows(w, t0 + nb - 1) == 0) return;
    const BlockRows br{nb, group, group / 4 * 4};
    const int32_t rest = group - br.g4;
    const int64_t rows = int64_t{nb} * group;
    float* bq = block;                    // [rows][d]
    float* bacc = bq + rows * d;          // [rows][d]
    float* bm = bacc + rows * d;          // [rows]
    float* bl = bm + rows;                // [rows]
    float* scores = bl + rows;            // [kBlockRowsPerCall][kMaxTileRows]
    float* c = scores + kBlockRowsPerCall * kMaxTileRows;
    const int32_t g0 = shape.n_kv_heads * run / runs, g1 = shape.n_kv_heads * (run + 1) / runs;
    for (int32_t g = g0; g < g1; ++g) {
      for (int32_t t = 0; t < nb; ++t) {
        for (int32_t k = 0; k < group; ++k) {
          const int64_t src = int64_t{t0 + t} * shape.n_heads + int64_t{g} * group + k;
          const int64_t dst = br.Row(t, k);
          std::copy_n(q + src * d, d, bq + dst * d);
          std::copy_n(state.acc.data() + src * d, d, bacc + dst * d);
          bm[dst] = state.m[src];
          bl[dst] = state.l[src];
        }
      }
      // Rows of the four-at-a-time class start at row 0, the rest at nb·g4 (BlockRows).
      auto attend = [&](int64_t r0, int64_t r1, int64_t row, int32_t n_q, int32_t chunk) {
        if (r1 > r0 && n_q > 0) {
          AttendRowsSimd(o, ctx, w, r0, r1, g, n_q, chunk, bq + row * d, bm + row, bl + row,
                         bacc + row * d, scores, c);
        }
      };
      attend(0, n_all, 0, nb * br.g4, kBlockRowsPerCall);
      attend(0, n_all, br.Row(0, br.g4), nb * rest, 2);
      for (int32_t t = 1; t < nb; ++t) {
        const int64_t n = SeenRows(w, t0 + t);
        attend(n_all, n, br.Row(t, 0), br.g4, kBlockRowsPerCall);
        attend(n_all, n, br.Row(t, br.g4), rest, 2);
      }
      for (int32_t t = 0; t < nb; ++t) {
        for (int32_t k = 0; k < group; ++k) {
          const int64_t dst = int64_t{t0 + t} * shape.n_heads + int64_t{g} * group + k;
          const int64_t src = br.Row(t, k);
          std::copy_n(bacc + src * d, d, state.acc.data() + dst * d);
          state.m[dst] = bm[src];
          state.l[dst] = bl[src];
        }
      }
    }
  }

  // Share s over every window, in order: items [items·s/shares, items·(s+1)/shares), or with
  // query blocks items s, s + shares, s + 2·shares, ...
  void RunShare(int64_t s) {
    const bool strided = query_block > 1;
    const int64_t begin = strided ? s : items * s / shares;
    const int64_t end = strided ? items : items * (s + 1) / shares;
    const int64_t step = strided ? shares : 1;
    float* tiles = scratch.tiles.data() + s * 2 * group * kMaxTileRows;
    float* block = query_block > 1 ? scratch.block.data() + s * scratch.block_floats : nullptr;
    const int64_t n_windows = source.n_windows();
    for (int64_t i = 0; i < n_windows; ++i) {
      const KvWindow* w = Get(i);
      if (w == nullptr) return;
      const AttentionShape shape = state.shape();
      assert(w->k.n_rows == w->v.n_rows);
      assert(w->k.args.shape.head_dim == shape.head_dim && w->k.args.shape.n_kv_heads == shape.n_kv_heads);
      (void)shape;
      SimdContext ctx{};
      if (o.kernel == AttentionKernel::kSimd) {
        ctx = {&w->k.codec->kernels(), &w->v.codec->kernels(), &F32Format().key.kernels(),
               CodecArgs{.shape = w->k.args.shape}, softmax, nullptr};
      }
      if (w->key_rope != nullptr) {
        std::vector<float>& rows = scratch.rope_rows[s];
        const size_t floats = size_t{kMaxTileRows} * w->k.args.shape.elems();
        if (rows.size() < floats) rows.resize(floats, 0.0f);
        ctx.rope_rows = rows.data();
      }
      for (int64_t item = begin; item < end; item += step) AttendItem(*w, ctx, item, tiles, block);
      if (scratch.users[i].fetch_sub(1, std::memory_order_acq_rel) == 1) source.Release(i);
    }
  }
};

// A single window as a source.
class OneWindow final : public KvWindowSource {
 public:
  explicit OneWindow(const KvWindow& w) : w_(w) {}
  int64_t n_windows() const override { return 1; }
  Result<KvWindow> Acquire(int64_t) override { return w_; }

 private:
  const KvWindow& w_;
};

}  // namespace

Status AttendWindows(const AttentionOptions& o, const float* q, int64_t first_query_position,
                     KvWindowSource& source, AttentionState& state) {
  const AttentionShape shape = state.shape();
  assert(shape.n_heads % shape.n_kv_heads == 0);
  AttentionState::Scratch& scratch = state.scratch_.Get();
  const int32_t threads = o.pool != nullptr ? o.pool->threads() : std::max(1, o.threads);
  if (o.pool != nullptr) {
    scratch.pool = o.pool;
    scratch.pool_threads = 0;  // not a Shared pool: the next call without one looks its up
  } else if (scratch.pool_threads != threads) {
    scratch.pool = &ThreadPool::Shared(threads);
    scratch.pool_threads = threads;
  }
  const int32_t group = shape.n_heads / shape.n_kv_heads;
  const int32_t n_tokens = state.n_tokens();
  // Items: (query block, a run of KV heads). The scalar reference takes one token and one head
  // per item; the SIMD kernel gives each thread a run of heads so a tile's rows are read once per
  // thread, and a block of query tokens so they are read once per block.
  const int32_t query_block =
      o.kernel == AttentionKernel::kScalar
          ? 1
          : std::clamp(o.query_block > 0 ? o.query_block : kDefaultQueryBlock, 1, std::max(1, n_tokens));
  const int32_t n_blocks = (n_tokens + query_block - 1) / query_block;
  // A block walks its KV heads one at a time anyway, so block items take one head each, and
  // shares take every shares-th item (RunShare): causal blocks late in a prompt see more rows,
  // and striding spreads them over the threads.
  const int32_t runs = o.kernel == AttentionKernel::kScalar || query_block > 1
                           ? shape.n_kv_heads
                           : std::min(shape.n_kv_heads, std::max(1, threads / std::max(1, n_blocks)));
  const int64_t items = int64_t{n_blocks} * runs;
  // Shares: contiguous runs of items, one per pool thread at most; each walks all windows.
  const int32_t shares = static_cast<int32_t>(std::clamp<int64_t>(items, 1, scratch.pool->threads()));
  const int64_t n_windows = source.n_windows();

  // Scratch grows to the largest call seen and is reused after that.
  const size_t tile_floats = size_t{2} * shares * group * kMaxTileRows;
  if (scratch.tiles.size() < tile_floats) scratch.tiles.resize(tile_floats, 0.0f);
  if (query_block > 1) {
    const int64_t rows = int64_t{query_block} * group;
    scratch.block_floats = 2 * rows * shape.head_dim + 2 * rows + 2 * kBlockRowsPerCall * kMaxTileRows;
    const size_t block_floats = static_cast<size_t>(shares * scratch.block_floats);
    if (scratch.block.size() < block_floats) scratch.block.resize(block_floats, 0.0f);
  }
  if (static_cast<int64_t>(scratch.windows.size()) < n_windows) scratch.windows.resize(n_windows);
  if (static_cast<int32_t>(scratch.rope_rows.size()) < shares) scratch.rope_rows.resize(shares);
  if (scratch.users_capacity < n_windows) {
    scratch.users = std::make_unique<std::atomic<int32_t>[]>(n_windows);
    scratch.users_capacity = n_windows;
  }
  for (int64_t i = 0; i < n_windows; ++i) scratch.users[i].store(shares, std::memory_order_relaxed);
  scratch.acquired.store(0, std::memory_order_relaxed);
  scratch.acquiring = false;
  scratch.failed_at = -1;
  scratch.error = Status::Ok();

  WindowsCall call{o, q, first_query_position, source, state, scratch,
                   o.kernel == AttentionKernel::kSimd ? attention_internal::SoftmaxTileForThisCpu() : nullptr,
                   group, runs, shares, query_block, items};
  // One job for the whole call; the lambda holds one reference, so std::function keeps it inline.
  scratch.pool->Run(shares, [&call](int64_t share, int32_t) { call.RunShare(share); });
  return scratch.error;
}

void AttendWindow(const AttentionOptions& o, const float* q, int64_t first_query_position,
                  const KvWindow& w, AttentionState& state) {
  OneWindow source(w);
  const Status s = AttendWindows(o, q, first_query_position, source, state);
  assert(s.ok());  // a single window in memory cannot fail to arrive
  (void)s;
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
