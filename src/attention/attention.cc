// AttendWindows: the window driver (see kvq/attention.h). Work is split into items — (query block,
// run of KV heads) pairs, or, when those are fewer than the threads or (decode) when the positions
// divide evenly among them, (query block, run of KV heads, position chunk) triples — and the items
// into one share per thread (contiguous, of about equal positions: SplitByRows), in a single
// thread-pool job per call; each share walks every window in order and, within a window, each
// item's positions up to its queries' own, either one at a time through the codecs' reference
// dot/axpy (kScalar, one token per item) or in tiles through the codecs' SIMD kernels (kSimd), each
// tile once for all the block's query rows (attend_kernels.h). An item that spans chunks folds its
// open chunk into the merged state as it crosses into the next; chunk items after the call's first
// fill states of their own, merged into the state in chunk order after the dispatch — the same
// merges in the same order either way, so the result depends neither on the thread count, nor on
// the windows, nor on the block, only on the chunk size. Pre-RoPE keys (KvWindow::key_rope) are
// decoded row by row into the share's scratch, roped at their absolute positions and scored from
// there with the f32 kernels (or the f32 reference dot).
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

#include "attention/attend_kernels.h"
#include "attention/chunk_merge.h"
#include "attention/softmax_tile.h"
#include "base/thread_pool.h"
#include "formats/f32/f32.h"
#include "simd/dispatch.h"

namespace kvq {
namespace {

using attention_internal::kBlockRowsPerCall;
using attention_internal::SimdContext;

// Chunk states of their own take at most this many floats; past it (a long prompt block at a long
// context on few KV heads) items keep whole query blocks and fold their chunks in turn.
constexpr int64_t kMaxChunkStateFloats = int64_t{1} << 24;  // 64 MiB

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

// A chunked call's shares may take at most this much more work than the mean (decode: else its
// KV heads are split among the threads, evenly).
constexpr double kMaxShareImbalance = 1.125;

// Contiguous shares of items [0, chunk_items · pair_items) (item = chunk j · pair_items + pair,
// run = pair % runs) with about equal work, weighed as the positions of chunk first_chunk + j
// in [first_position, last_query] times the run's KV heads: bounds [shares + 1] of item indices.
// Returns the largest share's work over the mean (1: even).
double SplitByRows(int64_t first_position, int64_t last_query, int64_t chunk, int64_t first_chunk,
                   int64_t chunk_items, int64_t pair_items, int32_t runs, int32_t n_kv_heads, int32_t shares,
                   std::vector<int64_t>& bounds) {
  const int64_t items = chunk_items * pair_items;
  const auto work = [&](int64_t item) {
    const int64_t c = first_chunk + item / pair_items;
    const int64_t run = item % pair_items % runs;
    const int64_t rows = std::min(last_query + 1, (c + 1) * chunk) - std::max(first_position, c * chunk);
    return rows * (n_kv_heads * (run + 1) / runs - n_kv_heads * run / runs);
  };
  int64_t total = 0;
  for (int64_t i = 0; i < items; ++i) total += work(i);
  bounds.assign(static_cast<size_t>(shares) + 1, items);
  bounds[0] = 0;
  int64_t done = 0, largest = 0, item = 0;
  for (int32_t s = 1; s <= shares; ++s) {
    // Share s − 1 takes items while that brings its end nearer to s/shares of the work.
    const int64_t start = done;
    const double goal = static_cast<double>(total) * s / shares;
    while (item < items && (s == shares || std::abs(done + work(item) - goal) <= std::abs(done - goal))) {
      done += work(item++);
    }
    bounds[s] = item;
    largest = std::max(largest, done - start);
  }
  return total > 0 ? static_cast<double>(largest) * shares / static_cast<double>(total) : 1.0;
}

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
  // [shares][lines][64] bytes: each share's query rows prepared for its K codec's tiles
  // (SimdContext::prepared_q), at most max(n_heads, query_block·group) rows of the codec's
  // prepared_head_bytes; sized by the share itself on its first window whose K codec has one.
  struct alignas(64) Line {
    uint8_t bytes[64];
  };
  std::vector<std::vector<Line>> prepared_q;
  // The states of a call's chunks after its first, when chunks are items of their own: m, l
  // [chunks − 1][n_tokens][n_heads], acc [chunks − 1][n_tokens][n_heads][head_dim].
  std::vector<float> chunk_m, chunk_l, chunk_acc;
  std::vector<int64_t> share_bounds;  // [shares + 1]: SplitByRows's item bounds (empty: items·s/shares)
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
  int64_t chunk;        // positions per chunk
  int64_t first_chunk;  // the chunk of window 0's first position
  // Chunks that are items of their own: 1 (each item walks all its chunks, folding as it crosses
  // into the next) or every chunk the call can reach, first_chunk + [0, chunk_items).
  int64_t chunk_items;
  int64_t pair_items;  // (query block, run) pairs: item = chunk index · pair_items + pair

