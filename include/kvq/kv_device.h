// A compute device's KV working set, as the cache streams to it (seed 000's architecture): the
// master copy stays in the cache's host (or disk) tier; for one attention call the cache uploads a
// layer's pages in order into a ring of device slots within the device budget, and after each
// upload asks the device to attend over that slot. The device keeps the online-softmax state
// (m, l, acc) of its queries across the windows and normalises once when told the layer is done.
//
// Plan/run split: the cache decides what goes where (slots, byte offsets, rows of each run) and
// the device only executes it, so the tier logic is written once — KvCache::Attend's CPU staging
// arena and a GPU working set stream the same pages into the same slot layout. The WebAssembly
// build implements KvDevice over WebGPU storage buffers (src/web/web_kv.cc, web/gpu/kv_device.js);
// the tests implement it over kvq's CPU attention to prove the stream equals KvCache::Attend.
#pragma once

#include <cstdint>
#include <vector>

#include "kvq/format.h"
#include "kvq/kv_spec.h"
#include "kvq/rope.h"
#include "kvq/status.h"

namespace kvq {

/// What a device needs to know once per attention call on one layer.
struct KvDeviceLayer {
  int64_t layer = 0;
  /// The queries the device holds: n_tokens consecutive positions from first_query_position, each
  /// attending to the positions up to its own; scores scaled by `scale`, capped by `softcap`
  /// (AttentionOptions; a device without a softcap refuses one that is not 0).
  int64_t first_query_position = 0;
  int32_t n_tokens = 1;
  float scale = 0.0f;
  float softcap = 0.0f;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  const FormatDesc* key_format = nullptr;    ///< its `key` codec encodes the K blocks
  const FormatDesc* value_format = nullptr;  ///< its `value` codec encodes the V blocks
  CodecArgs key_args, value_args;            ///< the tensors' scales (calibrated codecs)
  /// Keys are stored rotated ("rot"): the device rotates its queries by RotateHeads with these
  /// signs before scoring. Values rotated: it undoes the rotation on the normalised output.
  /// signs: [head_dim], null when neither tensor is rotated.
  bool rotate_queries = false;
  bool unrotate_output = false;
  const float* rotation_signs = nullptr;
  /// Keys stored before RoPE ("prerope"): each window brings the cos/sin of its positions
  /// (KvDeviceWindow::key_rope) and the device rotates each K row as it reads it, with `pairing`
  /// and the first `rotary_dims` numbers of each head (rope.h), as ApplyRope would.
  bool pre_rope = false;
  RopePairing rope_pairing = RopePairing::kAdjacent;
  int32_t rotary_dims = 0;
  /// Slots the cache streams through and the bytes of each (KvTierPlan's device slots and slot
  /// bytes): the device allocates them once; it never holds more than slots × slot_bytes of KV.
  int32_t slots = 0;
  int64_t slot_bytes = 0;
  int32_t window_rows = 0;  ///< the most rows a window has (the cache's page positions)
};

/// One page of the layer in a slot. The slot holds (byte offsets from its start): the page's
/// encoded K blocks at k.blocks_offset and V blocks at v.blocks_offset (the page's row r is
/// row r of those blocks), then per tensor its f32 head rows (sinks) and residual rows,
/// [rows][n_kv_heads][head_dim] each. Row r of a tensor is a head row for r < n_head, a block row
/// for n_head ≤ r < n_block, a residual row (r − n_block) for n_block ≤ r < n_rows.
struct KvDeviceWindow {
  struct Tensor {
    int64_t blocks_offset = 0;
    int64_t head_offset = 0;
    int64_t residual_offset = 0;
    int64_t n_head = 0;
    int64_t n_block = 0;
  };
  int32_t slot = 0;
  int64_t page = 0;
  int64_t first_position = 0;  ///< absolute position of row 0
  int64_t n_rows = 0;
  int64_t bytes = 0;           ///< bytes of the slot this window uses (≤ slot_bytes)
  Tensor k, v;
  /// pre_rope layers: [n_rows][rotary_dims / 2][cos, sin] at positions first_position + r, the
  /// numbers ApplyRope uses (RopeCosSin); else empty.
  std::vector<float> key_rope;
};

class KvDevice {
 public:
  virtual ~KvDevice() = default;
  /// A layer's attention call begins: the device (re)uses `layer.slots` slots of
  /// `layer.slot_bytes` and resets the state of its queries (which it holds: the caller gave them
  /// to the device before KvCache::AttendOnDevice).
  virtual Status Begin(const KvDeviceLayer& layer) = 0;
  /// Writes `n` bytes of the host tier into slot `slot`. The device may still be reading the
  /// slot's previous window: the write must take effect after that read (a GPU queue orders it).
  virtual Status Upload(int32_t slot, const uint8_t* bytes, int64_t n) = 0;
  /// Folds the window (uploaded into window.slot just before) into the state.
  virtual Status Attend(const KvDeviceWindow& window) = 0;
  /// The last window was given: normalise (acc / l) and undo a value rotation.
  virtual Status Finish() = 0;
};

}  // namespace kvq
