// KvCache::Attend (see kvq/kv_cache.h): a layer's pages as attention windows, resident or streamed
// through the staging arena, for runs of query tokens that read the layer through one view.
//
// Why runs: a block of query tokens is appended before it attends, so by the time the block's
// first token attends, the block may have completed a KIVI or fp8 key group, or pushed rows out of
// a "resN" residual, that were still f32 when that token was appended one at a time. Each query at
// position p therefore reads the layer as a cache holding p + 1 rows held it (Impl::ViewAt); the
// cache keeps the f32 copies of the rows the last Append encoded until the next one. Consecutive
// tokens whose reads agree share one pass over the pages, so per-token formats without a residual
// (every token reads only blocks) take one pass as before. Runs that read different views still
// read the pages before their first difference alike (rows long since in blocks): all the block's
// tokens take those pages in one pass, then each run its own view's remaining pages. Attention
// over windows in turn is the same bits as over their union (AttendWindows), so the split changes
// nothing but the work: a "resN" residual costs each run a few pages, not the whole context.
#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "cache/kv_cache_impl.h"
#include "formats/transforms/hadamard.h"

namespace kvq {
namespace {

Status Bad(const std::string& message) { return Status::Error("KV cache: " + message); }

}  // namespace

// Pages [first_page, first_page + n_pages) of one view as attention windows, taken by AttendWindows in one dispatch: each of its
// threads walks every page, so streamed pages are consumed in order as the copy thread delivers
// them (Acquire waits for the page; the last thread done with it frees its slot). Resident pages
// are read in place. A streamed slot holds the page (its size padded to 64 bytes), then the page's
// f32 rows of K (head rows, residual rows), then those of V. A page none of whose rows are in
// blocks is not read at all.
class KvCache::Impl::Pages final : public KvWindowSource {
 public:
  using View = KvCache::Impl::LayerView;
  Pages(const KvCache::Impl& m, int64_t layer, const View& view, int64_t first_page, int64_t n_pages)
      : m_(m), layer_(layer), view_(view), first_page_(first_page), n_pages_(n_pages) {}
  int64_t n_windows() const override { return n_pages_; }
  Result<KvWindow> Acquire(int64_t i) override {
    const int64_t p = first_page_ + i;
    const KvCache::Impl::Layer& L = m_.layers[layer_];
    const int64_t elems = m_.row.elems();
    const bool has_blocks = m_.SlotHasBlockRows(layer_, p, view_);
    std::array<const float*, 2> head{}, residual{};
    if (!m_.streamer) {
      const uint8_t* page = m_.store->InHost(layer_, p);
      if (page == nullptr && has_blocks) {
        return Bad(fmt::format("page {} of layer {} is not resident", p, layer_));
      }
      for (int which = 0; which < 2; ++which) {
        const KvCache::Impl::PageRows r = m_.RowsOfPage(layer_, which, p, view_);
        if (r.n_head > 0) head[which] = L.sinks[which].data() + r.first * elems;
        if (r.n_block < r.n_rows) residual[which] = L.residual[which].data() + r.residual_first * elems;
      }
      return m_.Window(layer_, p, view_, page, head, residual);
    }
    Result<const uint8_t*> slot = m_.streamer->Acquire(i);
    if (!slot.ok()) return slot.status();
    const auto* f32 = reinterpret_cast<const float*>(*slot + m_.store->page_bytes(layer_));
    for (int which = 0; which < 2; ++which) {
      const KvCache::Impl::PageRows r = m_.RowsOfPage(layer_, which, p, view_);
      head[which] = f32;
      residual[which] = f32 + r.n_head * elems;
      f32 += r.f32_rows() * elems;
    }
    return m_.Window(layer_, p, view_, has_blocks ? *slot : nullptr, head, residual);
  }
  void Release(int64_t i) override {
    if (m_.streamer) m_.streamer->Release(i);
  }

