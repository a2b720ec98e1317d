// Exact KV memory accounting (see kvq/kv_memory.h). All products are overflow-checked: a shape or
// context whose byte count does not fit in 64 bits is an error, never a wrapped number.
#include "kvq/kv_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "kvq/units.h"

namespace kvq {
namespace {

Status Overflow(std::string_view what) {
  return Status::Error(fmt::format("{} does not fit in 64 bits: the shape or context is too large",
                                   what));
}

// Bytes of n_rows rows of one tensor, overflow-checked (BytesForRows without the risk).
bool TensorBytes(const Codec& codec, RowShape shape, int64_t n_rows, int64_t* out) {
  const int64_t full_blocks = n_rows / codec.rows_per_block;
  const int64_t residual_rows = n_rows % codec.rows_per_block;
  int64_t blocks_bytes = 0, residual_bytes = 0;
  return CheckedMul(full_blocks, codec.block_bytes(shape), &blocks_bytes) &&
         CheckedMul(residual_rows, shape.elems() * 4, &residual_bytes) &&
         CheckedAdd(blocks_bytes, residual_bytes, out);
}

}  // namespace

Result<KvMemory> PlanKvMemory(const FormatDesc& format, KvShape shape) {
  if (shape.n_layers <= 0) {
    return Status::Error(fmt::format("layers must be positive (got {})", shape.n_layers));
  }
  if (Status s = CheckShape(format, shape.row()); !s.ok()) return s;
  KvMemory m;
  int64_t* per_position[] = {&m.key_bytes_per_layer_position, &m.value_bytes_per_layer_position};
  const Codec* codecs[] = {&format.key, &format.value};
  for (int i = 0; i < 2; ++i) {
    const int64_t block = codecs[i]->block_bytes(shape.row());
    if (block % codecs[i]->rows_per_block != 0) {
      return Status::Error(fmt::format("format {}: a block of {} rows takes {} bytes, not a whole "
                                       "number per position", format.name,
                                       codecs[i]->rows_per_block, block));
    }
    *per_position[i] = block / codecs[i]->rows_per_block;
  }
  m.bytes_per_layer_position = m.key_bytes_per_layer_position + m.value_bytes_per_layer_position;
  if (!CheckedMul(m.bytes_per_layer_position, shape.n_layers, &m.bytes_per_token)) {
    return Overflow("bytes per token");
  }
  if (!CheckedMul(shape.n_layers, TensorStateBytes(format.key) + TensorStateBytes(format.value),
                  &m.fixed_bytes)) {
    return Overflow("per-tensor state bytes");
  }
  m.bits_per_number = (BitsPerNumber(format.key, shape.row()) +
                       BitsPerNumber(format.value, shape.row())) / 2.0;
  return m;
}

Result<int64_t> KvBytesForContext(const FormatDesc& format, KvShape shape, int64_t context) {
  if (context <= 0) return Status::Error(fmt::format("context must be positive (got {})", context));
  Result<KvMemory> m = PlanKvMemory(format, shape);
  if (!m.ok()) return m.status();
  int64_t k = 0, v = 0, layer = 0, all = 0, total = 0;
  if (!TensorBytes(format.key, shape.row(), context, &k) ||
      !TensorBytes(format.value, shape.row(), context, &v) || !CheckedAdd(k, v, &layer) ||
      !CheckedMul(layer, shape.n_layers, &all) || !CheckedAdd(all, m->fixed_bytes, &total)) {
    return Overflow(fmt::format("KV bytes for {} positions", context));
  }
  return total;
}

Result<int64_t> TensorBytesForContext(const Codec& codec, const KvTransforms& t, RowShape row, int64_t context) {
  if (context < 0) return Status::Error(fmt::format("context must not be negative (got {})", context));
  // SpecBytesForRows, overflow-checked: encoded rows in blocks, the rest and the sinks in f32.
  const int64_t encoded = EncodedRows(codec, t, context);
  const int64_t f32_rows = (context - encoded) + std::min<int64_t>(context, t.sinks);
  int64_t blocks = 0, f32 = 0, rows = 0, total = 0;
  if (!CheckedMul(encoded / codec.rows_per_block, codec.block_bytes(row), &blocks) ||
      !CheckedMul(f32_rows, row.elems() * 4, &f32) || !CheckedAdd(blocks, f32, &rows) ||
      !CheckedAdd(rows, TensorStateBytes(codec), &total)) {
    return Overflow(fmt::format("bytes of one tensor for {} positions", context));
  }
  return total;
}

Result<int64_t> KvBytesForContext(std::span<const LayerFormats> layers, KvShape shape, int64_t context) {
  if (context <= 0) return Status::Error(fmt::format("context must be positive (got {})", context));
  if (shape.n_layers <= 0) return Status::Error(fmt::format("layers must be positive (got {})", shape.n_layers));
  if (layers.size() != 1 && static_cast<int64_t>(layers.size()) != shape.n_layers) {
    return Status::Error(fmt::format("{} layer specs for {} layers (give one for every layer, or one each)",
                                     layers.size(), shape.n_layers));
  }
  // One spec for all layers: one layer's bytes times n_layers (no loop over a huge layer count).
  const int64_t distinct = layers.size() == 1 ? 1 : shape.n_layers;
  int64_t total = 0;
  for (int64_t l = 0; l < distinct; ++l) {
    const LayerFormats& f = layers[static_cast<size_t>(l)];
    for (const auto& [spec, codec] : {std::pair{f.Key(), &f.key->key}, std::pair{f.Value(), &f.value->value}}) {
      if (Status s = CheckKvSpec(spec, shape.row()); !s.ok()) return s;
      const Result<int64_t> bytes = TensorBytesForContext(*codec, spec.transforms, shape.row(), context);
      if (!bytes.ok()) return bytes.status();
      if (!CheckedAdd(total, *bytes, &total)) return Overflow(fmt::format("KV bytes for {} positions", context));
    }
  }
  if (distinct == 1 && !CheckedMul(total, shape.n_layers, &total)) {
    return Overflow(fmt::format("KV bytes for {} positions", context));
  }
  return total;
}

Result<double> KvBitsPerNumber(std::span<const LayerFormats> layers, KvShape shape, int64_t context) {
  const Result<int64_t> bytes = KvBytesForContext(layers, shape, context);
  if (!bytes.ok()) return bytes.status();
  const double numbers = 2.0 * static_cast<double>(shape.n_layers) * static_cast<double>(context) *
                         static_cast<double>(shape.row().elems());
  return 8.0 * static_cast<double>(*bytes) / numbers;
}

double SpeedupCeiling(double kv_share, double bytes_ratio) {
  return 1.0 / (1.0 - kv_share * (1.0 - bytes_ratio));
}

}  // namespace kvq
