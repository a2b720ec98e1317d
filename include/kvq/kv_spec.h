// A KV spec: an element format plus the transforms applied to rows before they are stored
// (docs/design.md §7), chosen separately for K and V and per layer. The grammar, wherever a format
// name is accepted (--kv, --kv-k, --kv-v, kvq plan / eval / bench, plan files, snapshots):
//
//   SPEC      = FORMAT { "+" TRANSFORM }          e.g. int4+rot, int2-kivi+sink4+res64
//   TRANSFORM = "rot"        a randomized Hadamard rotation of every head (head_dim a power of 2)
//             | "sink" N     the first N positions kept in f32 (attention sinks)
//             | "res" N      the newest N positions kept in f32, encoded as they age out (KIVI's
//                            residual, for any format)
//             | "prerope"    keys only: keys stored as they are before RoPE (KIVI, KVQuant: RoPE's
//                            position-dependent rotation would smear the outlier channels that
//                            per-channel scales capture); attention applies RoPE to each
//                            dequantised key at its own position. A value spec with it is refused;
//                            a --kv spec (K and V alike) applies it to the keys only. Not with "rot"
//                            (a rotation of roped keys does not commute with RoPE; refused).
//
// Each transform may appear once, in any order; KvSpecName prints them in the order above.
//
// Why these keep attention exact over windows (docs/design.md §3): a row is transformed once, when it is
// appended, and every later read of it is the same whatever window it falls in. Rotation is
// orthonormal, so rotating the query the same way leaves scores unchanged (up to rounding), and V's
// rotation is undone once on the attention output. Sinks and the residual only change which rows
// are read in f32; which ones depends on the cache's length, never on the windows. A pre-RoPE key
// is rotated by its own absolute position whatever window reads it, row by row.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kvq/format.h"
#include "kvq/status.h"

namespace kvq {

/// What happens to one tensor's rows (one layer's K or V) before its format stores them.
struct KvTransforms {
  bool rotate = false;   ///< "rot": y = H · diag(signs) · x / √head_dim per head
  int32_t sinks = 0;     ///< "sinkN": positions [0, N) also kept in f32 and read from there
  int32_t residual = 0;  ///< "resN": the newest N positions stay f32 until they age out
  bool pre_rope = false; ///< "prerope" (keys): rows stored before RoPE, roped as attention reads them
  bool any() const { return rotate || sinks > 0 || residual > 0 || pre_rope; }
  bool operator==(const KvTransforms&) const = default;
};

/// Largest N "sinkN" and "resN" accept.
inline constexpr int32_t kMaxTransformRows = 65536;

/// The seed of the rotation signs unless a cache is given another (stored in snapshots).
inline constexpr uint64_t kDefaultRotationSeed = 0x6b76712d726f7431ull;  // "kvq-rot1"

/// A format and its transforms.
struct KvSpec {
  KvSpec() = default;
  /// A format without transforms converts implicitly: a plain format is a spec.
  KvSpec(const FormatDesc* f, KvTransforms t = {}) : format(f), transforms(t) {}  // NOLINT
  const FormatDesc* format = nullptr;
  KvTransforms transforms;
  bool operator==(const KvSpec&) const = default;
};

/// K and V specs of one layer.
struct LayerFormats {
  const FormatDesc* key = nullptr;
  const FormatDesc* value = nullptr;
  KvTransforms key_transforms;
  KvTransforms value_transforms;
  KvSpec Key() const { return {key, key_transforms}; }
  KvSpec Value() const { return {value, value_transforms}; }
  static LayerFormats Of(const KvSpec& k, const KvSpec& v) {
    return {k.format, v.format, k.transforms, v.transforms};
  }
  /// One spec for K and V, as --kv and --format lists give it: a key-only transform (prerope)
  /// goes to K alone.
  static LayerFormats Both(const KvSpec& s) {
    LayerFormats f = Of(s, s);
    f.value_transforms.pre_rope = false;
    return f;
  }
  bool operator==(const LayerFormats&) const = default;
};

/// Parses SPEC; the error names what was wrong and lists the formats or transforms known.
Result<KvSpec> ParseKvSpec(std::string_view text);
/// The canonical text of a spec ("int4+rot+sink4"); ParseKvSpec(KvSpecName(s)) == s.
std::string KvSpecName(const KvSpec& spec);
/// Name of a layer's pair: the spec when K and V are the same, else "K/V" (e.g. "int4/int8").
std::string LayerFormatsName(const LayerFormats& layer);

/// Checks the format can store this shape and the transforms can apply (rotation needs head_dim
/// a power of two; prerope an even head_dim and no rotation); the error names the spec and the rule.
Status CheckKvSpec(const KvSpec& spec, RowShape shape);
/// CheckKvSpec for a value spec: also refuses "prerope" (a key transform), naming the spec.
Status CheckValueSpec(const KvSpec& spec, RowShape shape);

/// Rows of one tensor held in f32 beside the encoded blocks when it holds n positions:
/// encoded_rows(n) = ⌊max(0, n − residual) / G⌋ · G rows are in blocks (G = rows per block), the
/// rest [encoded_rows, n) in f32; sinks add min(n, sinks) more f32 rows (their slots in the blocks
/// stay, holding a stand-in — see kv_cache.cc).
int64_t EncodedRows(const Codec& codec, const KvTransforms& t, int64_t n);
/// Exact bytes of n positions' rows of one tensor: blocks of the encoded rows plus the f32
/// residual and sink rows (per-tensor state, fp8's scale, is TensorStateBytes). With no
/// transforms this is BytesForRows.
int64_t SpecBytesForRows(const Codec& codec, const KvTransforms& t, RowShape shape, int64_t n);

/// One line per transform for `kvq formats` and --help.
std::string TransformsHelp();

}  // namespace kvq
