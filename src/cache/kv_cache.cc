// KvCache (see kvq/kv_cache.h): configuration checks and the tier plan, and attention page by page
// through the tiers. Rows in (Append, page copies) are in kv_cache_append.cc; snapshots (Export /
// Import / Save / Load) in kv_cache_snapshot.cc.
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

KvCache::Impl::PageRows KvCache::Impl::RowsOfPage(int64_t layer, int which, int64_t page) const {
  const Layer& L = layers[layer];
  const int64_t P = config.page_positions;
  PageRows r;
  r.first = page * P;
  r.n_rows = std::clamp<int64_t>(L.positions - r.first, 0, P);
  const int64_t end = r.first + r.n_rows;
  const int64_t head_end = std::clamp<int64_t>(Transforms(layer, which).sinks, r.first, end);
  const int64_t block_end = std::clamp<int64_t>(L.encoded[which], head_end, end);
  r.n_head = head_end - r.first;
  r.n_block = block_end - r.first;
  r.residual_first = block_end - L.encoded[which];
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

KvWindow KvCache::Impl::Window(int64_t layer, int64_t page, const uint8_t* page_data,
                               const std::array<const float*, 2>& head,
                               const std::array<const float*, 2>& residual) const {
  const Layer& L = layers[layer];
  KvWindow w;
  w.first_position = page * config.page_positions;
  if (formats[layer].key_transforms.pre_rope) w.key_rope = &key_rope;
  RowsView* views[2] = {&w.k, &w.v};
  for (int which = 0; which < 2; ++which) {
    const PageRows r = RowsOfPage(layer, which, page);
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

Result<int64_t> KvCache::Impl::FillSlot(int64_t layer, int64_t p, uint8_t* dst) const {
  const Layer& L = layers[layer];
  if (SlotHasBlockRows(layer, p)) {
    if (Status s = store->Read(layer, p, dst); !s.ok()) return s;
  }
  int64_t bytes = store->page_bytes(layer);
  const int64_t elems = row.elems();
  for (int which = 0; which < 2; ++which) {
    const PageRows r = RowsOfPage(layer, which, p);
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

bool KvCache::Impl::SlotHasBlockRows(int64_t layer, int64_t p) const {
  for (int which = 0; which < 2; ++which) {
    const PageRows r = RowsOfPage(layer, which, p);
    if (r.n_block > r.n_head) return true;
  }
  return false;
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
  // bytes), then the page's f32 rows of K (head rows, residual rows), then those of V. A page
  // none of whose rows are in blocks yet is not read at all.
  class Pages final : public KvWindowSource {
   public:
    Pages(const Impl& m, int64_t layer, int64_t n_pages) : m_(m), layer_(layer), n_pages_(n_pages) {}
    int64_t n_windows() const override { return n_pages_; }
    Result<KvWindow> Acquire(int64_t p) override {
      const Impl::Layer& L = m_.layers[layer_];
      const int64_t elems = m_.row.elems();
      if (!m_.streamer) {
        const uint8_t* page = m_.store->InHost(layer_, p);
        if (page == nullptr && HasBlockRows(m_, layer_, p)) {
          return Bad(fmt::format("page {} of layer {} is not resident", p, layer_));
        }
        std::array<const float*, 2> head{}, residual{};
        for (int which = 0; which < 2; ++which) {
          const Impl::PageRows r = m_.RowsOfPage(layer_, which, p);
          if (r.n_head > 0) head[which] = L.sinks[which].data() + r.first * elems;
          if (r.n_block < r.n_rows) residual[which] = L.residual[which].data() + r.residual_first * elems;
        }
        return m_.Window(layer_, p, page, head, residual);
      }
      Result<const uint8_t*> slot = m_.streamer->Acquire(p);
      if (!slot.ok()) return slot.status();
      const auto* f32 = reinterpret_cast<const float*>(*slot + m_.store->page_bytes(layer_));
      std::array<const float*, 2> head{}, residual{};
      for (int which = 0; which < 2; ++which) {
        const Impl::PageRows r = m_.RowsOfPage(layer_, which, p);
        head[which] = f32;
        residual[which] = f32 + r.n_head * elems;
        f32 += r.f32_rows() * elems;
      }
      return m_.Window(layer_, p, HasBlockRows(m_, layer_, p) ? *slot : nullptr, head, residual);
    }
    void Release(int64_t p) override {
      if (m_.streamer) m_.streamer->Release(p);
    }
    static bool HasBlockRows(const Impl& m, int64_t layer, int64_t p) { return m.SlotHasBlockRows(layer, p); }

   private:
    const Impl& m_;
    int64_t layer_, n_pages_;
  };
  const Impl::Layer& L = m.layers[layer];
  const int32_t P = m.config.page_positions;
  const int64_t n_pages = (L.positions + P - 1) / P;
  if (m.formats[layer].key_transforms.rotate) {  // scores against rotated keys: rotate q alike
    const int64_t n = int64_t{state.n_tokens()} * st.n_heads * st.head_dim;
    m.rotated_q.assign(q, q + n);
    RotateHeads(m.rotation_signs.data(), st.head_dim, int64_t{state.n_tokens()} * st.n_heads,
                m.rotated_q.data());
    q = m.rotated_q.data();
  }
  Pages pages(m, layer, n_pages);
  if (!m.streamer) return AttendWindows(options, q, first_query_position, pages, state);
  auto fill = [&m, layer](int64_t p, uint8_t* dst) { return m.FillSlot(layer, p, dst); };
  m.streamer->Begin(fill, n_pages);
  struct EndGuard {  // the stream ends on every path out, so the next Begin finds it idle
    PageStreamer& streamer;
    ~EndGuard() { streamer.End(); }
  } end_guard{*m.streamer};
  return AttendWindows(options, q, first_query_position, pages, state);
}

void KvCache::FinishAttention(int64_t layer, const AttentionState& state, float* out) const {
  kvq::FinishAttention(state, out);
  if (impl_->formats[layer].value_transforms.rotate) {
    const AttentionShape s = state.shape();
    UnrotateHeads(impl_->rotation_signs.data(), s.head_dim, int64_t{state.n_tokens()} * s.n_heads, out);
  }
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
