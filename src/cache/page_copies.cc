// AppendPageCopies (page_copies.h): a benchmark's shortcut, over the cache's private state.
#include "cache/page_copies.h"

#include <fmt/format.h>

#include <cstring>
#include <string>
#include <vector>

#include "cache/kv_cache_impl.h"

namespace kvq {
namespace {

Status Bad(const std::string& message) { return Status::Error("KV cache: " + message); }

}  // namespace

Status AppendPageCopies(KvCache& cache, int64_t layer, int64_t first_source, int64_t source_pages,
                        int64_t n_pages) {
  auto& m = KvCacheInternal::Of(cache);  // KvCache::Impl, private to all but its friends
  if (!m.broken.ok()) return m.broken;
  if (layer < 0 || layer >= m.config.n_layers) return Bad(fmt::format("no layer {}", layer));
  auto& L = m.layers[layer];
  const int32_t P = m.config.page_positions;
  for (int which = 0; which < 2; ++which) {
    const KvTransforms& t = m.Transforms(layer, which);
    if (t.sinks > 0 || t.residual > 0) {
      return Bad(fmt::format("page copies need specs without sinks or a residual (layer {} has {})",
                             layer, LayerFormatsName(m.formats[layer])));
    }
  }
  m.DropEncodedF32(L);
  if (L.positions % P != 0 || L.encoded[0] != L.positions || L.encoded[1] != L.positions) {
    return Bad(
        fmt::format("page copies need layer {} to end on a page boundary (it holds {} positions, "
                    "pages of {})",
                    layer, L.positions, P));
  }
  const int64_t full_pages = L.positions / P;
  if (source_pages <= 0 || first_source < 0 || first_source + source_pages > full_pages) {
    return Bad(fmt::format("source pages {}..{} are not among layer {}'s {} full pages",
                           first_source, first_source + source_pages - 1, layer, full_pages));
  }
  if (n_pages < 0 || L.positions + n_pages * P > m.config.max_positions) {
    return Bad(fmt::format(
        "appending {} pages of {} positions to {} would pass the context of {} positions", n_pages,
        P, L.positions, m.config.max_positions));
  }
  // The sources, read once: on disk only pages being filled are in RAM. [source_pages][page_bytes]
  const int64_t bytes = m.store->page_bytes(layer);
  std::vector<uint8_t> sources(static_cast<size_t>(source_pages * bytes));
  for (int64_t s = 0; s < source_pages; ++s) {
    if (Status st = m.store->Read(layer, first_source + s, sources.data() + s * bytes); !st.ok())
      return st;
  }
  for (int64_t i = 0; i < n_pages; ++i) {
    const int64_t page = full_pages + i;
    Result<uint8_t*> dst = m.store->Writable(layer, page);
    if (!dst.ok()) return m.Break(dst.status());
    std::memcpy(*dst, sources.data() + (i % source_pages) * bytes, static_cast<size_t>(bytes));
    if (Status s = m.store->Filled(layer, page); !s.ok()) return m.Break(s);
    L.positions += P;  // page by page, so an I/O error leaves the count at the pages written
    L.encoded = L.held_from = {L.positions, L.positions};
  }
  return Status::Ok();
}

}  // namespace kvq
