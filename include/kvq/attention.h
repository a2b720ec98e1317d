// Exact attention over windows of a KV cache stored in any format (docs/design.md §3).
//
// Online ("flash") softmax after Milakov & Gimelshein 2018 and Rabe & Staats 2021
// (arXiv 2112.05682): per (query token, query head) the whole state is m (running max score), l
// (running denominator) and acc (unnormalised weighted sum of V). A position updates it as
//     s = softcap(scale · q·k_p);  m' = max(m, s);  c = exp(m − m');  e = exp(s − m')
//     l = l·c + e;  acc = acc·c + e·v_p;  m = m'
// and normalisation (acc / l) happens once, in FinishAttention.
//
// Positions are split into chunks of a fixed size (AttentionOptions::position_chunk, absolute:
// chunk k holds positions [k·C, (k+1)·C)), each with its own state, FlashInfer style (Ye et al.
// 2025, arXiv 2501.01005): the state a query carries is the open chunk's (m, l, acc) and the
// earlier chunks merged, in order, into (merged_m, merged_l, merged_acc). When the first position
// of chunk k > 0 arrives, the open state is merged into the merged one and starts again empty:
//     m* = max(m₁, m₂);  l* = l₁·exp(m₁ − m*) + l₂·exp(m₂ − m*);  acc* likewise.
// Chunks let threads share one query's positions (AttendWindows); the result depends on the chunk
// size, never on the thread count. A context within one chunk gives the bits of one unsplit
// recurrence. Nothing depends on where a window starts or ends, so feeding any sequence of
// windows that covers the positions once, in order, gives the same bits as one window over all of
// them — for the scalar and the SIMD kernel alike, and for any number of threads.
//
// Causality uses absolute positions: a query at position p attends to [0, p]; the state counts
// the positions each query token attended.
#pragma once

#include <cstdint>
#include <vector>

#include "kvq/format.h"
#include "kvq/rope.h"
#include "kvq/status.h"

namespace kvq {

class ThreadPool;  // base/thread_pool.h: internal, handed through AttentionOptions::pool

struct AttentionShape {
  int32_t n_heads = 0;     ///< query heads; query head h reads KV head h / (n_heads / n_kv_heads)
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
};

enum class AttentionKernel {
  kScalar,  ///< the reference: codec dot/axpy and std::exp, one position at a time
  kSimd,    ///< Highway kernels with fused dequantisation, tiles of positions, vector exp
};

struct AttentionOptions {
  float scale = 0.0f;    ///< softmax scale, usually 1/sqrt(head_dim)
  float softcap = 0.0f;  ///< 0: off; else score = softcap · tanh(score / softcap)
  AttentionKernel kernel = AttentionKernel::kSimd;
  /// Work is split across (query block, KV heads, position chunk) items; any count gives the
  /// same bits.
  int32_t threads = 1;
  /// Positions per chunk (see above); 0: kDefaultPositionChunk. Every call on one state must use
  /// the same value. The bits depend on it (chunks are merged in a different order of rounding
  /// than one recurrence), so it is fixed, never derived from the thread count.
  int64_t position_chunk = 0;
  /// The pool to run on (not owned; its thread count replaces `threads`): a forward pass hands
  /// its own, so concurrent sessions share no workers. Null: a process-wide pool of `threads`
  /// (for tools and tests; looked up once per state and count).
  ThreadPool* pool = nullptr;
  /// kSimd: query tokens per work item. Each K/V tile a block reads is scored and accumulated
  /// for all of the block's query rows at once, so it is read and dequantised once per block
  /// instead of once per token. 0: kDefaultQueryBlock; 1: one token per item (the per-token
  /// path). Every value gives the same bits: a position's sequence of operations per (query,
  /// head) does not depend on the block.
  int32_t query_block = 0;
};

/// The query block AttentionOptions::query_block = 0 stands for (measured: `kvq bench attention
/// --queries 64`, docs/performance.md).
inline constexpr int32_t kDefaultQueryBlock = 32;

/// The position chunk AttentionOptions::position_chunk = 0 stands for: a multiple of the cache's
/// default page (256 positions), so a chunk is a whole number of pages; large enough that the
/// merges (one per chunk per query head) cost nothing beside the chunk's positions.
inline constexpr int64_t kDefaultPositionChunk = 2048;

class KvWindowSource;


/// The online-softmax state of a block of query tokens. Plain arrays, so callers can inspect it.
class AttentionState {
 public:
  AttentionState(AttentionShape shape, int32_t n_tokens);
  /// Back to the empty state: m = −inf, l = 0, acc = 0, nothing attended.
  void Reset();

