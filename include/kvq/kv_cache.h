// The KV cache: per layer, pages of encoded K and V rows in any format (K and V, and each layer,
// may differ), a master copy in host RAM or in a file on disk, and a bounded device working set
// that pages stream through — double-buffered, the next page copied on a background thread while
// attention consumes the current one. Attention carries its online-softmax state across the pages,
// so every tier gives the same bits as a resident cache (docs/design.md §4).
//
// On CPU the "device" is a staging arena of the budgeted size. A compute device (WebGPU in the
// browser build; kvq/kv_device.h) gets the same pages in the same order through AttendOnDevice.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvq/attention.h"
#include "kvq/format.h"
#include "kvq/kv_spec.h"
#include "kvq/status.h"

namespace kvq {

struct SnapshotImage;
class KvDevice;

/// What identifies the model a cache belongs to (checked when a snapshot is loaded): its
/// attention shape and a hash of its weights.
struct ModelFingerprint {
  int64_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  uint64_t weights_hash = 0;
  bool operator==(const ModelFingerprint&) const = default;
};

/// Memory limits per tier. Sizes in bytes; 0 means "not set".
struct KvBudgets {
  /// Device working set. 0: no staging — attention reads the master copy in place ("resident"),
  /// except with a disk master, which always streams through a two-page working set.
  int64_t device_bytes = 0;
  /// Host RAM for the master copy (or, with a disk master, the pages being filled). 0: no limit.
  int64_t host_bytes = 0;
  /// Non-empty: the master copy lives in a file in this folder, deleted when the cache is
  /// destroyed unless keep_disk_file.
  std::string disk_dir;
  bool keep_disk_file = false;
};

/// The page size kvq uses unless told otherwise: 256 positions, or the context rounded up to a
/// multiple of 32 when that is smaller (a short context does not pay for a mostly empty page).
int32_t DefaultPagePositions(int64_t max_positions);

struct KvCacheConfig {
  int64_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  /// Per layer, or a single entry used for every layer: K and V specs (format + transforms).
  std::vector<LayerFormats> layers;
  /// Seed of the "rot" transform's sign pattern (the same for every layer and head); stored in
  /// snapshots, which a cache with another seed refuses.
  uint64_t rotation_seed = kDefaultRotationSeed;
  /// The model's RoPE (DecoderModel: ModelRopeConfig), required when a key spec is "prerope": those
  /// keys are stored before RoPE and attention ropes each one at its position with these
  /// parameters (the model's own ApplyRope); Create refuses such a spec without them (Plan, which
  /// only counts bytes, does not). Ignored by every other spec.
  std::optional<RopeConfig> key_rope;
  /// The most positions the cache will hold (the context size).
  int64_t max_positions = 0;
  /// Positions per page: a multiple of 32 (so KIVI's key groups never straddle pages).
  int32_t page_positions = 256;
  KvBudgets budgets;
  /// Floats of fixed per-sequence state kept beside the pages: a hybrid model's recurrent
  /// (linear-attention) layers hold their conv and delta-rule state here, f32, zero at creation
  /// and after Truncate(0). n_layers then counts only the model's full-attention layers. A state
  /// cannot be rolled back, so Truncate to any other shorter length is refused. 0: none.
  int64_t state_floats = 0;
};

/// What Create decided, in exact bytes and positions, for printing and for tests.
struct KvTierPlan {
  int64_t total_bytes = 0;        ///< the whole cache at max_positions, every layer
  int64_t largest_page_bytes = 0; ///< K + V of one page of the widest layer
  int64_t slot_bytes = 0;         ///< one working-set slot: a page plus the f32 residual rows
  int32_t device_slots = 0;       ///< pages the device working set holds (0: resident)
  int64_t device_bytes = 0;       ///< device_slots × slot bytes (≤ the device budget)
  int64_t host_bytes = 0;         ///< what the host tier holds at max_positions, state included
  int64_t state_bytes = 0;        ///< a hybrid's fixed recurrent state (host RAM; not in total_bytes)
  int64_t disk_bytes = 0;         ///< what the disk tier holds at max_positions
  int64_t device_positions = 0;   ///< positions per layer resident in the working set at once
  int64_t host_positions = 0;     ///< positions per layer whose master bytes are in host RAM
  int64_t disk_positions = 0;     ///< positions per layer whose master bytes are on disk
  std::string disk_file;          ///< the master file, when on disk
  /// A few lines for humans: tiers, bytes, positions.
  std::string Describe() const;
};

class KvCache {
 public:
  /// Validates the configuration and the budgets against the shape and formats, and refuses an
  /// impossible combination now (with what to change) rather than at token 10,000.
  static Result<std::unique_ptr<KvCache>> Create(const KvCacheConfig& config);
  /// The same checks and plan as Create, without allocating or creating anything.
  static Result<KvTierPlan> Plan(const KvCacheConfig& config);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheConfig& config() const;
  const KvTierPlan& plan() const;
  /// Positions appended to `layer`.
  int64_t positions(int64_t layer) const;
  /// A new cache holding what this one holds (positions, rows, recurrent state), with the same
  /// configuration, that shares this cache's pages: a page is copied only when one of the caches
  /// first writes to it (its last, partly filled page, when either appends), so N forks of a long
  /// prefix hold its full pages once. Either cache may then be used on its own thread. Errors: a
  /// disk master (its pages live in one file per cache), a cache broken by an I/O error.
  Result<std::unique_ptr<KvCache>> Fork() const;
  /// Host RAM held by this cache's pages now, counting the pages it shares with forks; and of
  /// that, the pages no other cache holds. Summed over a cache and its forks, the unshared bytes
  /// plus one count of the shared pages are the memory actually used.
  int64_t page_bytes_held() const;
  int64_t page_bytes_unshared() const;

