// KvCache snapshots: Export flattens each layer's encoded blocks (K then V) in stored order plus
// its f32 residual and sink rows, transforms and scales, and a hybrid model's recurrent state into
// a SnapshotImage; Import checks an
// image against this cache (shape, formats, transforms, rotation seed, lengths) before touching
// anything, then writes the pages back through the page store, so a disk master is rebuilt on disk.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "cache/kv_cache_impl.h"
#include "cache/snapshot.h"

namespace kvq {
namespace {

// Bytes of the complete blocks holding `rows` encoded rows of a tensor.
int64_t BlockBytes(const Codec& codec, RowShape row, int64_t rows) {
  return rows / codec.rows_per_block * codec.block_bytes(row);
}

bool UsesRotation(const std::vector<LayerFormats>& formats) {
  return std::any_of(formats.begin(), formats.end(), [](const LayerFormats& f) {
    return f.key_transforms.rotate || f.value_transforms.rotate;
  });
}

}  // namespace

Result<SnapshotImage> KvCache::Export(const ModelFingerprint& model) const {
  const Impl& m = *impl_;
  if (model.n_layers != m.config.n_layers || model.n_kv_heads != m.config.n_kv_heads ||
      model.head_dim != m.config.head_dim) {
    return Status::Error("snapshot: the model fingerprint does not match the cache's shape");
  }
  SnapshotImage image;
  image.model = model;
  image.n_positions = m.layers[0].positions;
  image.rotation_seed = m.config.rotation_seed;
  image.state = m.state;
  const int32_t P = m.config.page_positions;
  std::vector<uint8_t> page;
  for (int64_t l = 0; l < m.config.n_layers; ++l) {
    const Impl::Layer& L = m.layers[l];
    if (L.positions != image.n_positions) {
      return Status::Error(fmt::format("snapshot: layer {} holds {} positions, layer 0 holds {}; "
                                       "a snapshot needs every layer at the same position", l,
                                       L.positions, image.n_positions));
    }
    SnapshotLayer& out = image.layers.emplace_back();
    out.key_format = static_cast<uint16_t>(m.formats[l].key->id);
    out.value_format = static_cast<uint16_t>(m.formats[l].value->id);
    out.transforms = {m.formats[l].key_transforms, m.formats[l].value_transforms};
    out.key_scale = L.args[0].tensor_scale;
    out.value_scale = L.args[1].tensor_scale;
    out.scales_calibrated = L.calibrated[0] || L.calibrated[1];
    for (int which = 0; which < 2; ++which) {  // rows [encoded, positions): not Attend's f32 copies
      const std::vector<float>& held = L.residual[which];
      out.residual[which].assign(held.begin() + (L.encoded[which] - L.held_from[which]) * m.row.elems(), held.end());
    }
    out.sinks = L.sinks;
    page.resize(m.store->page_bytes(l));
    std::vector<uint8_t>* dst[2] = {&out.key_bytes, &out.value_bytes};
    const int64_t encoded = std::max(L.encoded[0], L.encoded[1]);
    for (int64_t p = 0; p * P < encoded; ++p) {
      if (Status s = m.store->Read(l, p, page.data()); !s.ok()) return s;
      for (int which = 0; which < 2; ++which) {
        const int64_t rows = std::clamp<int64_t>(L.encoded[which] - p * P, 0, P);
        const uint8_t* region = m.TensorRegion(page.data(), l, which);
        dst[which]->insert(dst[which]->end(), region, region + BlockBytes(m.Tensor(l, which), m.row, rows));
      }
    }
  }
  return image;
}

Status KvCache::Import(const SnapshotImage& image) {
  Impl& m = *impl_;
  if (!m.broken.ok()) return m.broken;
  const auto bad = [](const std::string& why) { return Status::Error("snapshot does not fit this cache: " + why); };
  if (image.model.n_layers != m.config.n_layers || image.model.n_kv_heads != m.config.n_kv_heads ||
      image.model.head_dim != m.config.head_dim || static_cast<int64_t>(image.layers.size()) != m.config.n_layers) {
    return bad("another shape");
  }
  if (image.n_positions < 0 || image.n_positions > m.config.max_positions) {
    return bad(fmt::format("{} positions, the context is {}", image.n_positions, m.config.max_positions));
  }
  if (UsesRotation(m.formats) && image.rotation_seed != m.config.rotation_seed) {
    return bad(fmt::format("rotation seed {:016x}, the cache's is {:016x}", image.rotation_seed,
                           m.config.rotation_seed));
  }
  if (image.state.size() != m.state.size()) {
    return bad(fmt::format("{} floats of recurrent state, the cache carries {}", image.state.size(), m.state.size()));
  }
  const int64_t n = image.n_positions;
  const int64_t elems = m.row.elems();
  for (int64_t l = 0; l < m.config.n_layers; ++l) {
    const SnapshotLayer& in = image.layers[l];
    if (in.key_format != static_cast<uint16_t>(m.formats[l].key->id) ||
        in.value_format != static_cast<uint16_t>(m.formats[l].value->id)) {
      return bad(fmt::format("layer {} formats differ", l));
    }
    const std::vector<uint8_t>* bytes[2] = {&in.key_bytes, &in.value_bytes};
    for (int which = 0; which < 2; ++which) {
      const KvTransforms& t = m.Transforms(l, which);
      if (in.transforms[which] != t) {
        return bad(fmt::format("layer {} {} transforms differ", l, which == 0 ? "key" : "value"));
      }
      const Codec& codec = m.Tensor(l, which);
      const int64_t encoded = EncodedRows(codec, t, n);
      if (static_cast<int64_t>(bytes[which]->size()) != BlockBytes(codec, m.row, encoded) ||
          static_cast<int64_t>(in.residual[which].size()) != (n - encoded) * elems ||
          static_cast<int64_t>(in.sinks[which].size()) != std::min<int64_t>(n, t.sinks) * elems) {
        return bad(fmt::format("layer {} holds the wrong number of bytes for {} positions", l, n));
      }
    }
  }
  // Valid: replace the contents.
  const int32_t P = m.config.page_positions;
  for (int64_t l = 0; l < m.config.n_layers; ++l) {
    const SnapshotLayer& in = image.layers[l];
    Impl::Layer& L = m.layers[l];
    m.store->Clear(l);
    L = Impl::Layer();
    L.args[0] = {.shape = m.row, .tensor_scale = in.key_scale};
    L.args[1] = {.shape = m.row, .tensor_scale = in.value_scale};
    L.calibrated = {in.scales_calibrated && m.Key(l).calibrated, in.scales_calibrated && m.Value(l).calibrated};
    L.residual = in.residual;
    L.sinks = in.sinks;
    for (int which = 0; which < 2; ++which) {
      L.encoded[which] = EncodedRows(m.Tensor(l, which), m.Transforms(l, which), n);
    }
    L.held_from = L.encoded;
    const std::vector<uint8_t>* src[2] = {&in.key_bytes, &in.value_bytes};
    int64_t offset[2] = {0, 0};
    for (int64_t p = 0; p * P < std::max(L.encoded[0], L.encoded[1]); ++p) {
      Result<uint8_t*> page = m.store->Writable(l, p);
      if (!page.ok()) return m.Break(page.status());
      for (int which = 0; which < 2; ++which) {
        const int64_t rows = std::clamp<int64_t>(L.encoded[which] - p * P, 0, P);
        const int64_t bytes = BlockBytes(m.Tensor(l, which), m.row, rows);
        if (bytes > 0) std::memcpy(*page + (which == 0 ? 0 : m.KeyRegionBytes(l)), src[which]->data() + offset[which], bytes);
        offset[which] += bytes;
      }
      if (std::min(L.encoded[0], L.encoded[1]) >= (p + 1) * P) {
        if (Status s = m.store->Filled(l, p); !s.ok()) return m.Break(s);
      }
    }
    L.positions = n;
  }
  m.state = image.state;
  return Status::Ok();
}

Status KvCache::Save(const std::string& path, const ModelFingerprint& model,
                     const std::vector<int32_t>& tokens) const {
  Result<SnapshotImage> image = Export(model);
  if (!image.ok()) return Status::Error(fmt::format("{}: {}", path, image.status().message()));
  image.value().tokens = tokens;
  return WriteSnapshot(path, *image);
}

Result<std::vector<int32_t>> KvCache::Load(const std::string& path, const ModelFingerprint& model) {
  SnapshotExpectation expect{.model = model, .rotation_seed = impl_->config.rotation_seed};
  expect.state_floats = state_floats();
  for (const LayerFormats& f : impl_->formats) {
    expect.key_formats.push_back(static_cast<uint16_t>(f.key->id));
    expect.value_formats.push_back(static_cast<uint16_t>(f.value->id));
    expect.transforms.push_back({f.key_transforms, f.value_transforms});
  }
  Result<SnapshotImage> image = ReadSnapshot(path, expect);
  if (!image.ok()) return image.status();
  if (Status s = Import(*image); !s.ok()) return Status::Error(fmt::format("{}: {}", path, s.message()));
  return std::move(image.value().tokens);
}

}  // namespace kvq
