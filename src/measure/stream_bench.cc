// Streaming benchmark (see stream_bench.h). Both arms hold the same random rows (decode time does
// not depend on the values); arms alternate per repetition; the copy-only figure copies each page
// into a slot-sized buffer with memcpy, the work the streaming thread does.
#include "measure/stream_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>

#include "kvq/kv_cache.h"
#include "kvq/units.h"

namespace kvq {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

Result<std::vector<StreamBenchRow>> RunStreamBench(
    const StreamBenchConfig& c, const std::function<void(const std::string&)>& progress) {
  const RowShape row{.n_kv_heads = c.shape.n_kv_heads, .head_dim = c.shape.head_dim};
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> q(int64_t{c.shape.n_heads} * c.shape.head_dim);
  for (float& x : q) x = dist(rng);
  const AttentionOptions options{.scale = 1.0f / std::sqrt(static_cast<float>(c.shape.head_dim)),
                                 .kernel = AttentionKernel::kSimd, .threads = c.threads};
  std::vector<StreamBenchRow> rows;
  for (const FormatDesc* f : c.formats) {
    for (int64_t n : c.contexts) {
      KvCacheConfig config{.n_layers = 1, .n_kv_heads = row.n_kv_heads, .head_dim = row.head_dim,
                           .layers = {{f, f}}, .max_positions = n, .page_positions = c.page_positions};
      Result<std::unique_ptr<KvCache>> resident = KvCache::Create(config);
      config.budgets.device_bytes = c.device_bytes;
      Result<std::unique_ptr<KvCache>> streamed = KvCache::Create(config);
      if (!resident.ok()) return resident.status();
      if (!streamed.ok()) return streamed.status();
      if ((*streamed)->plan().device_slots == 0) {
        return Status::Error(fmt::format("--kv-device-budget {} holds the whole {} cache at {} positions: "
                                         "nothing would stream; give a smaller budget", FormatBytesIec(c.device_bytes),
                                         f->name, n));
      }
      constexpr int64_t kChunk = 1024;
      std::vector<float> k(kChunk * row.elems()), v(k.size());
      for (int64_t done = 0; done < n; done += kChunk) {
        const int64_t m = std::min(kChunk, n - done);
        for (int64_t i = 0; i < m * row.elems(); ++i) k[i] = dist(rng), v[i] = dist(rng);
        for (auto* cache : {resident->get(), streamed->get()}) {
          if (Status s = cache->Append(0, k.data(), v.data(), m); !s.ok()) return s;
        }
      }
      // Copy-only: the same pages, memcpy'd into one slot-sized buffer each.
      const int64_t page_bytes = (*streamed)->plan().largest_page_bytes;
      const int64_t n_pages = (n + c.page_positions - 1) / c.page_positions;
      std::vector<uint8_t> src(n_pages * page_bytes, 1), slot(page_bytes);
      std::vector<double> t_res, t_str, t_copy;
      std::vector<float> out(q.size());
      for (int32_t rep = 0; rep <= c.reps; ++rep) {
        for (int arm = 0; arm < 3; ++arm) {
          const auto t0 = std::chrono::steady_clock::now();
          if (arm < 2) {
            AttentionState state(c.shape, 1);
            KvCache& cache = arm == 0 ? **resident : **streamed;
            if (Status s = cache.Attend(0, options, q.data(), n - 1, state); !s.ok()) return s;
            cache.FinishAttention(0, state, out.data());
          } else {
            for (int64_t p = 0; p < n_pages; ++p) std::memcpy(slot.data(), src.data() + p * page_bytes, page_bytes);
          }
          const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
          if (rep > 0) (arm == 0 ? t_res : arm == 1 ? t_str : t_copy).push_back(ns);
        }
      }
      StreamBenchRow r;
      r.format = f->name;
      r.context = n;
      r.kv_bytes = (*streamed)->plan().total_bytes;
      r.device_slots = (*streamed)->plan().device_slots;
      r.device_peak_bytes = (*streamed)->device_peak_bytes();
      r.resident_ns = Median(t_res);
      r.streamed_ns = Median(t_str);
      r.copy_ns = Median(t_copy);
      rows.push_back(r);
      if (progress) progress(fmt::format("{} at {} positions done", f->name, n));
    }
  }
  return rows;
}

}  // namespace kvq