  /// Exact bytes of the KV contents now, every layer: K and V blocks of the encoded rows plus the
  /// f32 residual and sink rows (SpecBytesForRows). Not counted: the recurrent state
  /// (state_floats() × 4 bytes), page padding, and scratch such as the f32 copies Attend reads.
  int64_t bytes() const;

  /// Appends n positions to one layer: k and v are [n][n_kv_heads][head_dim] f32 (k before RoPE
  /// where the layer's key spec is "prerope", else after), ready for these positions' queries to
  /// Attend (see there: the rows this call encodes keep an f32 copy until the next Append). Rows are
  /// transformed (rotated), kept in f32 while they are sinks or in the residual, and encoded once
  /// they age out; a calibrated codec (none is registered since fp8 became per-group) takes its
  /// tensor scale from the first rows encoded, sinks excluded. Errors past max_positions (nothing
  /// appended) or on I/O (the cache is then unusable: every later call returns the error).
  Status Append(int64_t layer, const float* k, const float* v, int64_t n);

  /// Where a page of `layer` holds what (one page as the cache stores it; ReadPage's bytes): K
  /// blocks of page_positions rows from byte 0, V blocks from value_offset, page_bytes in all
  /// (the bytes between the two regions are 0).
  struct PageLayout {
    int64_t page_bytes = 0;
    int64_t value_offset = 0;
  };
  PageLayout LayerPageLayout(int64_t layer) const;
  /// Appends n_pages full pages to one layer, their bytes encoded elsewhere in this layout: a
  /// device that encodes new rows with kvq's codecs (the WebGPU path's WGSL encoders) and writes
  /// them behind to this master copy in whole pages. The same bits as Append of the rows those
  /// bytes encode; only for specs without transforms but rot and prerope (a rot spec's pages
  /// encode the rows rotated with this cache's signs, a prerope spec's the keys before RoPE; sinks
  /// and residual need rows, not bytes) and codecs that are not calibrated. The layer must end on
  /// a page boundary.
  /// Errors as Append.
  Status AppendEncodedPages(int64_t layer, const uint8_t* pages, int64_t n_pages);
  /// Copies page `page` of `layer` (one holding rows) into out: LayerPageLayout(layer).page_bytes.
  Status ReadPage(int64_t layer, int64_t page, uint8_t* out) const;

  /// The most positions m ≤ n that Truncate can keep: n itself for per-token formats, n rounded
  /// down to a whole group where a codec stores rows in groups (KIVI keys, fp8's 32-key groups);
  /// 0 when positions cannot be dropped in place — a sink or residual transform (rows already
  /// encoded would have to be f32 again), a calibrated codec, a disk master, or a fixed state
  /// (state_floats > 0) when m < the positions held. A server reusing a
  /// cached prefix truncates to this point and recomputes the few positions after it.
  int64_t TruncationPoint(int64_t n) const;
  /// Keeps positions [0, n) of every layer and drops the rest, leaving the bytes a cache holds
  /// that was appended only those rows (pages past n freed, the rest of n's page zeroed).
  /// Errors: n past what a layer holds, or n != TruncationPoint(n) (nothing changed then); with a
  /// fixed state, any 0 < n < positions (a recurrent state cannot roll back). n = 0 zeroes it.
  Status Truncate(int64_t n);
  /// For a cache with a fixed state: keeps positions [0, n), 1 ≤ n, wherever TruncationPoint would
  /// allow it if the cache held no state (always within the last Append's rows), and sets the
  /// state to `state` [state_floats()], which the caller copied when the cache held exactly n
  /// positions (a speculative verifier's checkpoint before its pass). Errors: a cache without a
  /// state, a state of another size, or as Truncate (nothing changed then).
  Status Truncate(int64_t n, std::span<const float> state);

