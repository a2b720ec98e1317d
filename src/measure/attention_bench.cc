// Attention benchmark (see attention_bench.h). The cache is filled directly with random rows
// encoded in each format (attention time does not depend on the values; DESIGN.md §5), the query
// tokens sit at the last positions so the newest attends to every row, and arms (format × query
// block) are interleaved per repetition so drift on a shared machine hits every arm alike.
#include "measure/attention_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>

#include "formats/row_sequence.h"

namespace kvq {
namespace {

struct Arm {
  const FormatDesc* format;
  int32_t query_block;
  const RowSequence* k;  // owned by the format's Store
  const RowSequence* v;
  std::vector<double> ns;
};

struct Store {
  std::unique_ptr<RowSequence> k, v;
};

void Fill(RowSequence& seq, int64_t n, RowShape shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  constexpr int64_t kChunk = 1024;
  std::vector<float> rows(kChunk * shape.elems());
  for (int64_t done = 0; done < n; done += kChunk) {
    const int64_t m = std::min(kChunk, n - done);
    for (int64_t i = 0; i < m * shape.elems(); ++i) rows[i] = dist(rng);
    seq.Append(rows.data(), m);
  }
}

}  // namespace

std::vector<AttentionBenchRow> RunAttentionBench(
    const AttentionBenchConfig& c, const std::function<void(const std::string&)>& progress) {
  const RowShape row{.n_kv_heads = c.shape.n_kv_heads, .head_dim = c.shape.head_dim};
  const int32_t queries = std::max(1, c.queries);
  std::vector<float> q(int64_t{queries} * c.shape.n_heads * c.shape.head_dim);  // [queries][n_heads][head_dim]
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& x : q) x = dist(rng);
  AttentionOptions options{.scale = 1.0f / std::sqrt(static_cast<float>(c.shape.head_dim)),
                           .kernel = AttentionKernel::kSimd, .threads = c.threads};
  std::vector<AttentionBenchRow> rows;
  for (int64_t n : c.contexts) {
    std::vector<Store> stores;
    std::vector<Arm> arms;
    for (const FormatDesc* f : c.formats) {
      Store st{std::make_unique<RowSequence>(f->key, row), std::make_unique<RowSequence>(f->value, row)};
      Fill(*st.k, n, row, 2);
      Fill(*st.v, n, row, 3);
      for (int32_t b : c.query_blocks) arms.push_back({f, b, st.k.get(), st.v.get(), {}});
      stores.push_back(std::move(st));
    }
    // Query t at position n − queries + t sees n − queries + t + 1 positions.
    const int64_t q_tokens = std::min<int64_t>(queries, n);
    const int64_t seen = q_tokens * (n - q_tokens) + q_tokens * (q_tokens + 1) / 2;
    std::vector<float> out(q.size());
    for (int32_t rep = 0; rep <= c.reps; ++rep) {
      for (Arm& a : arms) {
        AttentionState state(c.shape, static_cast<int32_t>(q_tokens));
        const KvWindow w{.first_position = 0, .k = a.k->View(0, n), .v = a.v->View(0, n)};
        options.query_block = a.query_block;
        const auto t0 = std::chrono::steady_clock::now();
        AttendWindow(options, q.data(), n - q_tokens, w, state);
        FinishAttention(state, out.data());
        const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
        if (rep > 0) a.ns.push_back(ns);  // rep 0 warms caches and page tables
      }
    }
    for (Arm& a : arms) {
      std::sort(a.ns.begin(), a.ns.end());
      AttentionBenchRow r;
      r.format = a.format->name;
      r.context = n;
      r.queries = static_cast<int32_t>(q_tokens);
      r.query_block = a.query_block;
      r.score_macs = seen * c.shape.n_heads * c.shape.head_dim;
      r.value_macs = r.score_macs;
      r.int8_scores = a.format->key.kernels().int8_scores;
      r.ns_per_step = a.ns[a.ns.size() / 2];
      r.ns_min = a.ns.front();
      r.ns_max = a.ns.back();
      r.kv_bytes = a.k->bytes() + a.v->bytes();
      r.gbps = static_cast<double>(r.kv_bytes) / r.ns_per_step;
      rows.push_back(r);
    }
    if (progress) progress(fmt::format("context {} done ({} arms)", n, arms.size()));
  }
  return rows;
}

}  // namespace kvq
