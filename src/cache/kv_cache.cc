// KvCache (see kvq/kv_cache.h): configuration checks and the tier plan, appending rows into
// pages (KIVI groups via an f32 residual), and attention page by page through the tiers.
// Snapshots (Export / Import / Save / Load) are in kv_cache_snapshot.cc.
#include "cache/kv_cache_impl.h"

#include <fmt/format.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cstring>

#include "kvq/kv_memory.h"
#include "kvq/units.h"

namespace kvq {
namespace {

Status Bad(const std::string& message) { return Status::Error("KV cache: " + message); }

}  // namespace

int64_t KvCache::Impl::TensorPageBytes(const Codec& codec) const {
  return config.page_positions / codec.rows_per_block * codec.block_bytes(row);
}

int64_t KvCache::Impl::ResidualBytesMax(int64_t layer) const {
  return (std::max(Key(layer).rows_per_block, Value(layer).rows_per_block) - 1) * row.elems() * 4 * 2;
}

Result<std::unique_ptr<KvCache::Impl>> KvCache::Prepare(const KvCacheConfig& c) {
  if (c.n_layers <= 0) return Bad(fmt::format("layers must be positive (got {})", c.n_layers));
  if (c.max_positions <= 0) {
    return Bad(fmt::format("the context must be positive (got {} positions)", c.max_positions));
  }
  if (c.page_positions <= 0 || c.page_positions % 32 != 0) {
    return Bad(fmt::format("page_positions must be a positive multiple of 32, so KIVI key groups "
                           "never straddle pages (got {})", c.page_positions));
  }
  if (c.layers.size() != 1 && static_cast<int64_t>(c.layers.size()) != c.n_layers) {
    return Bad(fmt::format("give formats for 1 or {} layers (got {})", c.n_layers, c.layers.size()));
  }
  auto impl = std::make_unique<Impl>();
  impl->config = c;
  impl->row = {.n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim};
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerFormats f = c.layers.size() == 1 ? c.layers[0] : c.layers[l];
    if (f.key == nullptr || f.value == nullptr) return Bad(fmt::format("layer {} has no format", l));
    for (const FormatDesc* format : {f.key, f.value}) {
      if (Status s = CheckShape(*format, impl->row); !s.ok()) return Bad(s.message());
    }
    impl->formats.push_back(f);
  }
  impl->layers.resize(c.n_layers);

