// Position chunks (AttentionOptions::position_chunk, kvq/attention.h): threads share one query's
// positions, chunk by chunk, and the chunk states are merged in chunk order, so the bits depend on
// the context and the chunk size only — the same for 1, 2, 3 and 8 threads, one window or many,
// one dispatch or a window per call, every format in the registry, 1 and 2 KV heads, decode and a
// prefill block, contexts that are not a multiple of the chunk. A context within one chunk gives
// the bits of the unsplit recurrence; past it, the merged result stays within a bound derived
// below of attention computed in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "attention_fixture.h"

namespace kvq::testing_attention {
namespace {

constexpr int64_t kNoChunks = int64_t{1} << 40;  // a chunk longer than any context here

AttentionOptions WithChunk(AttentionOptions o, int64_t chunk, int32_t threads) {
  o.position_chunk = chunk;
  o.threads = threads;
  return o;
}

// Decode (1 token) and a prefill block (5 tokens, the query-blocked path on the SIMD kernel), on
// 1 and 2 KV heads of 4 query heads each; contexts that are not a multiple of the chunk, windows
// that straddle chunk boundaries, 1, 2, 3 and 8 threads, against one thread over one window.
TEST(PositionChunks, EveryThreadCountAndWindowingGivesTheSameBits) {
  struct Case {
    int64_t chunk, n;
  };
  // Chunks of 64 over 1,000 positions (16 chunks, the last of 40) and the default over 4,500.
  const Case cases[] = {{64, 1000}, {kDefaultPositionChunk, 4500}};
  for (const FormatDesc* f : Formats()) {
    for (int32_t kv_heads : {1, 2}) {
      const AttentionShape shape{.n_heads = 4 * kv_heads, .n_kv_heads = kv_heads, .head_dim = 16};
      for (const Case& c : cases) {
        ASSERT_NE(c.n % c.chunk, 0);
        for (int32_t tokens : {1, 5}) {
          const Cache cache(*f, shape, c.n, tokens, static_cast<uint32_t>(7 + kv_heads + tokens));
          for (AttentionKernel kernel : {AttentionKernel::kScalar, AttentionKernel::kSimd}) {
            const AttentionOptions o = Options(shape, kernel);
            const Result want = cache.Run(WithChunk(o, c.chunk, 1), {{0, c.n}});
            // The chunks were merged (else this test would prove nothing about merging).
            ASSERT_NE(want.merged_m[0], -INFINITY);
            for (int32_t threads : {1, 2, 3, 8}) {
              for (int64_t window : {c.n, int64_t{100}, int64_t{777}}) {
                ASSERT_TRUE(BitIdentical(cache.Run(WithChunk(o, c.chunk, threads), Even(c.n, window)), want))
                    << f->name << " kv heads " << kv_heads << " chunk " << c.chunk << " n " << c.n
                    << " tokens " << tokens << (kernel == AttentionKernel::kSimd ? " simd" : " scalar")
                    << " threads " << threads << " windows of " << window;
              }
            }
          }
        }
      }
    }
  }
}

// Up to one chunk of positions, nothing is merged: the bits of one recurrence over all of them
// (those of kvq before position chunks existed), at the chunk's edge too.
TEST(PositionChunks, ContextsWithinOneChunkKeepTheUnsplitBits) {
  const AttentionShape shape{.n_heads = 8, .n_kv_heads = 2, .head_dim = 16};
  for (const FormatDesc* f : Formats()) {
    for (int64_t n : {int64_t{1}, int64_t{300}, kDefaultPositionChunk}) {
      for (int32_t tokens : {1, 5}) {
        if (tokens > n) continue;
        const Cache cache(*f, shape, n, tokens, 21);
        for (AttentionKernel kernel : {AttentionKernel::kScalar, AttentionKernel::kSimd}) {
          const AttentionOptions o = Options(shape, kernel);
          const Result unsplit = cache.Run(WithChunk(o, kNoChunks, 1), {{0, n}});
          for (int32_t threads : {1, 8}) {
            const Result chunked = cache.Run(WithChunk(o, 0, threads), Even(n, 256));
            ASSERT_TRUE(SameBytes(chunked, unsplit)) << f->name << " n " << n << " tokens " << tokens;
            for (float m : chunked.merged_m) ASSERT_EQ(m, -INFINITY);
          }
        }
      }
    }
  }
}

// |out − reference| for f32 K and V (stored exactly), reference in double. First order in
// u = 2⁻²⁴, per output element e of query head h, with w_p the exact weights, o the exact output:
//  - a position's computed weight (e_p times the rescales applied after it) is off by a relative
//    ρ ≤ σ + 4u·S + (1 + K + J)·η, where σ bounds a score's error (the f32 dot and the scaling:
//    scale·γ_d·Σ|q_i k_i| + u|s|), S = max s − min s bounds each of the at most four
//    exp-argument subtractions on its path (its own s − m, its chunk's later max increments, its
//    chunk's merge, the merged state's later increments, each summing to ≤ S), η = 4u for each
//    exp (std::exp and Highway's Exp, ≤ 1 ULP each, taken 4 times over) — its own, at most K
//    later max changes in its chunk and one per merge (J chunks). K counts positions whose score
//    comes within 2σ of the running max before it (a superset of the changes), the largest over
//    chunks. Weights off by ρ_p move o_e by ≤ Σ w_p ρ_p |v_pe − o_e|;
//  - sums: acc = acc·c + e·v takes 3 roundings per position, l = l·c + e 2, a merge 3 each, the
//    division 1: ≤ (3C + 3J + 2)u Σ w_p|v_pe| + (2C + 3J + 2)u |o_e| with C positions per chunk.
// Doubled for second-order terms (as tests/attention/attention_simd_test.cc's bound).
double ReferenceBound(const Cache& cache, const AttentionOptions& o, int64_t chunk, std::vector<double>* ref) {
  const double u = std::ldexp(1.0, -24), eta = 4 * u;
  const AttentionShape s = cache.shape();
  const int32_t d = s.head_dim, group = s.n_heads / s.n_kv_heads;
  const int64_t n = cache.n_positions();
  const int64_t c = std::min(chunk, n), j_chunks = (n + chunk - 1) / chunk;
  std::vector<float> k(n * s.n_kv_heads * d), v(k.size());  // [n][n_kv_heads][head_dim]
  for (int64_t p = 0; p < n; ++p) {
    cache.k().DecodeRow(p, k.data() + p * s.n_kv_heads * d);
    cache.v().DecodeRow(p, v.data() + p * s.n_kv_heads * d);
  }
  ref->assign(cache.q().size(), 0.0);
  double bound = 0;
  std::vector<double> sc(n), sigma(n), w(n);  // [position]
  for (int32_t h = 0; h < s.n_heads; ++h) {  // one query token, at the last position
    const float* q = cache.q().data() + int64_t{h} * d;
    const int64_t kv = int64_t{h / group} * d;
    double smax = -INFINITY, smin = INFINITY, sig = 0;
    for (int64_t p = 0; p < n; ++p) {
      double dot = 0, mag = 0;
      for (int32_t i = 0; i < d; ++i) {
        dot += double{q[i]} * k[p * s.n_kv_heads * d + kv + i];
        mag += std::fabs(double{q[i]} * k[p * s.n_kv_heads * d + kv + i]);
      }
      sc[p] = o.scale * dot;
      sigma[p] = o.scale * d * u / (1 - d * u) * mag + u * std::fabs(sc[p]);
      smax = std::max(smax, sc[p]);
      smin = std::min(smin, sc[p]);
      sig = std::max(sig, sigma[p]);
    }
    int64_t changes = 0;
    for (int64_t b = 0; b < n; b += chunk) {
      double run = -INFINITY;
      int64_t here = 0;
      for (int64_t p = b; p < std::min(n, b + chunk); ++p) {
        if (sc[p] >= run - 2 * sig) ++here;
        run = std::max(run, sc[p]);
      }
      changes = std::max(changes, here);
    }
    const double rho = sig + 4 * u * (smax - smin) + static_cast<double>(1 + changes + j_chunks) * eta;
    double total = 0;
    for (int64_t p = 0; p < n; ++p) total += (w[p] = std::exp(sc[p] - smax));
    double* out = ref->data() + int64_t{h} * d;
    for (int64_t p = 0; p < n; ++p) {
      w[p] /= total;
      for (int32_t e = 0; e < d; ++e) out[e] += w[p] * v[p * s.n_kv_heads * d + kv + e];
    }
    for (int32_t e = 0; e < d; ++e) {
      double spread = 0, mag = 0;
      for (int64_t p = 0; p < n; ++p) {
        const double ve = v[p * s.n_kv_heads * d + kv + e];
        spread += w[p] * std::fabs(ve - out[e]);
        mag += w[p] * std::fabs(ve);
      }
      const double b = rho * spread + (3.0 * c + 3.0 * j_chunks + 2) * u * mag +
                       (2.0 * c + 3.0 * j_chunks + 2) * u * std::fabs(out[e]);
      bound = std::max(bound, 2 * b);
    }
  }
  return bound;
}

double MaxDiff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST(PositionChunks, MergedAttentionIsWithinItsBoundOfADoubleReference) {
  const FormatDesc* f32 = *FindFormat("f32");
  const int64_t n = 1000;
  for (int32_t kv_heads : {1, 2}) {
    const AttentionShape shape{.n_heads = 4 * kv_heads, .n_kv_heads = kv_heads, .head_dim = 16};
    const Cache cache(*f32, shape, n, 1, 31);
    for (AttentionKernel kernel : {AttentionKernel::kScalar, AttentionKernel::kSimd}) {
      for (int64_t chunk : {int64_t{64}, int64_t{333}, kNoChunks}) {
        const AttentionOptions o = WithChunk(Options(shape, kernel), chunk, 3);
        std::vector<double> ref;
        const double bound = ReferenceBound(cache, o, chunk, &ref);
        const Result got = cache.Run(o, Even(n, 128));
        SCOPED_TRACE(::testing::Message() << "kv heads " << kv_heads << " chunk " << chunk
                                          << (kernel == AttentionKernel::kSimd ? " simd" : " scalar"));
        EXPECT_LE(MaxDiff(got.out, ref), bound);
        // The bound cannot hide a position dropped at a chunk boundary.
        const Result dropped = cache.Run(o, {{0, 320}, {321, n}});
        EXPECT_GT(MaxDiff(dropped.out, ref), bound);
      }
    }
  }
}

}  // namespace
}  // namespace kvq::testing_attention
