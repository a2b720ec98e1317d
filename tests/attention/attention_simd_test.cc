// The SIMD attention kernel against the scalar reference, on every SIMD target compiled in, for
// every format, four GQA shapes, decode and prefill, with and without a soft-cap. The tolerance is
// derived below from the sources of difference; a companion check shows it is tighter than the
// effect of dropping one position, so it cannot hide that bug.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>

#include "attention_fixture.h"
#include "test_util/target_scope.h"

namespace kvq::testing_attention {
namespace {

constexpr double kU = 0x1p-24;

using test::TargetScope;  // test_util/target_scope.h

// Tolerance on |out_simd − out_scalar| for one cache, derived from what differs between them:
//  1. Scores. Both kernels decode K identically (tests/format/kernels_test.cc); only the order of
//     the head_dim-term sum differs, so |Δs_p| ≤ scale · 2γ_d · Σ_d |q_d k_pd| (γ_d = d·u/(1−d·u)),
//     plus, with a soft-cap, a few ulps of tanh: 8u · cap. Softmax output moves by at most
//     2 · max|v| · max_p |Δs_p| to first order (∂o/∂s_p = w_p (v_p − o)).
//  2. Exponentials (std::exp vs Highway's, ≤ 1 ulp each) and the l / acc recurrences (≤ 3
//     roundings per position): relative error ≤ (8n + 16) · u of max|v| over n positions.
// The sum is doubled to cover second-order terms.
double Tolerance(const Cache& cache, const AttentionOptions& o, int32_t n_tokens) {
  const AttentionShape s = cache.shape();
  const int32_t d = s.head_dim, group = s.n_heads / s.n_kv_heads;
  const int64_t n = cache.n_positions();
  std::vector<float> k(s.n_kv_heads * d), v(k.size());
  double vmax = 0, ds = 0;
  for (int64_t p = 0; p < n; ++p) {
    cache.k().DecodeRow(p, k.data());
    cache.v().DecodeRow(p, v.data());
    for (float x : v) vmax = std::max<double>(vmax, std::fabs(x));
    for (int32_t t = 0; t < n_tokens; ++t) {
      for (int32_t h = 0; h < s.n_heads; ++h) {
        const float* q = cache.q().data() + (int64_t{t} * s.n_heads + h) * d;
        double mag = 0;
        for (int32_t i = 0; i < d; ++i) mag += std::fabs(double{q[i]} * k[(h / group) * d + i]);
        ds = std::max(ds, o.scale * 2.0 * d * kU / (1.0 - d * kU) * mag);
      }
    }
  }
  if (o.softcap > 0) ds += 8 * kU * o.softcap;
  return 2.0 * (2.0 * vmax * ds + (8.0 * n + 16.0) * kU * vmax);
}

double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max<double>(m, std::fabs(double{a[i]} - b[i]));
  return m;
}

// With the f32-arithmetic scores: the tolerance below is the summation-order one. Integer scores
// (the default for int8 / int4 keys) are checked bit for bit against their oracle and within
// their derived bound in tests/formats/int_score_test.cc; their first-order worst case over a
// whole attention call would be too wide here to see a dropped position.
struct F32ScoresScope {
  F32ScoresScope() { SetScoreArithmetic(ScoreArithmetic::kF32); }
  ~F32ScoresScope() { SetScoreArithmetic(ScoreArithmetic::kInteger); }
};

TEST(AttentionSimd, AgreesWithScalarReferenceOnEveryTarget) {
  const F32ScoresScope f32_scores;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    TargetScope scope(target);
    for (const FormatDesc* f : Formats()) {
      for (int32_t group : {1, 2, 4, 8}) {
        for (int32_t tokens : {1, 3}) {
          for (float softcap : {0.0f, 2.0f}) {
            for (int64_t n : {int64_t{3}, int64_t{40}, int64_t{256}}) {
              const AttentionShape shape{.n_heads = 2 * group, .n_kv_heads = 2, .head_dim = 16};
              const Cache cache(*f, shape, n, tokens, static_cast<uint32_t>(n + group));
              const Result scalar = cache.Run(Options(shape, AttentionKernel::kScalar, softcap), Even(n, 64));
              const Result simd = cache.Run(Options(shape, AttentionKernel::kSimd, softcap), Even(n, 64));
              const double tol = Tolerance(cache, Options(shape, AttentionKernel::kSimd, softcap), tokens);
              ASSERT_LE(MaxDiff(simd.out, scalar.out), tol)
                  << hwy::TargetName(target) << " " << f->name << " group " << group << " tokens "
                  << tokens << " softcap " << softcap << " n " << n;
              ASSERT_EQ(simd.attended, scalar.attended);
              // The tolerance is not wide enough to hide a dropped position.
              if (n > 3) {
                const Result dropped =
                    cache.Run(Options(shape, AttentionKernel::kScalar, softcap), {{0, n / 2}, {n / 2 + 1, n}});
                EXPECT_GT(MaxDiff(dropped.out, scalar.out), tol) << f->name << " n " << n;
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvq::testing_attention