  // Sizes: pages per layer, the whole cache at max_positions, the largest slot.
  KvTierPlan& plan = impl->plan;
  const int64_t max_pages = (c.max_positions + c.page_positions - 1) / c.page_positions;
  impl->max_pages = max_pages;
  std::vector<int64_t>& page_bytes = impl->page_bytes;
  int64_t tails = 0, slot_bytes = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const int64_t bytes = AlignUp64(impl->PageBytes(l));
    page_bytes.push_back(bytes);
    plan.largest_page_bytes = std::max(plan.largest_page_bytes, bytes);
    slot_bytes = std::max(slot_bytes, bytes + impl->ResidualBytesMax(l));
    tails += bytes + impl->ResidualBytesMax(l);
    int64_t layer_total = 0;
    if (!CheckedMul(bytes, max_pages, &layer_total) || !CheckedAdd(plan.total_bytes, layer_total, &plan.total_bytes)) {
      return Bad(fmt::format("{} positions do not fit in 64-bit byte counts", c.max_positions));
    }
  }
  plan.slot_bytes = slot_bytes;
  const KvBudgets& b = c.budgets;
  if (b.device_bytes < 0 || b.host_bytes < 0) return Bad("budgets must not be negative");
  const bool disk = !b.disk_dir.empty();
  const auto gib = [](int64_t x) { return FormatBytesIec(x); };
  if (disk) {
    struct statvfs fs {};
    if (statvfs(b.disk_dir.c_str(), &fs) != 0) {
      return Bad(fmt::format("--kv-disk {}: not a usable folder ({})", b.disk_dir, std::strerror(errno)));
    }
    const int64_t free_bytes = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
    if (free_bytes < plan.total_bytes) {
      return Bad(fmt::format("--kv-disk {} has {} free; the cache needs up to {} for {} positions",
                             b.disk_dir, gib(free_bytes), gib(plan.total_bytes), c.max_positions));
    }
    plan.disk_bytes = plan.total_bytes;
    plan.disk_positions = c.max_positions;
    plan.host_bytes = tails;
    plan.host_positions = std::min<int64_t>(c.page_positions, c.max_positions);
    if (b.host_bytes > 0 && b.host_bytes < tails) {
      return Bad(fmt::format("--kv-host-budget {} cannot hold the page being filled per layer ({} in all) "
                             "with a disk master: raise it to at least {}",
                             gib(b.host_bytes), gib(tails), gib(tails)));
    }
  } else {
    plan.host_bytes = plan.total_bytes;
    plan.host_positions = c.max_positions;
    if (b.host_bytes > 0 && b.host_bytes < plan.total_bytes) {
      return Bad(fmt::format("{} positions need {} of KV cache but --kv-host-budget is {}: add "
                             "--kv-disk DIR, raise the budget, lower the context, or pick a smaller "
                             "format", c.max_positions, gib(plan.total_bytes), gib(b.host_bytes)));
    }
  }
  // The device working set: resident (no staging) unless a budget smaller than the cache is set;
  // a disk master always streams, through two slots if no budget is given.
  int64_t device_budget = b.device_bytes;
  if (device_budget >= plan.total_bytes + slot_bytes && !disk) device_budget = 0;
  if (disk && device_budget == 0) device_budget = 2 * slot_bytes;
  if (device_budget > 0) {
    const int64_t slots = std::min<int64_t>(device_budget / slot_bytes, max_pages + 1);
    if (slots < 2) {
      return Bad(fmt::format("--kv-device-budget {} holds fewer than 2 pages of {} ({} positions per "
                             "page): streaming needs one page in use and one in flight; raise it to at "
                             "least {}", gib(device_budget), gib(slot_bytes), c.page_positions,
                             gib(2 * slot_bytes)));
    }
    plan.device_slots = static_cast<int32_t>(std::min<int64_t>(slots, 64));
    plan.device_bytes = plan.device_slots * slot_bytes;
    plan.device_positions = std::min<int64_t>(int64_t{plan.device_slots} * c.page_positions, c.max_positions);
  }
  return impl;
}

Result<KvTierPlan> KvCache::Plan(const KvCacheConfig& config) {
  Result<std::unique_ptr<Impl>> impl = Prepare(config);
  if (!impl.ok()) return impl.status();
  return (*impl)->plan;
}

int32_t DefaultPagePositions(int64_t max_positions) {
  return static_cast<int32_t>(std::min<int64_t>(256, (max_positions + 31) / 32 * 32));
}

Result<std::unique_ptr<KvCache>> KvCache::Create(const KvCacheConfig& c) {
  Result<std::unique_ptr<Impl>> prepared = Prepare(c);
  if (!prepared.ok()) return prepared.status();
  std::unique_ptr<Impl> impl = std::move(prepared).value();
  KvTierPlan& plan = impl->plan;
  const KvBudgets& b = c.budgets;
  Result<std::unique_ptr<PageStore>> store =
      PageStore::Create(impl->page_bytes, impl->max_pages, b.disk_dir, b.keep_disk_file);
  if (!store.ok()) return Bad(store.status().message());
  impl->store = std::move(store).value();
  plan.disk_file = impl->store->file();
  if (plan.device_slots > 0) {
    impl->arena = std::make_unique<StagingArena>(plan.device_slots, plan.slot_bytes);
    impl->streamer = std::make_unique<PageStreamer>(*impl->arena);
  }
  return std::unique_ptr<KvCache>(new KvCache(std::move(impl)));
}

Status KvCache::Impl::Break(const Status& error) {
  broken = Status::Error("the KV cache is unusable after an I/O error: " + error.message());
  return error;
}