  /// Attention of q ([n_tokens][n_heads][head_dim], token t at first_query_position + t) over
  /// every cached position of `layer`, page by page through the tiers, into `state` (not
  /// finished: call this cache's FinishAttention). A rotated key spec rotates q first; q is
  /// always roped, and a prerope key spec's keys are roped as they are read. On an error the
  /// state holds the pages before it. One call at a time per cache.
  ///
  /// The query at position p reads positions [0, p] as they were when p was appended: rows the
  /// cache held in f32 then (a KIVI or fp8 key group not yet complete, a "resN" residual) are read
  /// in f32 even if a later row of the same Append has encoded them since. So a block appended and
  /// attended at once gives the bits of its tokens appended and attended one at a time, and how a
  /// prompt is cut into blocks changes nothing (tokens whose reads differ are attended in separate
  /// passes over the pages). The cache keeps those f32 copies for the last Append's rows only
  /// (until the next Append: at most that many rows); a query at an earlier position reads the
  /// layer as it is now — and so does every query after an Append of 0 rows, which drops them.
  Status Attend(int64_t layer, const AttentionOptions& options, const float* q,
                int64_t first_query_position, AttentionState& state);
  /// out: [n_tokens][n_heads][head_dim] = acc / l, with a rotated value spec's rotation undone
  /// (once per output row, not per position). kvq::FinishAttention plus that.
  void FinishAttention(int64_t layer, const AttentionState& state, float* out) const;

  /// Attention on a compute device (kvq/kv_device.h) of the queries it holds — n_tokens positions
  /// from first_query_position — over every cached position of `layer`: the layer's pages in
  /// order, each written by the host into the next of the device's slots (plan().device_slots of
  /// plan().slot_bytes; two when the cache has no device budget) with the same bytes and layout a
  /// streamed Attend reads, then handed to the device to fold into its state; then Finish. The
  /// device rotates queries and keys itself where the specs say (KvDeviceLayer). The queries
  /// must all read the layer in one state (Attend's rule above: true of a single token, and of any
  /// block of a per-token format without a residual). Errors: a bad layer, n_tokens < 1, queries
  /// that read the layer in different states (the message says where to split), or what the
  /// device returns (the call stops there).
  Status AttendOnDevice(int64_t layer, const AttentionOptions& options, int64_t first_query_position,
                        int32_t n_tokens, KvDevice& device);
  /// How many of n_tokens queries from first_query_position, counted from the first, read `layer`
  /// in one state (Attend's rule): the most tokens one AttendOnDevice call takes there (≥ 1 when
  /// n_tokens ≥ 1). A device attends a block in calls of this many tokens each.
  int32_t QueriesInOneState(int64_t layer, int64_t first_query_position, int32_t n_tokens) const;

  /// The fixed per-sequence state (KvCacheConfig::state_floats floats, f32), null when it has none.
  /// The model reads and updates it in place as tokens go through its recurrent layers.
  float* state();
  const float* state() const;
  int64_t state_floats() const;

  /// The most bytes the device working set has held at once (its own accounting).
  int64_t device_peak_bytes() const;
  /// Streamed tiers, since creation (0 when resident): seconds attention waited for a page to
  /// arrive, and seconds the copy thread spent reading pages into the working set.
  double stream_wait_seconds() const;
  double stream_copy_seconds() const;

  /// Snapshots: the cache's contents (all layers must hold the same number of positions).
  Result<SnapshotImage> Export(const ModelFingerprint& model) const;
  /// Replaces the contents with an image whose shape and formats match this cache. A mismatch
  /// leaves the cache unchanged; an I/O error while writing pages (disk master) leaves it
  /// unusable — every later call returns that error — never half loaded.
  Status Import(const SnapshotImage& image);
  /// Saves the cache with the token ids it holds (so a prompt cache can check its prefix).
  Status Save(const std::string& path, const ModelFingerprint& model,
              const std::vector<int32_t>& tokens = {}) const;
  /// Loads a snapshot written for this model and these formats and returns the token ids saved
  /// with it; on error the cache is unchanged.
  Result<std::vector<int32_t>> Load(const std::string& path, const ModelFingerprint& model);

 private:
  // kvq's own hooks into the cache (src/cache/kv_cache_impl.h): benchmark shortcuts that are no
  // part of this interface.
  friend struct KvCacheInternal;
  int64_t RowsTruncationPoint(int64_t n) const;  // TruncationPoint's rules for the rows alone
  Status DropRows(int64_t n);                      // Truncate's work once a state allows it
  struct Impl;
  static Result<std::unique_ptr<Impl>> Prepare(const KvCacheConfig& config);
  explicit KvCache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvq
