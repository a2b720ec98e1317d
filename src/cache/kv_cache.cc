// KvCache (see kvq/kv_cache.h): configuration checks and the tier plan, and how a layer's pages
// split into attention windows. Attention itself is in kv_cache_attend.cc; rows in (Append, page
// copies) in kv_cache_append.cc; snapshots (Export / Import / Save / Load) in kv_cache_snapshot.cc.
#include "cache/kv_cache_impl.h"

#include <fmt/format.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cstring>

#include "formats/transforms/hadamard.h"
#include "kvq/kv_memory.h"
#include "kvq/units.h"

namespace kvq {
namespace {

Status Bad(const std::string& message) { return Status::Error("KV cache: " + message); }

}  // namespace

int64_t KvCache::Impl::TensorPageBytes(const Codec& codec) const {
  return config.page_positions / codec.rows_per_block * codec.block_bytes(row);
}

int64_t KvCache::Impl::MaxF32Rows(int64_t layer, int which) const {
  const KvTransforms& t = Transforms(layer, which);
  return std::min<int64_t>(config.max_positions,
                           int64_t{t.sinks} + t.residual + Tensor(layer, which).rows_per_block - 1);
}

int64_t KvCache::Impl::ResidualBytesMax(int64_t layer) const {
  // A page's window never has more f32 rows than positions.
  const int64_t P = config.page_positions;
  return (std::min(P, MaxF32Rows(layer, 0)) + std::min(P, MaxF32Rows(layer, 1))) * row.elems() * 4;
}

KvCache::Impl::LayerView KvCache::Impl::CurrentView(int64_t layer) const {
  const Layer& L = layers[layer];
  return {.positions = L.positions, .encoded = L.encoded};
}

KvCache::Impl::LayerView KvCache::Impl::ViewAt(int64_t layer, int64_t n) const {
  LayerView v{.positions = n};
  for (int which = 0; which < 2; ++which) {
    v.encoded[which] = EncodedRows(Tensor(layer, which), Transforms(layer, which), n);
  }
  return v;
}

bool KvCache::Impl::Holds(int64_t layer, const LayerView& view) const {
  const Layer& L = layers[layer];
  for (int which = 0; which < 2; ++which) {
    // Rows the view reads from the residual: [max(encoded, sinks), positions).
    const int64_t first_f32 = std::max<int64_t>(view.encoded[which], Transforms(layer, which).sinks);
    if (first_f32 < view.positions && view.encoded[which] < L.held_from[which]) return false;
  }
  return view.positions <= L.positions;
}

KvCache::Impl::PageRows KvCache::Impl::RowsOfPage(int64_t layer, int which, int64_t page,
                                                  const LayerView& view) const {
  const Layer& L = layers[layer];
  const int64_t P = config.page_positions;
  PageRows r;
  r.first = page * P;
  r.n_rows = std::clamp<int64_t>(view.positions - r.first, 0, P);
  const int64_t end = r.first + r.n_rows;
  const int64_t head_end = std::clamp<int64_t>(Transforms(layer, which).sinks, r.first, end);
  const int64_t block_end = std::clamp<int64_t>(view.encoded[which], head_end, end);
  r.n_head = head_end - r.first;
  r.n_block = block_end - r.first;
  r.residual_first = block_end - L.held_from[which];
  return r;
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
  if (c.state_floats < 0)
    return Bad(fmt::format("state_floats must be 0 or positive (got {})", c.state_floats));
  if (c.layers.size() != 1 && static_cast<int64_t>(c.layers.size()) != c.n_layers) {
    return Bad(fmt::format("give formats for 1 or {} layers (got {})", c.n_layers, c.layers.size()));
  }
  auto impl = std::make_unique<Impl>();
  impl->config = c;
  impl->row = {.n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim};
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerFormats f = c.layers.size() == 1 ? c.layers[0] : c.layers[l];
    if (f.key == nullptr || f.value == nullptr) return Bad(fmt::format("layer {} has no format", l));
    if (Status s = CheckKvSpec(f.Key(), impl->row); !s.ok()) return Bad(s.message());
    if (Status s = CheckValueSpec(f.Value(), impl->row); !s.ok()) return Bad(s.message());
    if (f.key_transforms.rotate || f.value_transforms.rotate) {
      impl->rotation_signs = RotationSigns(c.rotation_seed, c.head_dim);
    }
    impl->formats.push_back(f);
  }
  impl->layers.resize(c.n_layers);
  if (c.key_rope) {
    const size_t pairs = static_cast<size_t>(c.head_dim / 2);
    if (!c.key_rope->freq_factors.empty() && c.key_rope->freq_factors.size() != pairs) {
      return Bad(fmt::format("key_rope has {} frequency factors; head_dim {} needs {} (or none)",
                             c.key_rope->freq_factors.size(), c.head_dim, pairs));
    }
    impl->key_rope = impl->config.key_rope->Params();  // points into impl's own copy
  }

