// Prefix snapshots: a KV cache saved to one file and loaded back, so a prompt's prefill can be
// skipped next time. The file is self-checking: magic, version, the model's fingerprint, the
// formats, and a checksum per section; it is written to a temporary file and renamed into place,
// so a reader never sees half a snapshot. Loading validates everything before returning anything,
// so a bad file loads nothing.
//
// This unit knows bytes, not caches: the cache exports and imports a SnapshotImage.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "kvq/kv_cache.h"
#include "kvq/kv_spec.h"
#include "kvq/status.h"

namespace kvq {

/// One layer of a cache as stored: per tensor (K, V) its format, transforms, the encoded rows of
/// complete blocks in stored order, the f32 rows not (yet) in blocks (the residual: KIVI's
/// incomplete key group and a "resN" transform's newest rows), the f32 sink rows, and the
/// per-tensor scales (fp8; 1.0 otherwise).
struct SnapshotLayer {
  uint16_t key_format = 0;    ///< FormatId value
  uint16_t value_format = 0;  ///< FormatId value
  std::array<KvTransforms, 2> transforms{};  ///< K, V
  float key_scale = 1.0f;
  float value_scale = 1.0f;
  bool scales_calibrated = false;
  std::vector<uint8_t> key_bytes;    ///< blocks of K's encoded rows, stored order
  std::vector<uint8_t> value_bytes;
  std::array<std::vector<float>, 2> residual;  ///< K, V: [rows][n_kv_heads][head_dim] f32
  std::array<std::vector<float>, 2> sinks;     ///< K, V: [rows][n_kv_heads][head_dim] f32
};

struct SnapshotImage {
  ModelFingerprint model;
  int64_t n_positions = 0;
  uint64_t rotation_seed = 0;         ///< the cache's "rot" seed (kept whether or not any rotates)
  std::vector<SnapshotLayer> layers;  ///< model.n_layers entries
  std::vector<int32_t> tokens;        ///< the token ids the cache holds, when the saver knows them
  std::vector<float> state;           ///< a hybrid model's recurrent state (KvCache::state()), or empty
};

/// What the loader must find: the model, the rotation seed (checked only when some tensor
/// rotates) and, per layer, the K and V format ids and transforms.
struct SnapshotExpectation {
  ModelFingerprint model;
  uint64_t rotation_seed = 0;
  std::vector<uint16_t> key_formats;    ///< per layer
  std::vector<uint16_t> value_formats;  ///< per layer
  std::vector<std::array<KvTransforms, 2>> transforms;  ///< per layer: K, V
  int64_t state_floats = 0;  ///< the recurrent state the file must hold (KvCacheConfig::state_floats)
};

/// Current file version (4: the recurrent state). Version 3 is read too (as holding no state); any
/// other is refused.
inline constexpr uint32_t kSnapshotVersion = 4;

/// Writes `image` to `path` atomically (a temporary file in the same folder, fsync'd, renamed).
/// On error nothing is left at `path` that was not there before, and the message names the path.
/// An image the reader would refuse (sinks or residual outside [0, kMaxTransformRows]) is not
/// written.
Status WriteSnapshot(const std::string& path, const SnapshotImage& image);

/// Reads and fully validates a snapshot: magic, version (any other refused), fingerprint, formats,
/// transforms, (when some tensor rotates) rotation seed and the state's length against `expect`,
/// every section's length and checksum, no trailing bytes. Errors name the file and what was wrong (e.g. "was
/// saved for another model: 5 layers x 4 KV heads x head_dim 8, weights a1b2...; this model:
/// ...", "layer 2 keys were saved as int4+rot+sink4; the cache uses int4+rot"). Nothing partial
/// is ever returned.
Result<SnapshotImage> ReadSnapshot(const std::string& path, const SnapshotExpectation& expect);

}  // namespace kvq