  // Where an item accumulates and which positions it attends: chunk index 0 (or the only one)
  // continues the state's open chunk and folds it as it crosses into a new chunk; chunk j ≥ 1
  // fills its own state, from empty, merged after the dispatch (MergeChunkStates).
  struct Target {
    float* m;    // [n_tokens][n_heads]
    float* l;    // [n_tokens][n_heads]
    float* acc;  // [n_tokens][n_heads][head_dim]
    bool fold;
    int64_t begin, end;  // absolute positions
  };

  Target TargetOf(int64_t j) const {
    constexpr int64_t kAll = std::numeric_limits<int64_t>::max();
    const int64_t end = j + 1 < chunk_items ? (first_chunk + j + 1) * chunk : kAll;
    if (j == 0) return {state.m.data(), state.l.data(), state.acc.data(), true, 0, end};
    const int64_t heads = int64_t{state.n_tokens()} * state.shape().n_heads;
    const int64_t off = (j - 1) * heads;
    return {scratch.chunk_m.data() + off, scratch.chunk_l.data() + off,
            scratch.chunk_acc.data() + off * state.shape().head_dim, false, (first_chunk + j) * chunk, end};
  }

  // Rows [lo, hi) of window w within the target's positions and the first `seen` rows, in pieces
  // that stay inside one chunk: fn(a, b, starts_chunk), starts_chunk when row a is the first
  // position of a chunk other than chunk 0 (where the open state is folded).
  std::pair<int64_t, int64_t> RowsOf(const KvWindow& w, const Target& target, int64_t seen) const {
    const int64_t fp = w.first_position;
    return {std::clamp<int64_t>(target.begin - fp, 0, w.k.n_rows), std::min(seen, target.end - fp)};
  }
  template <class Fn>
  void ForEachPiece(const KvWindow& w, const Target& target, int64_t seen, Fn fn) const {
    const int64_t fp = w.first_position;
    const auto [lo, hi] = RowsOf(w, target, seen);
    for (int64_t a = lo; a < hi;) {
      const int64_t p = fp + a;
      const int64_t b = std::min(hi, (p / chunk + 1) * chunk - fp);
      fn(a, b, p % chunk == 0 && p > 0);
      a = b;
    }
  }

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

  // Item (chunk, query block, KV heads of run `run`) over one window: AttendWindow's work for it.
  void AttendItem(const KvWindow& w, const SimdContext& ctx, int64_t item, float* tiles, float* block) {
    const int64_t j = item / pair_items;
    const int32_t b = static_cast<int32_t>(item % pair_items / runs);
    const int32_t run = static_cast<int32_t>(item % pair_items % runs);
    const int32_t t0 = b * query_block;
    const int32_t nb = std::min(query_block, state.n_tokens() - t0);
    if (run == 0 && j == 0) {  // one item per token counts it
      for (int32_t t = t0; t < t0 + nb; ++t) state.attended[t] += SeenRows(w, t);
    }
    const Target target = TargetOf(j);
    if (nb == 1) {
      AttendToken(w, ctx, t0, run, target, tiles);
    } else {
      AttendBlock(w, ctx, t0, nb, run, target, block);
    }
  }

