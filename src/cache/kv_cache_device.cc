// KvCache::AttendOnDevice (see kvq/kv_cache.h, kvq/kv_device.h): the layer's pages streamed from the
// host tier into a compute device's slots, in order, each folded into the device's state as it
// arrives. The slot bytes are FillSlot's, the layout a streamed Attend reads on CPU.
#include <fmt/format.h>

#include <algorithm>

#include "cache/kv_cache_impl.h"
#include "kvq/kv_device.h"

namespace kvq {

int32_t KvCache::QueriesInOneState(int64_t layer, int64_t first_query_position, int32_t n_tokens) const {
  if (layer < 0 || layer >= impl_->config.n_layers || n_tokens < 1) return 0;
  Impl::LayerView view;
  return impl_->QueryRunEnd(layer, first_query_position, 0, n_tokens, &view);
}

Status KvCache::AttendOnDevice(int64_t layer, const AttentionOptions& options, int64_t first_query_position,
                               int32_t n_tokens, KvDevice& device) {
  Impl& m = *impl_;
  if (!m.broken.ok()) return m.broken;
  if (layer < 0 || layer >= m.config.n_layers) {
    return Status::Error(fmt::format("KV cache: no layer {}", layer));
  }
  if (n_tokens < 1 || first_query_position < 0) {
    return Status::Error(fmt::format("KV cache: {} query tokens at position {}: need at least one, at a "
                                     "position ≥ 0", n_tokens, first_query_position));
  }
  // Every query must read the layer through one view (Attend splits a block into runs that do;
  // a device holds one run's queries per call).
  Impl::LayerView view;
  if (const int32_t t1 = m.QueryRunEnd(layer, first_query_position, 0, n_tokens, &view); t1 < n_tokens) {
    return Status::Error(fmt::format(
        "KV cache: the queries at positions {}..{} read layer {} in different states (rows still in "
        "f32 when the query at {} was appended are in blocks for the one at {}): attend positions "
        "{}..{} and from {} on in separate calls (QueriesInOneState)",
        first_query_position, first_query_position + n_tokens - 1, layer, first_query_position + t1 - 1,
        first_query_position + t1, first_query_position, first_query_position + t1 - 1,
        first_query_position + t1));
  }
  const LayerFormats& f = m.formats[layer];
  const Impl::Layer& L = m.layers[layer];
  KvDeviceLayer d;
  d.layer = layer;
  d.first_query_position = first_query_position;
  d.n_tokens = n_tokens;
  d.scale = options.scale;
  d.softcap = options.softcap;
  d.n_kv_heads = m.row.n_kv_heads;
  d.head_dim = m.row.head_dim;
  d.key_format = f.key;
  d.value_format = f.value;
  d.key_args = L.args[0];
  d.value_args = L.args[1];
  d.key_args.shape = d.value_args.shape = m.row;
  d.rotate_queries = f.key_transforms.rotate;
  d.unrotate_output = f.value_transforms.rotate;
  d.rotation_signs = m.rotation_signs.empty() ? nullptr : m.rotation_signs.data();
  d.pre_rope = f.key_transforms.pre_rope;
  if (d.pre_rope) {
    d.rope_pairing = m.key_rope.pairing;
    d.rotary_dims = m.key_rope.rotary_dims > 0 ? m.key_rope.rotary_dims : m.row.head_dim;
  }
  // Without a device budget the cache is resident on the host: it streams through two slots.
  d.slots = m.plan.device_slots > 0 ? m.plan.device_slots : 2;
  d.slot_bytes = m.plan.slot_bytes;
  d.window_rows = m.config.page_positions;
  m.device_bounce.resize(static_cast<size_t>(d.slot_bytes));
  if (Status s = device.Begin(d); !s.ok()) return s;

  const int32_t P = m.config.page_positions;
  const int64_t n_pages = (view.positions + P - 1) / P;
  const int64_t elems = m.row.elems();
  for (int64_t p = 0; p < n_pages; ++p) {
    Result<int64_t> bytes = m.FillSlot(layer, p, view, m.device_bounce.data());
    if (!bytes.ok()) return bytes.status();
    KvDeviceWindow w;
    w.slot = static_cast<int32_t>(p % d.slots);
    w.page = p;
    w.first_position = p * P;
    w.bytes = *bytes;
    int64_t f32_at = m.store->page_bytes(layer);  // FillSlot's order: K head, K residual, V head, V residual
    KvDeviceWindow::Tensor* tensors[2] = {&w.k, &w.v};
    for (int which = 0; which < 2; ++which) {
      const Impl::PageRows r = m.RowsOfPage(layer, which, p, view);
      KvDeviceWindow::Tensor& t = *tensors[which];
      t.blocks_offset = which == 0 ? 0 : m.KeyRegionBytes(layer);
      t.n_head = r.n_head;
      t.n_block = r.n_block;
      t.head_offset = f32_at;
      t.residual_offset = f32_at + r.n_head * elems * 4;
      f32_at += r.f32_rows() * elems * 4;
      w.n_rows = r.n_rows;
    }
    if (d.pre_rope) {
      const int32_t half = d.rotary_dims / 2;
      w.key_rope.resize(static_cast<size_t>(w.n_rows * half * 2));
      for (int64_t r = 0; r < w.n_rows; ++r) {
        RopeCosSin(m.row.head_dim, w.first_position + r, m.key_rope, w.key_rope.data() + r * half * 2);
      }
    }
    if (Status s = device.Upload(w.slot, m.device_bounce.data(), w.bytes); !s.ok()) return s;
    if (Status s = device.Attend(w); !s.ok()) return s;
  }
  return device.Finish();
}

}  // namespace kvq
