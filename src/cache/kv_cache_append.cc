// KvCache rows in (see kvq/kv_cache.h): transforms applied, rows held in f32 while they are sinks
// or in the residual, encoded into pages as they age out, pages written as both tensors fill
// them; and page copies for benchmarks.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "cache/kv_cache_impl.h"
#include "formats/transforms/hadamard.h"

namespace kvq {
namespace {

Status Bad(const std::string& message) { return Status::Error("KV cache: " + message); }

}  // namespace

void KvCache::Impl::DropEncodedF32(Layer& L) const {
  const int64_t elems = row.elems();
  for (int which = 0; which < 2; ++which) {
    std::vector<float>& held = L.residual[which];
    held.erase(held.begin(), held.begin() + (L.encoded[which] - L.held_from[which]) * elems);
    L.held_from[which] = L.encoded[which];
  }
}

Status KvCache::Impl::EncodeAged(int64_t layer, int which, int64_t n, int64_t keep_from) {
  Layer& L = layers[layer];
  const Codec& codec = Tensor(layer, which);
  const KvTransforms& t = Transforms(layer, which);
  const int64_t target = EncodedRows(codec, t, n);
  if (target <= L.encoded[which]) return Status::Ok();
  const int64_t elems = row.elems();
  const int32_t G = codec.rows_per_block;
  const int32_t P = config.page_positions;
  std::vector<float>& held = L.residual[which];  // rows [held_from, n)
  const int64_t skip_held = L.encoded[which] - L.held_from[which];  // f32 copies of encoded rows
  // Per-tensor scales (fp8) from the rows about to be encoded and those held with them: the
  // first rows written, sinks excluded (a sink never reaches a scale).
  if (codec.calibrated && !L.calibrated[which]) {
    const int64_t skip = std::max<int64_t>(0, t.sinks - L.encoded[which]);
    const int64_t rows = n - L.encoded[which] - skip;
    if (rows > 0) {
      L.args[which].tensor_scale = codec.calibrate(held.data() + (skip_held + skip) * elems, rows * elems);
      L.calibrated[which] = true;
      L.calibrated_through[which] = n;
    }
  }
  const int64_t block_bytes = codec.block_bytes(row);
  const int64_t region_offset = which == 0 ? 0 : KeyRegionBytes(layer);
  for (int64_t first = L.encoded[which]; first < target; first += G) {
    const float* rows = held.data() + (first - L.held_from[which]) * elems;  // [G][elems]
    if (first < t.sinks) {
      // Sink slots in a block hold a stand-in — the block's first non-sink row, or zeros — so
      // the sink's own numbers (often the largest in the tensor) never set a block's scales.
      block_rows.assign(rows, rows + G * elems);
      const int64_t n_sinks = std::min<int64_t>(G, t.sinks - first);
      for (int64_t r = 0; r < n_sinks; ++r) {
        float* dst = block_rows.data() + r * elems;
        if (n_sinks < G) {
          std::memcpy(dst, rows + n_sinks * elems, elems * sizeof(float));
        } else {
          std::fill(dst, dst + elems, 0.0f);
        }
      }
      rows = block_rows.data();
    }
    const int64_t page = first / P;
    Result<uint8_t*> buf = store->Writable(layer, page);
    if (!buf.ok()) return Break(buf.status());
    codec.encode_block(rows, *buf + region_offset + (first % P) / G * block_bytes, L.args[which]);
    // The page is complete when both tensors have encoded its last row.
    const int64_t other = L.encoded[1 - which];
    const int64_t end = first + G;
    if (end % P == 0 && other >= end) {
      if (Status s = store->Filled(layer, page); !s.ok()) return Break(s);
    }
    L.encoded[which] = end;
  }
  const int64_t drop_to = std::clamp(keep_from, L.held_from[which], L.encoded[which]);
  held.erase(held.begin(), held.begin() + (drop_to - L.held_from[which]) * elems);
  L.held_from[which] = drop_to;
  return Status::Ok();
}

Status KvCache::Append(int64_t layer, const float* k, const float* v, int64_t n) {
  Impl& m = *impl_;
  if (!m.broken.ok()) return m.broken;
  if (layer < 0 || layer >= m.config.n_layers) return Bad(fmt::format("no layer {}", layer));
  Impl::Layer& L = m.layers[layer];
  if (n < 0 || L.positions + n > m.config.max_positions) {
    return Bad(fmt::format("appending {} positions to {} would pass the context of {} positions",
                           n, L.positions, m.config.max_positions));
  }
  m.DropEncodedF32(L);  // the previous Append's queries have attended
  const int64_t elems = m.row.elems();
  const float* rows[2] = {k, v};  // [n][n_kv_heads][head_dim]
  for (int which = 0; which < 2; ++which) {
    const KvTransforms& t = m.Transforms(layer, which);
    L.args[which].shape = m.row;
    if (t.rotate) {
      std::vector<float>& r = m.rotated_rows[which];
      r.assign(rows[which], rows[which] + n * elems);
      RotateHeads(m.rotation_signs.data(), m.row.head_dim, n * m.row.n_kv_heads, r.data());
      rows[which] = r.data();
    }
    const int64_t n_sinks = std::clamp<int64_t>(t.sinks - L.positions, 0, n);
    L.sinks[which].insert(L.sinks[which].end(), rows[which], rows[which] + n_sinks * elems);
    L.residual[which].insert(L.residual[which].end(), rows[which], rows[which] + n * elems);
  }
  // The first new row's query reads rows from EncodedRows(positions + 1) on in f32 (Attend's views):
  // those stay in f32 until the next Append, also once encoded.
  for (int which = 0; which < 2; ++which) {
    const int64_t keep_from = EncodedRows(m.Tensor(layer, which), m.Transforms(layer, which), L.positions + 1);
    if (Status s = m.EncodeAged(layer, which, L.positions + n, keep_from); !s.ok()) return s;
  }
  L.positions += n;
  return Status::Ok();
}

KvCache::PageLayout KvCache::LayerPageLayout(int64_t layer) const {
  const Impl& m = *impl_;
  if (layer < 0 || layer >= m.config.n_layers) return {};
  return {.page_bytes = m.store->page_bytes(layer), .value_offset = m.KeyRegionBytes(layer)};
}

Status KvCache::AppendEncodedPages(int64_t layer, const uint8_t* pages, int64_t n_pages) {
  Impl& m = *impl_;
  if (!m.broken.ok()) return m.broken;
  if (layer < 0 || layer >= m.config.n_layers) return Bad(fmt::format("no layer {}", layer));
  Impl::Layer& L = m.layers[layer];
  const int32_t P = m.config.page_positions;
  for (int which = 0; which < 2; ++which) {
    // rot changes only the rows' values (the caller encodes rotated rows), prerope only which rows
    // are stored (the caller encodes the keys before RoPE; attention ropes them as it reads them,
    // by position: no state beside the bytes); sinks and residual keep f32 rows a page's bytes do
    // not carry.
    KvTransforms t = m.Transforms(layer, which);
    t.rotate = false;
    t.pre_rope = false;
    if (t.any() || m.Tensor(layer, which).calibrated) {
      return Bad(fmt::format(
          "encoded pages need specs without transforms but rot and prerope, and no calibrated codec (layer {} "
          "has {})",
          layer, LayerFormatsName(m.formats[layer])));
    }
    L.args[which].shape = m.row;
  }
  m.DropEncodedF32(L);
  if (L.positions % P != 0 || L.encoded[0] != L.positions || L.encoded[1] != L.positions) {
    return Bad(
        fmt::format("encoded pages need layer {} to end on a page boundary (it holds {} positions, "
                    "pages of {})",
                    layer, L.positions, P));
  }
  if (n_pages < 0 || L.positions + n_pages * P > m.config.max_positions) {
    return Bad(fmt::format(
        "appending {} pages of {} positions to {} would pass the context of {} positions", n_pages,
        P, L.positions, m.config.max_positions));
  }
  const int64_t bytes = m.store->page_bytes(layer);
  for (int64_t i = 0; i < n_pages; ++i) {
    Result<uint8_t*> dst = m.store->Writable(layer, L.positions / P);
    if (!dst.ok()) return m.Break(dst.status());
    std::memcpy(*dst, pages + i * bytes, static_cast<size_t>(bytes));
    if (Status s = m.store->Filled(layer, L.positions / P); !s.ok()) return m.Break(s);
    L.positions += P;  // page by page, so an I/O error leaves the count at the pages written
    L.encoded = L.held_from = {L.positions, L.positions};
  }
  return Status::Ok();
}

Status KvCache::ReadPage(int64_t layer, int64_t page, uint8_t* out) const {
  const Impl& m = *impl_;
  if (layer < 0 || layer >= m.config.n_layers) return Bad(fmt::format("no layer {}", layer));
  const int64_t P = m.config.page_positions, held = (m.layers[layer].positions + P - 1) / P;
  if (page < 0 || page >= held)
    return Bad(fmt::format("layer {} holds {} pages (asked for page {})", layer, held, page));
  return m.store->Read(layer, page, out);
}

}  // namespace kvq