  // Token t, KV heads of run `run`: the per-token path (decode's).
  void AttendToken(const KvWindow& w, const SimdContext& ctx, int32_t t, int32_t run, const Target& target,
                   float* tiles) {
    const AttentionShape shape = state.shape();
    const int32_t d = shape.head_dim;
    const int32_t g0 = shape.n_kv_heads * run / runs, g1 = shape.n_kv_heads * (run + 1) / runs;
    const int64_t token_head0 = int64_t{t} * shape.n_heads;
    const float* qt = q + token_head0 * d;
    float* m = target.m + token_head0;
    float* l = target.l + token_head0;
    float* acc = target.acc + token_head0 * d;
    ForEachPiece(w, target, SeenRows(w, t), [&](int64_t a, int64_t b, bool starts_chunk) {
      if (starts_chunk && target.fold) {
        const int64_t h0 = token_head0 + int64_t{g0} * group;
        attention_internal::FoldOpenChunk(state.merged_m.data() + h0, state.merged_l.data() + h0,
                                          state.merged_acc.data() + h0 * d, target.m + h0, target.l + h0,
                                          target.acc + h0 * d, (g1 - g0) * group, d);
      }
      if (o.kernel == AttentionKernel::kScalar) {
        for (int32_t g = g0; g < g1; ++g) {
          const int64_t h0 = int64_t{g} * group;
          attention_internal::AttendScalar(o, w, a, b, qt + h0 * d, group, g, m + h0, l + h0, acc + h0 * d,
                                           ctx.rope_rows);
        }
      } else {
        attention_internal::AttendSimd(o, ctx, w, a, b, group, g0, g1, qt, m, l, acc, tiles,
                                       tiles + group * kMaxTileRows);
      }
    });
  }

