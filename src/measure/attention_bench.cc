// Attention benchmark (see attention_bench.h). Each arm is a one-layer KvCache of its spec,
// filled with random rows (attention time does not depend on the values; docs/design.md §5) through
// KvCache::Append, so rows are rotated, kept as sinks or residual and encoded exactly as kvq
// stores them when it decodes. A step is what a decode step does per layer: KvCache::Attend
// (which rotates q for a rotated key spec) and KvCache::FinishAttention (which undoes a rotated
// value spec's rotation), both timed. The query tokens sit at the last positions so the newest
// attends to every row, and arms (spec × query block) are interleaved per repetition so drift on a
// shared machine hits every arm alike.
#include "measure/attention_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>

#include "kvq/kv_cache.h"

namespace kvq {
namespace {

struct Arm {
  size_t spec;  // index into config.specs
  int32_t query_block;
  KvCache* cache;  // owned by `caches` of the context
  std::vector<double> ns;
};

// Appends n positions of N(0, 1) rows in chunks (the seeds are per tensor, so every arm holds the
// same numbers before its transforms and format).
Status Fill(KvCache& cache, int64_t n, RowShape shape) {
  std::mt19937 rng_k(2), rng_v(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  constexpr int64_t kChunk = 1024;
  std::vector<float> k(kChunk * shape.elems()), v(kChunk * shape.elems());  // [kChunk][n_kv_heads][head_dim]
  for (int64_t done = 0; done < n; done += kChunk) {
    const int64_t m = std::min(kChunk, n - done);
    for (int64_t i = 0; i < m * shape.elems(); ++i) k[i] = dist(rng_k);
    for (int64_t i = 0; i < m * shape.elems(); ++i) v[i] = dist(rng_v);
    if (Status s = cache.Append(0, k.data(), v.data(), m); !s.ok()) return s;
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<AttentionBenchRow>> RunAttentionBench(
    const AttentionBenchConfig& c, const std::function<void(const std::string&)>& progress) {
  const RowShape row{.n_kv_heads = c.shape.n_kv_heads, .head_dim = c.shape.head_dim};
  for (const KvSpec& s : c.specs) {
    if (Status st = CheckKvSpec(s, row); !st.ok()) return st;
  }
  const int32_t queries = std::max(1, c.queries);
  std::vector<float> q(int64_t{queries} * c.shape.n_heads * c.shape.head_dim);  // [queries][n_heads][head_dim]
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& x : q) x = dist(rng);
  AttentionOptions options{.scale = 1.0f / std::sqrt(static_cast<float>(c.shape.head_dim)),
                           .kernel = AttentionKernel::kSimd, .threads = c.threads};
  std::vector<AttentionBenchRow> rows;
  for (int64_t n : c.contexts) {
    std::vector<std::unique_ptr<KvCache>> caches;
    std::vector<Arm> arms;
    for (size_t i = 0; i < c.specs.size(); ++i) {
      Result<std::unique_ptr<KvCache>> cache =
          KvCache::Create({.n_layers = 1, .n_kv_heads = c.shape.n_kv_heads, .head_dim = c.shape.head_dim,
                           .layers = {LayerFormats::Both(c.specs[i])}, .max_positions = n,
                           .page_positions = DefaultPagePositions(n)});
      if (!cache.ok()) return cache.status();
      if (Status s = Fill(**cache, n, row); !s.ok()) return s;
      for (int32_t b : c.query_blocks) arms.push_back({i, b, cache->get(), {}});
      caches.push_back(std::move(cache.value()));
    }
    // Query t at position n − queries + t sees n − queries + t + 1 positions.
    const int64_t q_tokens = std::min<int64_t>(queries, n);
    const int64_t seen = q_tokens * (n - q_tokens) + q_tokens * (q_tokens + 1) / 2;
    std::vector<float> out(q.size());  // [queries][n_heads][head_dim]
    for (int32_t rep = 0; rep <= c.reps; ++rep) {
      for (size_t i = 0; i < arms.size(); ++i) {
        // The order rotates each repetition, as bench decode's steps do: no arm always runs right
        // after the same neighbour (whose rows it would find in, or evicted from, the caches).
        Arm& a = arms[(i + static_cast<size_t>(rep)) % arms.size()];
        AttentionState state(c.shape, static_cast<int32_t>(q_tokens));
        options.query_block = a.query_block;
        const auto t0 = std::chrono::steady_clock::now();
        if (Status s = a.cache->Attend(0, options, q.data(), n - q_tokens, state); !s.ok()) return s;
        a.cache->FinishAttention(0, state, out.data());
        const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
        if (rep > 0) a.ns.push_back(ns);  // rep 0 warms caches and page tables
      }
    }
    for (Arm& a : arms) {
      const KvSpec& spec = c.specs[a.spec];
      std::sort(a.ns.begin(), a.ns.end());
      AttentionBenchRow r;
      r.format = KvSpecName(spec);
      r.spec = spec;
      r.context = n;
      r.queries = static_cast<int32_t>(q_tokens);
      r.query_block = a.query_block;
      r.score_macs = seen * c.shape.n_heads * c.shape.head_dim;
      r.value_macs = r.score_macs;
      r.int8_scores = spec.format->key.kernels().int8_scores;
      r.ns_per_step = a.ns[a.ns.size() / 2];
      r.ns_min = a.ns.front();
      r.ns_max = a.ns.back();
      r.kv_bytes = SpecBytesForRows(spec.format->key, spec.transforms, row, n) +
                   SpecBytesForRows(spec.format->value, spec.transforms, row, n);
      r.gbps = static_cast<double>(r.kv_bytes) / r.ns_per_step;
      rows.push_back(r);
    }
    if (progress) progress(fmt::format("context {} done ({} arms)", n, arms.size()));
  }
  return rows;
}

}  // namespace kvq