namespace kvq {

int64_t KvCache::TruncationPoint(int64_t n) const {
  const Impl& m = *impl_;
  // A recurrent state holds every position so far folded in: only "drop nothing" keeps it.
  if (!m.state.empty()) return n > 0 && !m.store->on_disk() && n >= m.layers[0].positions ? n : 0;
  return RowsTruncationPoint(n);
}

int64_t KvCache::RowsTruncationPoint(int64_t n) const {
  const Impl& m = *impl_;
  if (n <= 0 || m.store->on_disk()) return 0;  // a disk master's full pages are in the file
  if (m.CanDropToView(n)) return n;  // within the last Append's rows: exact for every spec
  int64_t point = n;
  for (int64_t l = 0; l < m.config.n_layers; ++l) {
    for (int which = 0; which < 2; ++which) {
      const KvTransforms& t = m.Transforms(l, which);
      const Codec& codec = m.Tensor(l, which);
      // Rows held in f32 at the old length are already encoded at the shorter one (or, for sinks,
      // their stand-ins are): only specs whose blocks depend on their own rows alone truncate.
      if (t.sinks > 0 || t.residual > 0 || codec.calibrated) return 0;
      point = point / codec.rows_per_block * codec.rows_per_block;
    }
  }
  return point;
}

Status KvCache::Truncate(int64_t n) {
  Impl& m = *impl_;
  if (!m.broken.ok()) return m.broken;
  for (const Impl::Layer& L : m.layers) {
    if (n < 0 || n > L.positions) {
      return Bad(fmt::format("cannot truncate to {} positions: a layer holds {}", n, L.positions));
    }
  }
  if (!m.state.empty() && n != 0 && n < m.layers[0].positions) {
    return Bad(fmt::format(
        "cannot truncate to {} of {} positions: the cache holds a model's recurrent state "
        "({} floats), which cannot be rolled back without a copy of it at {} positions (truncate to 0 "
        "to start again)", n, m.layers[0].positions, m.state.size(), n));
  }
  if (n == 0) std::fill(m.state.begin(), m.state.end(), 0.0f);
  return DropRows(n);
}

Status KvCache::Truncate(int64_t n, std::span<const float> state) {
  Impl& m = *impl_;
  if (!m.broken.ok()) return m.broken;
  if (m.state.empty()) return Bad("cannot restore a recurrent state: this cache holds none");
  if (state.size() != m.state.size()) {
    return Bad(fmt::format("cannot restore a recurrent state of {} floats: the cache holds {}", state.size(),
                           m.state.size()));
  }
  for (const Impl::Layer& L : m.layers) {
    if (n < 1 || n > L.positions) {
      return Bad(fmt::format("cannot truncate to {} positions with a saved state: a layer holds {} (and 0 "
                             "needs no state)", n, L.positions));
    }
  }
  if (Status st = DropRows(n); !st.ok()) return st;
  std::copy(state.begin(), state.end(), m.state.begin());
  return Status::Ok();
}

Status KvCache::DropRows(int64_t n) {
  Impl& m = *impl_;
  if (n != 0 && RowsTruncationPoint(n) != n) {
    return Bad(fmt::format("cannot drop positions in place at {} (the nearest point is {}: groups, sinks, a "
                           "residual or a disk master keep rows that depend on later ones)",
                           n, RowsTruncationPoint(n)));
  }
  if (n != 0 && m.CanDropToView(n)) return m.DropToView(n);
  const int32_t P = m.config.page_positions;
  for (int64_t l = 0; l < m.config.n_layers; ++l) {
    Impl::Layer& L = m.layers[l];
    if (n == 0) {
      m.store->Clear(l);
      L = Impl::Layer{};
      continue;
    }
    // n is a whole number of every codec's groups, so rows [0, n) are all in blocks.
    m.store->DropFrom(l, (n + P - 1) / P);
    if (n % P != 0) {
      Result<uint8_t*> page = m.store->Writable(l, n / P);
      if (!page.ok()) return m.Break(page.status());
      for (int which = 0; which < 2; ++which) {
        const Codec& codec = m.Tensor(l, which);
        const int64_t region = which == 0 ? 0 : m.KeyRegionBytes(l);
        const int64_t kept = (n % P) / codec.rows_per_block * codec.block_bytes(m.row);
        std::memset(*page + region + kept, 0, static_cast<size_t>(m.TensorPageBytes(codec) - kept));
      }
    }
    L.positions = n;
    L.encoded = L.held_from = {n, n};
    L.residual[0].clear();
    L.residual[1].clear();
  }
  return Status::Ok();
}

}  // namespace kvq