  // Tokens [t0, t0 + nb), KV heads of run `run` (kSimd): per KV head, the block's state is
  // gathered into `block`, rows every token sees are done once for all nb·group query rows, the
  // diagonal rows (seen by the later tokens only) per token, and the state is scattered back.
  // Each (query, head) meets the same positions in the same order, with the same operations and
  // the same folds, as in AttendToken.
  void AttendBlock(const KvWindow& w, const SimdContext& ctx, int32_t t0, int32_t nb, int32_t run,
                   const Target& target, float* block) {
    const AttentionShape shape = state.shape();
    const int32_t d = shape.head_dim;
    const int64_t n_all = SeenRows(w, t0);  // rows [0, n_all) are seen by every token
    const int64_t n_last = SeenRows(w, t0 + nb - 1);
    if (const auto [lo, hi] = RowsOf(w, target, n_last); lo >= hi) return;
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
          std::copy_n(target.acc + src * d, d, bacc + dst * d);
          bm[dst] = target.m[src];
          bl[dst] = target.l[src];
        }
      }
      // Rows of the four-at-a-time class start at row 0, the rest at nb·g4 (BlockRows).
      auto attend = [&](int64_t r0, int64_t r1, int64_t row, int32_t n_q, int32_t chunk_rows) {
        if (r1 > r0 && n_q > 0) {
          attention_internal::AttendRowsSimd(o, ctx, w, r0, r1, g, n_q, chunk_rows, bq + row * d, bm + row,
                                             bl + row, bacc + row * d, scores, c);
        }
      };
      ForEachPiece(w, target, n_last, [&](int64_t a, int64_t b, bool starts_chunk) {
        if (starts_chunk && target.fold) {  // the tokens that see row a cross into its chunk
          for (int32_t t = 0; t < nb; ++t) {
            if (SeenRows(w, t0 + t) <= a) continue;
            for (int32_t k = 0; k < group; ++k) {
              const int64_t h = int64_t{t0 + t} * shape.n_heads + int64_t{g} * group + k;
              const int64_t r = br.Row(t, k);
              attention_internal::FoldOpenChunk(state.merged_m.data() + h, state.merged_l.data() + h,
                                                state.merged_acc.data() + h * d, bm + r, bl + r, bacc + r * d, 1, d);
            }
          }
        }
        const int64_t all_end = std::min(b, n_all);
        attend(a, all_end, 0, nb * br.g4, kBlockRowsPerCall);
        attend(a, all_end, br.Row(0, br.g4), nb * rest, 2);
        for (int32_t t = 1; t < nb; ++t) {
          const int64_t r0 = std::max(a, n_all), r1 = std::min(b, SeenRows(w, t0 + t));
          attend(r0, r1, br.Row(t, 0), br.g4, kBlockRowsPerCall);
          attend(r0, r1, br.Row(t, br.g4), rest, 2);
        }
      });
      for (int32_t t = 0; t < nb; ++t) {
        for (int32_t k = 0; k < group; ++k) {
          const int64_t dst = int64_t{t0 + t} * shape.n_heads + int64_t{g} * group + k;
          const int64_t src = br.Row(t, k);
          std::copy_n(bacc + src * d, d, target.acc + dst * d);
          target.m[dst] = bm[src];
          target.l[dst] = bl[src];
        }
      }
    }
  }

  // Share s over every window, in order: items [items·s/shares, items·(s+1)/shares), or
  // [share_bounds[s], share_bounds[s + 1]) when chunks are items (SplitByRows), or with query
  // blocks items s, s + shares, s + 2·shares, ...
  void RunShare(int64_t s) {
    const bool strided = query_block > 1;
    const bool weighted = !strided && !scratch.share_bounds.empty();
    const int64_t begin = strided ? s : weighted ? scratch.share_bounds[s] : items * s / shares;
    const int64_t end = strided ? items : weighted ? scratch.share_bounds[s + 1] : items * (s + 1) / shares;
    const int64_t step = strided ? shares : 1;
    float* tiles = scratch.tiles.data() + s * 2 * group * kMaxTileRows;
    float* block = query_block > 1 ? scratch.block.data() + s * scratch.block_floats : nullptr;
    // Chunk items after the first start from the empty state: each share empties its own rows.
    const AttentionShape sh = state.shape();
    for (int64_t item = begin; item < end; item += step) {
      const int64_t j = item / pair_items;
      if (j == 0) continue;
      const Target target = TargetOf(j);
      const int32_t b = static_cast<int32_t>(item % pair_items / runs);
      const int32_t run = static_cast<int32_t>(item % pair_items % runs);
      const int32_t t0 = b * query_block, t1 = std::min(t0 + query_block, state.n_tokens());
      const int64_t h0 = int64_t{sh.n_kv_heads * run / runs} * group;
      const int64_t h1 = int64_t{sh.n_kv_heads * (run + 1) / runs} * group;
      for (int32_t t = t0; t < t1; ++t) {
        const int64_t row = int64_t{t} * sh.n_heads;
        std::fill(target.m + row + h0, target.m + row + h1, -INFINITY);
        std::fill(target.l + row + h0, target.l + row + h1, 0.0f);
        std::fill(target.acc + (row + h0) * sh.head_dim, target.acc + (row + h1) * sh.head_dim, 0.0f);
      }
    }
    const int64_t n_windows = source.n_windows();
    for (int64_t i = 0; i < n_windows; ++i) {
      const KvWindow* w = Get(i);
      if (w == nullptr) return;
      const AttentionShape shape = state.shape();
      assert(w->k.n_rows == w->v.n_rows);
      assert(w->k.args.shape.head_dim == shape.head_dim && w->k.args.shape.n_kv_heads == shape.n_kv_heads);
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
      if (o.kernel == AttentionKernel::kSimd && ctx.k->prepare_query != nullptr) {
        const int64_t rows = std::max<int64_t>(shape.n_heads, int64_t{query_block} * group);
        const int64_t bytes = rows * ctx.k->prepared_head_bytes(w->k.args);
        std::vector<AttentionState::Scratch::Line>& lines = scratch.prepared_q[s];
        if (static_cast<int64_t>(lines.size()) * 64 < bytes) lines.resize(static_cast<size_t>((bytes + 63) / 64));
        ctx.prepared_q = lines.data()->bytes;
      }
      for (int64_t item = begin; item < end; item += step) AttendItem(*w, ctx, item, tiles, block);
      if (scratch.users[i].fetch_sub(1, std::memory_order_acq_rel) == 1) source.Release(i);
    }
  }

  // After the dispatch: each token's chunk states, in chunk order, folded into its state as the
  // sequential walk would have at each chunk's first position — the open chunk merged into the
  // merged state, the chunk's state becoming the open one — for every chunk whose first position
  // the token saw (at most its own, and before `windows_end`, the end of the windows attended).
  void MergeChunkStates(int64_t windows_end) {
    const AttentionShape sh = state.shape();
    const int32_t d = sh.head_dim;
    const int64_t heads = int64_t{state.n_tokens()} * sh.n_heads;
    for (int32_t t = 0; t < state.n_tokens(); ++t) {
      const int64_t row = int64_t{t} * sh.n_heads;
      for (int64_t j = 1; j < chunk_items; ++j) {
        const int64_t first = (first_chunk + j) * chunk;
        if (first > first_query_position + t || first >= windows_end) break;
        attention_internal::FoldOpenChunk(state.merged_m.data() + row, state.merged_l.data() + row,
                                          state.merged_acc.data() + row * d, state.m.data() + row,
                                          state.l.data() + row, state.acc.data() + row * d, sh.n_heads, d);
        const int64_t from = (j - 1) * heads + row;
        std::copy_n(scratch.chunk_m.data() + from, sh.n_heads, state.m.data() + row);
        std::copy_n(scratch.chunk_l.data() + from, sh.n_heads, state.l.data() + row);
        std::copy_n(scratch.chunk_acc.data() + from * d, int64_t{sh.n_heads} * d, state.acc.data() + row * d);
      }
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
  int32_t runs = o.kernel == AttentionKernel::kScalar || query_block > 1
                           ? shape.n_kv_heads
                           : std::min(shape.n_kv_heads, std::max(1, threads / std::max(1, n_blocks)));
  int64_t pair_items = int64_t{n_blocks} * runs;
  const int64_t n_windows = source.n_windows();
  if (n_windows == 0) return Status::Ok();
  if (static_cast<int64_t>(scratch.windows.size()) < n_windows) scratch.windows.resize(n_windows);
  // Window 0 is acquired here, before the dispatch: its first position places the call's chunks.
  Result<KvWindow> first = source.Acquire(0);
  if (!first.ok()) return first.status();
  scratch.windows[0] = *first;
  const int64_t chunk = o.position_chunk > 0 ? o.position_chunk : kDefaultPositionChunk;
  const int64_t first_chunk = first->first_position / chunk;
  // Chunks become items of their own when the pairs cannot keep every thread busy: the chunks
  // from window 0's to the last query's (the call never attends past it).
  const int64_t last_query = first_query_position + n_tokens - 1;
  int64_t chunk_items = 1;
  const int64_t reach = last_query >= first->first_position ? last_query / chunk - first_chunk + 1 : 0;
  const bool chunks_fit = (reach - 1) * int64_t{n_tokens} * shape.n_heads * (shape.head_dim + 2) <= kMaxChunkStateFloats;
  const bool per_token_simd = o.kernel == AttentionKernel::kSimd && query_block == 1;
  // Per-token SIMD items read whole rows when chunks keep the threads busy: runs only as wide
  // as that still needs (every KV head of a position is stored together).
  const auto runs_over_chunks = [&](int64_t n_chunks) {
    const int64_t per_run = int64_t{n_blocks} * n_chunks;
    return static_cast<int32_t>(std::clamp<int64_t>((threads + per_run - 1) / per_run, 1, shape.n_kv_heads));
  };
  std::vector<int64_t>& bounds = scratch.share_bounds;
  bounds.clear();
  if (reach > 0 && chunks_fit && pair_items < scratch.pool->threads()) {
    chunk_items = reach;  // chunks keep the threads busy where the pairs cannot
    if (per_token_simd) runs = runs_over_chunks(reach);
  } else if (reach > 1 && chunks_fit && per_token_simd && scratch.pool->threads() > 1) {
    // Decode with enough pairs: splitting a row's KV heads among the threads has every thread
    // stream every row's lines (and at int4's 34-byte heads, share lines), which measured slower
    // than splitting positions; so positions are split where the rows divide about evenly.
    const int32_t chunk_runs = runs_over_chunks(reach);
    const int64_t chunk_pairs = int64_t{n_blocks} * chunk_runs;
    const int32_t chunk_shares = static_cast<int32_t>(std::min<int64_t>(chunk_pairs * reach, scratch.pool->threads()));
    if (SplitByRows(first->first_position, last_query, chunk, first_chunk, reach, chunk_pairs, chunk_runs,
                    shape.n_kv_heads, chunk_shares, bounds) <= kMaxShareImbalance) {
      chunk_items = reach;
      runs = chunk_runs;
    } else {
      bounds.clear();
    }
  }
  if (chunk_items > 1) pair_items = int64_t{n_blocks} * runs;
  const int64_t items = pair_items * chunk_items;
  // Shares: contiguous runs of items, one per pool thread at most; each walks all windows.
  const int32_t shares = static_cast<int32_t>(std::clamp<int64_t>(items, 1, scratch.pool->threads()));
  if (chunk_items > 1 && query_block == 1 && bounds.empty()) {
    SplitByRows(first->first_position, last_query, chunk, first_chunk, chunk_items, pair_items, runs,
                shape.n_kv_heads, shares, bounds);
  }

  // Scratch grows to the largest call seen and is reused after that.
  const size_t tile_floats = size_t{2} * shares * group * kMaxTileRows;
  if (scratch.tiles.size() < tile_floats) scratch.tiles.resize(tile_floats, 0.0f);
  if (query_block > 1) {
    const int64_t rows = int64_t{query_block} * group;
    scratch.block_floats = 2 * rows * shape.head_dim + 2 * rows + 2 * kBlockRowsPerCall * kMaxTileRows;
    const size_t block_floats = static_cast<size_t>(shares * scratch.block_floats);
    if (scratch.block.size() < block_floats) scratch.block.resize(block_floats, 0.0f);
  }
  if (chunk_items > 1) {
    const size_t heads = static_cast<size_t>((chunk_items - 1) * n_tokens * shape.n_heads);
    if (scratch.chunk_m.size() < heads) {
      scratch.chunk_m.resize(heads);
      scratch.chunk_l.resize(heads);
      scratch.chunk_acc.resize(heads * shape.head_dim);
    }
  }
  if (static_cast<int32_t>(scratch.rope_rows.size()) < shares) scratch.rope_rows.resize(shares);
  if (static_cast<int32_t>(scratch.prepared_q.size()) < shares) scratch.prepared_q.resize(shares);
  if (scratch.users_capacity < n_windows) {
    scratch.users = std::make_unique<std::atomic<int32_t>[]>(n_windows);
    scratch.users_capacity = n_windows;
  }
  for (int64_t i = 0; i < n_windows; ++i) scratch.users[i].store(shares, std::memory_order_relaxed);
  scratch.acquired.store(1, std::memory_order_relaxed);
  scratch.acquiring = false;
  scratch.failed_at = -1;
  scratch.error = Status::Ok();

  WindowsCall call{o, q, first_query_position, source, state, scratch,
                   o.kernel == AttentionKernel::kSimd ? attention_internal::SoftmaxTileForThisCpu() : nullptr,
                   group, runs, shares, query_block, items, chunk, first_chunk, chunk_items, pair_items};
  // One job for the whole call; the lambda holds one reference, so std::function keeps it inline.
  scratch.pool->Run(shares, [&call](int64_t share, int32_t) { call.RunShare(share); });
  if (chunk_items > 1) {
    // The windows attended: [0, acquired) — all of them, or those before a failed Acquire.
    const KvWindow& last = scratch.windows[scratch.acquired.load(std::memory_order_acquire) - 1];
    call.MergeChunkStates(last.first_position + last.k.n_rows);
  }
  return scratch.error;
}

void AttendWindow(const AttentionOptions& o, const float* q, int64_t first_query_position,
                  const KvWindow& w, AttentionState& state) {
  OneWindow source(w);
  const Status s = AttendWindows(o, q, first_query_position, source, state);
  assert(s.ok());  // a single window in memory cannot fail to arrive
  (void)s;
}

const char* AttentionSimdTarget() { return simd::DispatchedTargetName(); }

}  // namespace kvq