KvCache::KvCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvCache::~KvCache() = default;
const KvCacheConfig& KvCache::config() const { return impl_->config; }
const KvTierPlan& KvCache::plan() const { return impl_->plan; }
int64_t KvCache::positions(int64_t layer) const { return impl_->layers[layer].positions; }
int64_t KvCache::device_peak_bytes() const { return impl_->arena ? impl_->arena->peak_bytes() : 0; }
double KvCache::stream_wait_seconds() const {
  return impl_->streamer ? impl_->streamer->wait_seconds() : 0;
}
double KvCache::stream_copy_seconds() const {
  return impl_->streamer ? impl_->streamer->copy_seconds() : 0;
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
  const Codec* codecs[2] = {&m.Key(layer), &m.Value(layer)};
  const float* rows[2] = {k, v};
  const int64_t elems = m.row.elems();
  for (int which = 0; which < 2; ++which) {
    if (codecs[which]->calibrated && !L.calibrated[which] && n > 0) {
      L.args[which].tensor_scale = codecs[which]->calibrate(rows[which], n * elems);
      L.calibrated[which] = true;
    }
    L.args[which].shape = m.row;
  }
  const int32_t P = m.config.page_positions;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t pos = L.positions + r;
    const int64_t page = pos / P, in_page = pos % P;
    Result<uint8_t*> buf = m.store->Writable(layer, page);
    if (!buf.ok()) return m.Break(buf.status());
    for (int which = 0; which < 2; ++which) {
      const Codec& codec = *codecs[which];
      uint8_t* region = *buf + (which == 0 ? 0 : m.KeyRegionBytes(layer));
      const float* x = rows[which] + r * elems;
      if (codec.rows_per_block == 1) {
        codec.encode_block(x, region + in_page * codec.block_bytes(m.row), L.args[which]);
        continue;
      }
      std::vector<float>& residual = L.residual[which];
      residual.insert(residual.end(), x, x + elems);
      if (static_cast<int64_t>(residual.size()) == codec.rows_per_block * elems) {
        const int64_t group = in_page / codec.rows_per_block;
        codec.encode_block(residual.data(), region + group * codec.block_bytes(m.row), L.args[which]);
        residual.clear();
      }
    }
    if (in_page == P - 1) {
      if (Status s = m.store->Filled(layer, page); !s.ok()) return m.Break(s);
    }
  }
  L.positions += n;
  return Status::Ok();
}

Status KvCache::AppendPageCopies(int64_t layer, int64_t first_source, int64_t source_pages,
                                 int64_t n_pages) {
  Impl& m = *impl_;
  if (!m.broken.ok()) return m.broken;
  if (layer < 0 || layer >= m.config.n_layers) return Bad(fmt::format("no layer {}", layer));
  Impl::Layer& L = m.layers[layer];
  const int32_t P = m.config.page_positions;
  if (L.positions % P != 0 || !L.residual[0].empty() || !L.residual[1].empty()) {
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
  // The sources, read once: on disk only the tail page is in RAM. [source_pages][page_bytes]
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
  }
  return Status::Ok();
}

KvWindow KvCache::Impl::Window(int64_t layer, int64_t page, const uint8_t* page_data,
                               const float* residual_k, const float* residual_v) const {
  const Layer& L = layers[layer];
  const int32_t P = config.page_positions;
  const int64_t rows_in_page = std::min<int64_t>(P, L.positions - page * P);
  const bool last = (page + 1) * P >= L.positions;
  KvWindow w;
  w.first_position = page * P;
  RowsView* views[2] = {&w.k, &w.v};
  const float* residuals[2] = {residual_k, residual_v};
  for (int which = 0; which < 2; ++which) {
    RowsView& v = *views[which];
    v.codec = which == 0 ? &Key(layer) : &Value(layer);
    v.args = L.args[which];
    v.args.shape = row;
    v.blocks = TensorRegion(page_data, layer, which);
    v.first_row = 0;
    const int64_t residual_rows = last ? static_cast<int64_t>(L.residual[which].size()) / row.elems() : 0;
    v.n_block_rows = rows_in_page - residual_rows;
    v.residual = residuals[which];
    v.n_rows = rows_in_page;
  }
  return w;
}