  AttentionShape shape() const { return shape_; }
  int32_t n_tokens() const { return n_tokens_; }

  // The open chunk's state: the positions of the latest chunk attended so far.
  std::vector<float> m;             ///< [n_tokens][n_heads]
  std::vector<float> l;             ///< [n_tokens][n_heads]
  std::vector<float> acc;           ///< [n_tokens][n_heads][head_dim]
  // Every chunk before the open one, merged in order (m = −inf, l = 0, acc = 0 while there is
  // none: a context within one chunk never touches them).
  std::vector<float> merged_m;      ///< [n_tokens][n_heads]
  std::vector<float> merged_l;      ///< [n_tokens][n_heads]
  std::vector<float> merged_acc;    ///< [n_tokens][n_heads][head_dim]
  std::vector<int64_t> attended;    ///< [n_tokens]: positions each query token has attended

  /// Buffers of one attention call (per-thread tiles, the windows handed out, their users) and
  /// the thread pool, kept between calls so that attention allocates and looks up nothing per
  /// layer or page once warm. Opaque: defined in attention.cc.
  struct Scratch;

 private:
  friend Status AttendWindows(const AttentionOptions&, const float*, int64_t, KvWindowSource&,
                              AttentionState&);
  // The state's Scratch; a copied state starts without one.
  class ScratchSlot {
   public:
    ScratchSlot() = default;
    ScratchSlot(const ScratchSlot&) {}
    ScratchSlot& operator=(const ScratchSlot&) { return *this; }
    ~ScratchSlot();
    Scratch& Get();  ///< made on first use

   private:
    Scratch* scratch_ = nullptr;
  };

  AttentionShape shape_;
  int32_t n_tokens_;
  ScratchSlot scratch_;
};

/// A window of consecutive positions: K and V rows (any formats, same number of rows).
struct KvWindow {
  int64_t first_position = 0;  ///< absolute position of the window's first row
  RowsView k;
  RowsView v;
  /// Non-null: the K rows (every run: head, blocks, residual) are pre-RoPE ("prerope" specs), and
  /// attention decodes each one and applies ApplyRope at its absolute position first_position + r
  /// before scoring it with the f32 kernels — per row, so windows still give the same bits.
  const RopeParams* key_rope = nullptr;
};

/// Feeds one window to the state. q: [n_tokens][n_heads][head_dim]; query token t sits at
/// absolute position first_query_position + t and attends to the window's positions ≤ its own.
void AttendWindow(const AttentionOptions& options, const float* q, int64_t first_query_position,
                  const KvWindow& window, AttentionState& state);

/// The windows of one attention call, in order: KvCache::Attend hands a layer's pages to
/// AttendWindows through one, so a single dispatch covers them all. Acquire(i) may wait for the
/// window's bytes (a page a copy thread is streaming in). AttendWindows calls Acquire once per
/// window, in order i = 0, 1, ..., from whichever of its threads reaches the window first, and
/// Release(i) once, from the last thread done with it; calls never overlap for one window.
class KvWindowSource {
 public:
  virtual ~KvWindowSource() = default;
  virtual int64_t n_windows() const = 0;
  virtual Result<KvWindow> Acquire(int64_t i) = 0;
  virtual void Release(int64_t /*i*/) {}
};

/// Feeds windows [0, n_windows) to the state, in order, in one dispatch across the threads: the
/// same bits as AttendWindow on each window in turn. The windows must be consecutive (window
/// i + 1 starts where window i ends). Items are (query block, KV heads) pairs, and when those are
/// fewer than the threads, (query block, KV heads, position chunk) triples whose chunk states are
/// merged in chunk order after the dispatch. If Acquire(i) fails, the state holds exactly windows
/// [0, i) for every query token and the error is returned.
Status AttendWindows(const AttentionOptions& options, const float* q, int64_t first_query_position,
                     KvWindowSource& windows, AttentionState& state);

/// out: [n_tokens][n_heads][head_dim] = acc / l of the merged and the open chunk's state merged
/// (zeros where nothing was attended).
void FinishAttention(const AttentionState& state, float* out);

/// The SIMD target the kSimd kernel runs on here.
const char* AttentionSimdTarget();

}  // namespace kvq