  // Sizes: pages per layer, the whole cache at max_positions, the largest slot.
  KvTierPlan& plan = impl->plan;
  const int64_t max_pages = (c.max_positions + c.page_positions - 1) / c.page_positions;
  impl->max_pages = max_pages;
  std::vector<int64_t>& page_bytes = impl->page_bytes;
  // Host RAM beside the pages: each tensor's f32 rows (sinks, residual). With a disk master the
  // pages being filled stay in RAM too: K and V may fill different pages, as far apart as the
  // larger residual lag.
  int64_t tails = 0, slot_bytes = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const int64_t bytes = AlignUp64(impl->PageBytes(l));
    page_bytes.push_back(bytes);
    plan.largest_page_bytes = std::max(plan.largest_page_bytes, bytes);
    slot_bytes = std::max(slot_bytes, bytes + impl->ResidualBytesMax(l));
    const int64_t f32_bytes = (impl->MaxF32Rows(l, 0) + impl->MaxF32Rows(l, 1)) * impl->row.elems() * 4;
    const int64_t lag = std::max(impl->MaxF32Rows(l, 0), impl->MaxF32Rows(l, 1));
    tails += bytes * (1 + (lag + c.page_positions - 1) / c.page_positions) + f32_bytes;
    int64_t layer_total = 0;
    if (!CheckedMul(bytes, max_pages, &layer_total) || !CheckedAdd(layer_total, f32_bytes, &layer_total) ||
        !CheckedAdd(plan.total_bytes, layer_total, &plan.total_bytes)) {
      return Bad(fmt::format("{} positions do not fit in 64-bit byte counts", c.max_positions));
    }
  }
  plan.slot_bytes = slot_bytes;
  // A hybrid's recurrent state lives in host RAM beside the pages, whatever the tiers.
  if (!CheckedMul(c.state_floats, int64_t{4}, &plan.state_bytes) || !CheckedAdd(tails, plan.state_bytes, &tails)) {
    return Bad(fmt::format("{} floats of state do not fit in 64-bit byte counts", c.state_floats));
  }
  const std::string with_state =
      plan.state_bytes > 0 ? fmt::format(" (with the model's fixed recurrent state, {})", FormatBytesIec(plan.state_bytes))
                           : "";
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
      return Bad(fmt::format("--kv-host-budget {} cannot hold the page being filled per layer ({} in all{}) "
                             "with a disk master: raise it to at least {}",
                             gib(b.host_bytes), gib(tails), with_state, gib(tails)));
    }
  } else {
    if (!CheckedAdd(plan.total_bytes, plan.state_bytes, &plan.host_bytes)) {
      return Bad(fmt::format("{} positions do not fit in 64-bit byte counts", c.max_positions));
    }
    plan.host_positions = c.max_positions;
    if (b.host_bytes > 0 && b.host_bytes < plan.host_bytes) {
      return Bad(fmt::format("{} positions need {} of KV cache{} but --kv-host-budget is {}: add "
                             "--kv-disk DIR, raise the budget, lower the context, or pick a smaller "
                             "format", c.max_positions, gib(plan.host_bytes), with_state, gib(b.host_bytes)));
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
  // Only a cache that attends needs RoPE's parameters; Plan counts bytes without them.
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const KvSpec key = (*prepared)->formats[l].Key();
    if (key.transforms.pre_rope && !c.key_rope) {
      return Bad(fmt::format("layer {}: KV spec {} stores keys before RoPE, but the cache was given "
                             "no RoPE parameters (KvCacheConfig::key_rope)", l, KvSpecName(key)));
    }
  }
  std::unique_ptr<Impl> impl = std::move(prepared).value();
  KvTierPlan& plan = impl->plan;
  const KvBudgets& b = c.budgets;
  Result<std::unique_ptr<PageStore>> store =
      PageStore::Create(impl->page_bytes, impl->max_pages, b.disk_dir, b.keep_disk_file);
  if (!store.ok()) return Bad(store.status().message());
  impl->store = std::move(store).value();
  impl->state.assign(static_cast<size_t>(c.state_floats), 0.0f);
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

Result<std::unique_ptr<KvCache>> KvCache::Fork() const {
  const Impl& m = *impl_;
  if (!m.broken.ok()) return m.broken;
  if (m.store->on_disk()) {
    return Bad("a cache whose master is on disk (--kv-disk) cannot be forked: its pages live in "
               "one file per cache");
  }
  Result<std::unique_ptr<KvCache>> fork = Create(m.config);
  if (!fork.ok()) return fork.status();
  Impl& f = *(*fork)->impl_;
  f.layers = m.layers;  // positions, scales, f32 residual and sink rows: copied
  f.state = m.state;
  f.store->SharePagesOf(*m.store);
  return fork;
}

int64_t KvCache::page_bytes_held() const { return impl_->store->host_bytes(); }
int64_t KvCache::page_bytes_unshared() const { return impl_->store->unshared_host_bytes(); }

int64_t KvCache::bytes() const {
  const Impl& m = *impl_;
  int64_t total = 0;
  for (int64_t l = 0; l < m.config.n_layers; ++l) {
    for (int which = 0; which < 2; ++which) {
      total += SpecBytesForRows(m.Tensor(l, which), m.Transforms(l, which), m.row, m.layers[l].positions);
    }
  }
  return total;
}

float* KvCache::state() { return impl_->state.empty() ? nullptr : impl_->state.data(); }
const float* KvCache::state() const { return impl_->state.empty() ? nullptr : impl_->state.data(); }
int64_t KvCache::state_floats() const { return static_cast<int64_t>(impl_->state.size()); }
int64_t KvCache::device_peak_bytes() const { return impl_->arena ? impl_->arena->peak_bytes() : 0; }
double KvCache::stream_wait_seconds() const {
  return impl_->streamer ? impl_->streamer->wait_seconds() : 0;
}
double KvCache::stream_copy_seconds() const {
  return impl_->streamer ? impl_->streamer->copy_seconds() : 0;
}

KvWindow KvCache::Impl::Window(int64_t layer, int64_t page, const LayerView& view, const uint8_t* page_data,
                               const std::array<const float*, 2>& head,
                               const std::array<const float*, 2>& residual) const {
  const Layer& L = layers[layer];
  KvWindow w;
  w.first_position = page * config.page_positions;
  if (formats[layer].key_transforms.pre_rope) w.key_rope = &key_rope;
  RowsView* views[2] = {&w.k, &w.v};
  for (int which = 0; which < 2; ++which) {
    const PageRows r = RowsOfPage(layer, which, page, view);
    RowsView& v = *views[which];
    v.codec = &Tensor(layer, which);
    v.args = L.args[which];
    v.args.shape = row;
    v.head = head[which];
    v.n_head_rows = r.n_head;
    v.blocks = page_data != nullptr ? TensorRegion(page_data, layer, which) : nullptr;
    v.first_row = 0;
    v.n_block_rows = r.n_block;
    v.residual = residual[which];
    v.n_rows = r.n_rows;
  }
  return w;
}

Result<int64_t> KvCache::Impl::FillSlot(int64_t layer, int64_t p, const LayerView& view,
                                        uint8_t* dst) const {
  const Layer& L = layers[layer];
  if (SlotHasBlockRows(layer, p, view)) {
    if (Status s = store->Read(layer, p, dst); !s.ok()) return s;
  }
  int64_t bytes = store->page_bytes(layer);
  const int64_t elems = row.elems();
  for (int which = 0; which < 2; ++which) {
    const PageRows r = RowsOfPage(layer, which, p, view);
    const auto copy = [&](const std::vector<float>& rows, int64_t first, int64_t n) {
      // (memcpy from an empty vector's null data() is undefined even for 0 bytes.)
      if (n > 0) std::memcpy(dst + bytes, rows.data() + first * elems, n * elems * 4);
      bytes += n * elems * 4;
    };
    copy(L.sinks[which], r.first, r.n_head);
    copy(L.residual[which], r.residual_first, r.n_rows - r.n_block);
  }
  return bytes;
}

bool KvCache::Impl::SlotHasBlockRows(int64_t layer, int64_t p, const LayerView& view) const {
  for (int which = 0; which < 2; ++which) {
    const PageRows r = RowsOfPage(layer, which, p, view);
    if (r.n_block > r.n_head) return true;
  }
  return false;
}

std::string KvTierPlan::Describe() const {
  std::string s = fmt::format("KV cache {} at full context", FormatBytesIec(total_bytes));
  s += device_slots > 0 ? fmt::format("; device working set {} pages ({}, {} positions per layer)",
                                      device_slots, FormatBytesIec(device_bytes), device_positions)
                        : "; resident (no device working set)";
  s += fmt::format("; host {} ({} positions per layer{})", FormatBytesIec(host_bytes), host_positions,
                   state_bytes > 0 ? fmt::format(", and a fixed recurrent state of {}", FormatBytesIec(state_bytes)) : "");
  if (!disk_file.empty()) {
    s += fmt::format("; disk {} in {} ({} positions per layer)", FormatBytesIec(disk_bytes), disk_file,
                     disk_positions);
  }
  return s;
}

}  // namespace kvq