Status KvCache::Attend(int64_t layer, const AttentionOptions& options, const float* q,
                       int64_t first_query_position, AttentionState& state) {
  Impl& m = *impl_;
  if (!m.broken.ok()) return m.broken;
  if (layer < 0 || layer >= m.config.n_layers) return Bad(fmt::format("no layer {}", layer));
  const AttentionShape st = state.shape();
  if (st.n_kv_heads != m.row.n_kv_heads || st.head_dim != m.row.head_dim || st.n_heads <= 0 ||
      st.n_heads % st.n_kv_heads != 0) {
    return Bad(fmt::format("attention state for {} query heads x {} KV heads x head_dim {} does not fit "
                           "a cache of {} KV heads x head_dim {}", st.n_heads, st.n_kv_heads, st.head_dim,
                           m.row.n_kv_heads, m.row.head_dim));
  }
  // A layer's pages as attention windows, taken by AttendWindows in one dispatch: each of its
  // threads walks every page, so streamed pages are consumed in order as the copy thread
  // delivers them (Acquire waits for the page; the last thread done with it frees its slot).
  // Resident pages are read in place. A streamed slot holds the page (its size padded to 64
  // bytes), then on the last page the f32 residual rows of K and V.
  class Pages final : public KvWindowSource {
   public:
    Pages(const Impl& m, int64_t layer, int64_t n_pages, int64_t page_bytes, int64_t residual_k_bytes)
        : m_(m), layer_(layer), n_pages_(n_pages), page_bytes_(page_bytes),
          residual_k_bytes_(residual_k_bytes) {}
    int64_t n_windows() const override { return n_pages_; }
    Result<KvWindow> Acquire(int64_t p) override {
      if (!m_.streamer) {
        const uint8_t* page = m_.store->InHost(layer_, p);
        if (page == nullptr) return Bad(fmt::format("page {} of layer {} is not resident", p, layer_));
        const Impl::Layer& L = m_.layers[layer_];
        return m_.Window(layer_, p, page, L.residual[0].data(), L.residual[1].data());
      }
      Result<const uint8_t*> slot = m_.streamer->Acquire(p);
      if (!slot.ok()) return slot.status();
      const auto* residual_k = reinterpret_cast<const float*>(*slot + page_bytes_);
      const auto* residual_v = reinterpret_cast<const float*>(*slot + page_bytes_ + residual_k_bytes_);
      return m_.Window(layer_, p, *slot, residual_k, residual_v);
    }
    void Release(int64_t p) override {
      if (m_.streamer) m_.streamer->Release(p);
    }

   private:
    const Impl& m_;
    int64_t layer_, n_pages_, page_bytes_, residual_k_bytes_;
  };
  const Impl::Layer& L = m.layers[layer];
  const int32_t P = m.config.page_positions;
  const int64_t n_pages = (L.positions + P - 1) / P;
  const int64_t page_bytes = m.store->page_bytes(layer);
  const int64_t residual_k_bytes = static_cast<int64_t>(L.residual[0].size()) * 4;
  Pages pages(m, layer, n_pages, page_bytes, residual_k_bytes);
  if (!m.streamer) return AttendWindows(options, q, first_query_position, pages, state);
  auto fill = [&m, &L, layer, n_pages, page_bytes, residual_k_bytes](int64_t p, uint8_t* dst) -> Result<int64_t> {
    if (Status s = m.store->Read(layer, p, dst); !s.ok()) return s;
    if (p + 1 < n_pages) return page_bytes;
    // (memcpy from an empty vector's null data() is undefined even for 0 bytes.)
    if (residual_k_bytes > 0) std::memcpy(dst + page_bytes, L.residual[0].data(), residual_k_bytes);
    if (!L.residual[1].empty()) {
      std::memcpy(dst + page_bytes + residual_k_bytes, L.residual[1].data(), L.residual[1].size() * 4);
    }
    return page_bytes + residual_k_bytes + static_cast<int64_t>(L.residual[1].size()) * 4;
  };
  m.streamer->Begin(fill, n_pages);
  struct EndGuard {  // the stream ends on every path out, so the next Begin finds it idle
    PageStreamer& streamer;
    ~EndGuard() { streamer.End(); }
  } end_guard{*m.streamer};
  return AttendWindows(options, q, first_query_position, pages, state);
}

std::string KvTierPlan::Describe() const {
  std::string s = fmt::format("KV cache {} at full context", FormatBytesIec(total_bytes));
  s += device_slots > 0 ? fmt::format("; device working set {} pages ({}, {} positions per layer)",
                                      device_slots, FormatBytesIec(device_bytes), device_positions)
                        : "; resident (no device working set)";
  s += fmt::format("; host {} ({} positions per layer)", FormatBytesIec(host_bytes), host_positions);
  if (!disk_file.empty()) {
    s += fmt::format("; disk {} in {} ({} positions per layer)", FormatBytesIec(disk_bytes), disk_file,
                     disk_positions);
  }
  return s;
}

}  // namespace kvq
