// KvCache's private state, shared by kv_cache.cc (configuration, tiers, attention),
// kv_cache_append.cc (rows in: transforms, encoding) and kv_cache_snapshot.cc (export / import).
#pragma once

#include <array>
#include <memory>
#include <span>
#include <vector>

#include "cache/page_store.h"
#include "cache/staging.h"
#include "kvq/kv_cache.h"

namespace kvq {

inline int64_t AlignUp64(int64_t x) { return (x + 63) / 64 * 64; }

struct KvCache::Impl {
  // One layer's rows. Per tensor (0 = K, 1 = V): rows [0, encoded) are in the pages' blocks,
  // rows [encoded, positions) in `residual` (f32, already transformed), and rows
  // [0, min(positions, sinks)) also in `sinks`, which attention reads instead of their blocks.
  // `residual` starts at row held_from ≤ encoded: the rows [held_from, encoded) are rows the last
  // Append encoded that its own queries still read in f32 (LayerView), dropped by the next Append.
  struct Layer {
    int64_t positions = 0;
    std::array<CodecArgs, 2> args{};  // tensor scales
    std::array<bool, 2> calibrated{false, false};
    // Per tensor: the positions held when its scale was calibrated (from every row the Append that
    // calibrated it brought), so a truncation to fewer rows cannot keep that scale.
    std::array<int64_t, 2> calibrated_through{0, 0};
    std::array<int64_t, 2> encoded{0, 0};
    std::array<int64_t, 2> held_from{0, 0};
    std::array<std::vector<float>, 2> residual;  // [positions − held_from][n_kv_heads][head_dim]
    std::array<std::vector<float>, 2> sinks;     // [min(positions, sinks)][n_kv_heads][head_dim]
  };

  // A layer as attention reads it for one query: as a cache holding `positions` rows held it, rows
  // [0, encoded[t]) of tensor t in blocks and the rest in f32. A query at position p reads the view
  // at p + 1 — what the cache held when p was appended — so how a prompt was cut into Append calls
  // changes no bit of what it reads. The layer's current view is {positions, encoded}.
  struct LayerView {
    int64_t positions = 0;
    std::array<int64_t, 2> encoded{0, 0};
    bool operator==(const LayerView&) const = default;
  };

  // Where one page's rows of one tensor come from: head rows (sinks) in f32, then rows in the
  // page's blocks, then residual rows in f32 (a RowsView's three runs).
  struct PageRows {
    int64_t first = 0;           // the page's first position
    int64_t n_rows = 0;          // positions of the page the layer holds
    int64_t n_head = 0;          // [0, n_head): sinks rows first + r
    int64_t n_block = 0;         // [n_head, n_block): blocks
    int64_t residual_first = 0;  // row r ≥ n_block is residual row residual_first + r − n_block
    int64_t f32_rows() const { return n_head + n_rows - n_block; }
    bool operator==(const PageRows&) const = default;
  };

  // Query tokens [t0, t1) of an Attend call that read a layer through one view (QueryRunEnd).
  struct QueryRun {
    int32_t t0 = 0, t1 = 0;
    LayerView view;
  };

  KvCacheConfig config;
  KvTierPlan plan;
  RowShape row;
  std::vector<LayerFormats> formats;  // per layer
  std::vector<Layer> layers;
  std::vector<int64_t> page_bytes;  // per layer, padded to 64
  int64_t max_pages = 0;
  std::vector<float> rotation_signs;  // [head_dim] when a spec rotates (hadamard.h)
  RopeParams key_rope;                // config.key_rope's view, for windows of prerope keys
  std::vector<float> rotated_q;       // Attend's scratch: [n_tokens][n_heads][head_dim]
  // Attend's states for query runs that read different views, by token count (reused).
  std::vector<std::unique_ptr<AttentionState>> run_states;
  std::vector<QueryRun> query_runs;   // Attend's runs of one call (reused)
  std::array<std::vector<float>, 2> rotated_rows;  // Append's scratch: [n][n_kv_heads][head_dim]
  std::vector<float> block_rows;      // Append's scratch: [rows_per_block][n_kv_heads][head_dim]
  std::unique_ptr<PageStore> store;
  std::vector<float> state;  // [config.state_floats]: a hybrid model's recurrent state
  std::unique_ptr<StagingArena> arena;      // null when resident
  std::unique_ptr<PageStreamer> streamer;   // null when resident
  std::vector<uint8_t> device_bounce;       // AttendOnDevice's host copy of one slot: [slot_bytes]
  /// Set by an I/O error that left pages inconsistent; every later call returns it.
  Status broken;
  Status Break(const Status& error);

  const Codec& Key(int64_t l) const { return formats[l].key->key; }
  const Codec& Value(int64_t l) const { return formats[l].value->value; }
  const Codec& Tensor(int64_t l, int which) const { return which == 0 ? Key(l) : Value(l); }
  const KvTransforms& Transforms(int64_t l, int which) const {
    return which == 0 ? formats[l].key_transforms : formats[l].value_transforms;
  }
  /// Encoded bytes of one tensor (K or V) for a full page.
  int64_t TensorPageBytes(const Codec& codec) const;
  /// Page layout: [K region, padded to 64 bytes][V region].
  int64_t KeyRegionBytes(int64_t layer) const { return AlignUp64(TensorPageBytes(Key(layer))); }
  int64_t PageBytes(int64_t layer) const { return KeyRegionBytes(layer) + TensorPageBytes(Value(layer)); }
  const uint8_t* TensorRegion(const uint8_t* page, int64_t layer, int which) const {
    return which == 0 ? page : page + KeyRegionBytes(layer);
  }
  /// Most f32 rows (sinks and residual) one tensor can hold: min(context, sinks + residual +
  /// rows_per_block − 1).
  int64_t MaxF32Rows(int64_t layer, int which) const;
  /// Largest f32 rows (K and V) one page's window can carry, in bytes (a streamed slot's extra).
  int64_t ResidualBytesMax(int64_t layer) const;
  class Pages;  // a view's pages as attention windows (kv_cache_attend.cc)
  /// The layer as it is now.
  LayerView CurrentView(int64_t layer) const;
  /// The layer as a cache holding its first n rows held it (n ≤ positions).
  LayerView ViewAt(int64_t layer, int64_t n) const;
  /// Whether the view's f32 rows are still held (rows from held_from on).
  bool Holds(int64_t layer, const LayerView& view) const;
  /// How page `page` of `layer` splits for tensor `which` in `view`.
  PageRows RowsOfPage(int64_t layer, int which, int64_t page, const LayerView& view) const;
  /// The window for one page: its bytes (null when neither tensor has block rows there) and, per
  /// tensor, where its head rows and its residual rows for this page start.
  KvWindow Window(int64_t layer, int64_t page, const LayerView& view, const uint8_t* page_data,
                  const std::array<const float*, 2>& head,
                  const std::array<const float*, 2>& residual) const;
  /// Writes page p of `layer` into a working-set slot as attention windows read it in `view`: the
  /// page's bytes (when any row of it is in blocks; padded to 64), then K's head rows and residual
  /// rows of the page, then V's (f32). Returns the bytes written.
  Result<int64_t> FillSlot(int64_t layer, int64_t p, const LayerView& view, uint8_t* dst) const;
  /// Whether page p of `layer` has rows in blocks in `view` (else no page bytes are read).
  bool SlotHasBlockRows(int64_t layer, int64_t p, const LayerView& view) const;
  /// The end t1 of the run of query tokens [t0, t1) (token t at first_query_position + t) that read
  /// `layer` through one view, and that view: each token reads what the cache held when it was
  /// appended, as far as the f32 copies are still held (else the layer as it is now).
  int32_t QueryRunEnd(int64_t layer, int64_t first_query_position, int32_t t0, int32_t n_tokens,
                      LayerView* view) const;
  /// Pages a view spans.
  int64_t PagesOf(const LayerView& view) const;
  /// How many of the first pages every run's view reads alike (the same rows from the same
  /// places, so any of the views gives the same windows there).
  int64_t PagesReadAlike(int64_t layer, std::span<const QueryRun> runs) const;
  /// Attention of n_tokens query rows that all read `layer` through `view`, over its pages
  /// [first_page, end_page) (Attend's body).
  Status AttendView(int64_t layer, const LayerView& view, int64_t first_page, int64_t end_page,
                    const AttentionOptions& options, const float* q, int64_t first_query_position,
                    AttentionState& state);
  /// Encodes tensor `which` of `layer` up to EncodedRows(n) rows, writing pages as they fill;
  /// keeps the f32 rows from `keep_from` on (the rows the last Append's queries read in f32).
  Status EncodeAged(int64_t layer, int which, int64_t n, int64_t keep_from);
  /// Whether every layer can drop positions [n, positions) by going back to ViewAt(n): the rows
  /// [encoded at n, n) are still held in f32 (the last Append's), no scale came from the dropped
  /// rows, and the master is in RAM. Rows encoded since n then count as not encoded again.
  bool CanDropToView(int64_t n) const;
  /// Drops positions past n of every layer that way (CanDropToView(n) holds).
  Status DropToView(int64_t n);
  /// Drops the f32 copies of rows already in blocks (held_from = encoded).
  void DropEncodedF32(Layer& L) const;
};

// The one door to a cache's private state from outside its members (a friend of KvCache), for
// kvq's internal hooks (page_copies.h).
struct KvCacheInternal {
  static KvCache::Impl& Of(KvCache& cache) { return *cache.impl_; }
};

}  // namespace kvq