 private:
  const KvCache::Impl& m_;
  int64_t layer_;
  View view_;
  int64_t first_page_;
  int64_t n_pages_;
};

namespace {

// Copies query rows [t0, t0 + n) of `from` into rows [to_t0, to_t0 + n) of `to` (same shape).
void CopyStateRows(const AttentionState& from, int32_t t0, AttentionState& to, int32_t to_t0, int32_t n) {
  const int64_t heads = from.shape().n_heads, hd = from.shape().head_dim;
  for (auto [x, y] : {std::pair{&from.m, &to.m}, {&from.l, &to.l}, {&from.merged_m, &to.merged_m},
                      {&from.merged_l, &to.merged_l}}) {
    std::copy_n(x->begin() + t0 * heads, n * heads, y->begin() + to_t0 * heads);
  }
  for (auto [x, y] : {std::pair{&from.acc, &to.acc}, {&from.merged_acc, &to.merged_acc}}) {
    std::copy_n(x->begin() + t0 * heads * hd, n * heads * hd, y->begin() + to_t0 * heads * hd);
  }
  std::copy_n(from.attended.begin() + t0, n, to.attended.begin() + to_t0);
}

}  // namespace

int32_t KvCache::Impl::QueryRunEnd(int64_t layer, int64_t first_query_position, int32_t t0,
                                   int32_t n_tokens, LayerView* view) const {
  const LayerView now = CurrentView(layer);
  // What the query at p reads: the layer as it was when p was appended, while the f32 copies of
  // the rows encoded since are held; else (a query before the last Append's rows, or after an
  // Append of 0 rows) the layer as it is now.
  const auto reads = [&](int64_t p) {
    const LayerView at_p = ViewAt(layer, std::min(p + 1, now.positions));
    return Holds(layer, at_p) ? at_p : now;
  };
  // The run [t0, t1) grows while each token that reads f32 rows reads the same ones as the rest;
  // its view is what its last token reads.
  std::array<int64_t, 2> pinned{-1, -1};  // per tensor: the encoded rows a token of the run needs
  int32_t t1 = t0;
  for (; t1 < n_tokens; ++t1) {
    const int64_t p = first_query_position + t1;
    const LayerView need = reads(p);
    bool fits = true;
    std::array<int64_t, 2> next = pinned;
    for (int which = 0; which < 2 && fits; ++which) {
      if (pinned[which] >= 0 && need.encoded[which] != pinned[which]) fits = false;
      // A token that reads only sinks, or only rows in blocks, reads them the same through any
      // view with at least as many rows in blocks; one that reads f32 rows pins the view's.
      const bool fixed_rows = need.encoded[which] >= p + 1 || p < Transforms(layer, which).sinks;
      if (!fixed_rows) next[which] = need.encoded[which];
    }
    if (!fits) break;
    pinned = next;
  }
  *view = reads(first_query_position + t1 - 1);
  return t1;
}

int64_t KvCache::Impl::PagesOf(const LayerView& view) const {
  return (view.positions + config.page_positions - 1) / config.page_positions;
}

int64_t KvCache::Impl::PagesReadAlike(int64_t layer, std::span<const QueryRun> runs) const {
  int64_t alike = PagesOf(runs[0].view);
  for (const QueryRun& run : runs) alike = std::min(alike, PagesOf(run.view));
  for (int64_t p = 0; p < alike; ++p) {
    for (const QueryRun& run : runs.subspan(1)) {
      for (int which = 0; which < 2; ++which) {
        if (RowsOfPage(layer, which, p, run.view) != RowsOfPage(layer, which, p, runs[0].view)) return p;
      }
    }
  }
  return alike;
}

Status KvCache::Impl::AttendView(int64_t layer, const LayerView& view, int64_t first_page,
                                 int64_t end_page, const AttentionOptions& options, const float* q,
                                 int64_t first_query_position, AttentionState& state) {
  const int64_t n_pages = end_page - first_page;
  if (n_pages <= 0) return Status::Ok();
  Pages pages(*this, layer, view, first_page, n_pages);
  if (!streamer) return AttendWindows(options, q, first_query_position, pages, state);
  auto fill = [this, layer, view, first_page](int64_t i, uint8_t* dst) {
    return FillSlot(layer, first_page + i, view, dst);
  };
  streamer->Begin(fill, n_pages);
  struct EndGuard {  // the stream ends on every path out, so the next Begin finds it idle
    PageStreamer& streamer;
    ~EndGuard() { streamer.End(); }
  } end_guard{*streamer};
  return AttendWindows(options, q, first_query_position, pages, state);
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
  const int32_t n_tokens = state.n_tokens();
  const int64_t q_row = int64_t{st.n_heads} * st.head_dim;  // floats per query token
  if (m.formats[layer].key_transforms.rotate) {  // scores against rotated keys: rotate q alike
    m.rotated_q.assign(q, q + n_tokens * q_row);
    RotateHeads(m.rotation_signs.data(), st.head_dim, int64_t{n_tokens} * st.n_heads, m.rotated_q.data());
    q = m.rotated_q.data();
  }
  std::vector<Impl::QueryRun>& runs = m.query_runs;
  runs.clear();
  for (int32_t t0 = 0; t0 < n_tokens;) {
    Impl::QueryRun& run = runs.emplace_back();
    run.t0 = t0;
    run.t1 = t0 = m.QueryRunEnd(layer, first_query_position, t0, n_tokens, &run.view);
  }
  if (runs.size() == 1) {
    return m.AttendView(layer, runs[0].view, 0, m.PagesOf(runs[0].view), options, q, first_query_position,
                        state);
  }
  // Every token through the pages all runs read alike (any run's view reads them so), then each
  // run through the rest of its own view.
  const int64_t alike = m.PagesReadAlike(layer, runs);
  if (Status s = m.AttendView(layer, runs[0].view, 0, alike, options, q, first_query_position, state);
      !s.ok()) {
    return s;
  }
  for (const Impl::QueryRun& r : runs) {
    const int32_t n = r.t1 - r.t0;
    AttentionState* run = nullptr;
    for (const auto& s : m.run_states) {
      if (s->n_tokens() == n && s->shape().n_heads == st.n_heads) run = s.get();
    }
    if (run == nullptr) run = m.run_states.emplace_back(std::make_unique<AttentionState>(st, n)).get();
    CopyStateRows(state, r.t0, *run, 0, n);
    const Status s = m.AttendView(layer, r.view, alike, m.PagesOf(r.view), options, q + r.t0 * q_row,
                                  first_query_position + r.t0, *run);
    CopyStateRows(*run, 0, state, r.t0, n);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

void KvCache::FinishAttention(int64_t layer, const AttentionState& state, float* out) const {
  kvq::FinishAttention(state, out);
  if (impl_->formats[layer].value_transforms.rotate) {
    const AttentionShape s = state.shape();
    UnrotateHeads(impl_->rotation_signs.data(), s.head_dim, int64_t{state.n_tokens()} * s.n_heads, out);
  }
}

}  // namespace kvq