namespace kvq {

bool KvCache::Impl::CanDropToView(int64_t n) const {
  if (n <= 0 || store->on_disk()) return false;
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const Layer& L = layers[l];
    if (n > L.positions || !Holds(l, ViewAt(l, n))) return false;
    for (int which = 0; which < 2; ++which) {
      if (n < L.held_from[which]) return false;
      if (L.calibrated[which] && L.calibrated_through[which] > n) return false;
    }
  }
  return true;
}

Status KvCache::Impl::DropToView(int64_t n) {
  const int32_t P = config.page_positions;
  const int64_t elems = row.elems();
  for (int64_t l = 0; l < config.n_layers; ++l) {
    Layer& L = layers[l];
    const LayerView v = ViewAt(l, n);
    // Pages hold encoded rows only: keep those with a row in blocks, and zero what follows each
    // tensor's blocks in the pages kept, as a cache that appended only n rows has them.
    const int64_t first_partial = std::min(v.encoded[0], v.encoded[1]) / P;
    const int64_t keep_pages = (std::max(v.encoded[0], v.encoded[1]) + P - 1) / P;
    store->DropFrom(l, keep_pages);
    for (int64_t page = first_partial; page < keep_pages; ++page) {
      Result<uint8_t*> data = store->Writable(l, page);
      if (!data.ok()) return Break(data.status());
      for (int which = 0; which < 2; ++which) {
        const Codec& codec = Tensor(l, which);
        const int64_t rows_kept = std::clamp<int64_t>(v.encoded[which] - page * P, 0, P);
        const int64_t kept = rows_kept / codec.rows_per_block * codec.block_bytes(row);
        uint8_t* region = *data + (which == 0 ? 0 : KeyRegionBytes(l));
        std::memset(region + kept, 0, static_cast<size_t>(TensorPageBytes(codec) - kept));
      }
    }
    for (int which = 0; which < 2; ++which) {
      const int64_t sinks = std::min<int64_t>(n, Transforms(l, which).sinks);
      L.sinks[which].resize(static_cast<size_t>(std::min<int64_t>(sinks, L.sinks[which].size() / elems) * elems));
      L.residual[which].resize(static_cast<size_t>((n - L.held_from[which]) * elems));
      L.encoded[which] = v.encoded[which];
    }
    L.positions = n;
  }
  return Status::Ok();
}

}  // namespace kvq
