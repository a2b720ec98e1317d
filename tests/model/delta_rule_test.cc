// The gated delta rule (model/delta_rule.h): the Highway kernel against the scalar f32 reference,
// bit for bit, on every SIMD target compiled in and for widths that are and are not whole vectors;
// the reference against the recurrence in double within a bound derived below; and the layer
// (DeltaNetBlock) giving the same bits for a block as token by token, on 1, 2 and 3 threads.
#include "model/delta_rule.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "base/thread_pool.h"
#include "model/delta_net.h"
#include "test_util/target_scope.h"

namespace kvq {
namespace {

constexpr double kU = 0x1p-24;  // unit roundoff of f32

using test::TargetScope;  // test_util/target_scope.h

std::vector<float> Random(std::mt19937& rng, int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> x(n);
  for (float& v : x) v = u(rng);
  return x;
}

std::vector<float> UnitVector(std::mt19937& rng, int32_t n) {  // as the layer's L2-normed q, k
  std::vector<float> x = Random(rng, n, -1.0f, 1.0f);
  float sum = 0.0f;
  for (float v : x) sum += v * v;
  for (float& v : x) v /= std::sqrt(sum);
  return x;
}

// One token's inputs for a head of dk × dv.
struct StepInputs {
  std::vector<float> q, k, v;
  float beta, gamma;
};

StepInputs RandomStep(std::mt19937& rng, int32_t dk, int32_t dv) {
  return {.q = UnitVector(rng, dk),
          .k = UnitVector(rng, dk),
          .v = Random(rng, dv, -2.0f, 2.0f),
          .beta = Random(rng, 1, 0.05f, 0.95f)[0],
          .gamma = Random(rng, 1, 0.5f, 1.0f)[0]};
}

DeltaRuleHead Head(const StepInputs& in, int32_t dk, int32_t dv, float* S, float* o) {
  return {.dk = dk,
          .dv = dv,
          .q = in.q.data(),
          .k = in.k.data(),
          .v = in.v.data(),
          .beta = in.beta,
          .gamma = in.gamma,
          .scale = 1.0f / std::sqrt(static_cast<float>(dk)),
          .S = S,
          .o = o};
}

// The reference with its sums fused (u = fma(s, k, u), o = fma(s, q, o)): what a kernel using
// MulAdd, or a compiler contracting a·b + c, would compute. The test below must tell it apart.
void StepFused(const DeltaRuleHead& h) {
  for (int32_t j = 0; j < h.dv; ++j) {
    float u = 0.0f;
    for (int32_t i = 0; i < h.dk; ++i) {
      float& s = h.S[int64_t{i} * h.dv + j];
      s = s * h.gamma;
      u = std::fma(s, h.k[i], u);
    }
    const float delta = h.beta * (h.v[j] - u);
    float o = 0.0f;
    for (int32_t i = 0; i < h.dk; ++i) {
      float& s = h.S[int64_t{i} * h.dv + j];
      s = std::fma(h.k[i], delta, s);
      o = std::fma(s, h.q[i], o);
    }
    h.o[j] = o * h.scale;
  }
}

// dv 3, 37 and 67 leave a scalar tail on every vector width; 16 and 128 are whole vectors (128:
// the shipped models' dk = dv); dk 1 and 5 are short scans.
const int32_t kShapes[][2] = {{16, 16}, {128, 128}, {64, 37}, {5, 3}, {1, 67}, {32, 96}};

TEST(DeltaRule, KernelIsBitIdenticalToTheScalarReferenceOnEveryTarget) {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (int64_t target : targets) std::printf("target %s\n", hwy::TargetName(target));
  for (const auto& shape : kShapes) {
    const int32_t dk = shape[0], dv = shape[1];
    for (int64_t target : targets) {
      TargetScope scope(target);
      ASSERT_STREQ(DeltaRuleTargetName(), hwy::TargetName(target));
      std::mt19937 rng(dk * 1000 + dv);
      std::vector<float> S_ref = Random(rng, int64_t{dk} * dv, -1.0f, 1.0f), S_simd = S_ref;
      std::vector<float> o_ref(dv), o_simd(dv);
      for (int step = 0; step < 6; ++step) {  // the state carries each step's rounding on
        const StepInputs in = RandomStep(rng, dk, dv);
        DeltaRuleStepReference(Head(in, dk, dv, S_ref.data(), o_ref.data()));
        DeltaRuleStep(Head(in, dk, dv, S_simd.data(), o_simd.data()));
        for (int32_t j = 0; j < dv; ++j) {
          ASSERT_EQ(std::memcmp(&o_ref[j], &o_simd[j], sizeof(float)), 0)
              << hwy::TargetName(target) << " dk " << dk << " dv " << dv << " step " << step
              << " o[" << j << "]: reference " << o_ref[j] << " kernel " << o_simd[j];
        }
        ASSERT_EQ(std::memcmp(S_ref.data(), S_simd.data(), S_ref.size() * sizeof(float)), 0)
            << hwy::TargetName(target) << " dk " << dk << " dv " << dv << " step " << step
            << ": the states differ";
      }
    }
    // The same steps fused differ from the reference: these inputs would expose a contraction.
    // (Not with dk 1: a unit k is ±1 there, so every product is exact and fusing changes nothing.)
    if (dk == 1) continue;
    std::mt19937 rng(dk * 1000 + dv);
    std::vector<float> S_ref = Random(rng, int64_t{dk} * dv, -1.0f, 1.0f), S_fused = S_ref;
    std::vector<float> o_ref(dv), o_fused(dv);
    for (int step = 0; step < 6; ++step) {
      const StepInputs in = RandomStep(rng, dk, dv);
      DeltaRuleStepReference(Head(in, dk, dv, S_ref.data(), o_ref.data()));
      StepFused(Head(in, dk, dv, S_fused.data(), o_fused.data()));
    }
    EXPECT_NE(std::memcmp(S_ref.data(), S_fused.data(), S_ref.size() * sizeof(float)), 0)
        << "dk " << dk << " dv " << dv << ": a fused kernel would pass unseen";
  }
}

// One step from the same f32 inputs in double, with a per-element bound on the f32 reference's
// error (standard rounding analysis, γ_n = n·u/(1 − n·u), each f32 operation off by ≤ u relative):
//   P = γS (1 rounding);  u_j = Σ_i P_ij k_i in order: |Δu_j| ≤ γ_{dk+1} A_j, A_j = Σ_i |P_ij k_i|
//   δ_j = β(v_j − u_j):  |Δδ_j| ≤ |β|(|Δu_j| + u(|v_j| + A_j)) + u|δ_j|
//   S'_ij = P_ij + k_i δ_j:  |ΔS'_ij| ≤ u|P_ij| + |k_i| (|Δδ_j| + u|δ_j|) + u|S'_ij|
//   o_j = scale · Σ_i S'_ij q_i:  |Δo_j| ≤ scale (Σ_i |q_i| |ΔS'_ij| + γ_dk Σ_i |S'_ij q_i|) +
//   u|o_j|
// (scale = 1/√dk rounded once more: + u|o_j|). Doubled for second-order terms. Reading the decay
// after the update instead (a wrong order) moves o by far more, so the bound can catch it.
TEST(DeltaRule, ReferenceIsWithinItsRoundingBoundOfTheRecurrenceInDouble) {
  auto gamma_n = [](double n) { return n * kU / (1 - n * kU); };
  for (const auto& shape : kShapes) {
    const int32_t dk = shape[0], dv = shape[1];
    std::mt19937 rng(7 + dk * 31 + dv);
    const std::vector<float> S0 = Random(rng, int64_t{dk} * dv, -1.0f, 1.0f);
    const StepInputs in = RandomStep(rng, dk, dv);
    std::vector<float> S = S0, o(dv);
    DeltaRuleStepReference(Head(in, dk, dv, S.data(), o.data()));
    const double scale = 1.0 / std::sqrt(static_cast<double>(dk));
    double worst_ratio = 0, wrong_worst = 0;
    for (int32_t j = 0; j < dv; ++j) {
      double u = 0, A = 0;
      std::vector<double> P(dk), Sn(dk);
      for (int32_t i = 0; i < dk; ++i) {
        P[i] = double{in.gamma} * S0[int64_t{i} * dv + j];
        u += P[i] * in.k[i];
        A += std::fabs(P[i] * in.k[i]);
      }
      const double delta = double{in.beta} * (in.v[j] - u);
      const double d_delta =
          std::fabs(in.beta) * (gamma_n(dk + 1) * A + kU * (std::fabs(in.v[j]) + A)) +
          kU * std::fabs(delta);
      double o_exact = 0, o_wrong = 0, o_bound = 0, mag = 0;
      for (int32_t i = 0; i < dk; ++i) {
        Sn[i] = P[i] + double{in.k[i]} * delta;
        const double dS = kU * std::fabs(P[i]) +
                          std::fabs(in.k[i]) * (d_delta + kU * std::fabs(delta)) +
                          kU * std::fabs(Sn[i]);
        ASSERT_LE(std::fabs(S[int64_t{i} * dv + j] - Sn[i]), 2 * dS)
            << "S[" << i << "][" << j << "]";
        o_exact += Sn[i] * in.q[i];
        o_wrong += (double{S0[int64_t{i} * dv + j]} + in.k[i] * delta) * in.q[i];  // decay skipped
        o_bound += std::fabs(in.q[i]) * dS;
        mag += std::fabs(Sn[i] * in.q[i]);
      }
      o_exact *= scale;
      o_wrong *= scale;
      const double bound =
          2 * (scale * (o_bound + gamma_n(dk) * mag) + 2 * kU * std::fabs(o_exact));
      ASSERT_LE(std::fabs(o[j] - o_exact), bound)
          << "dk " << dk << " dv " << dv << " o[" << j << "]";
      worst_ratio = std::max(worst_ratio, std::fabs(o[j] - o_exact) / bound);
      wrong_worst = std::max(wrong_worst, std::fabs(o_wrong - o_exact) / bound);
    }
    std::printf("dk %d dv %d: worst error %.3g of the bound; skipping the decay: %.3g bounds\n", dk,
                dv, worst_ratio, wrong_worst);
    EXPECT_GT(wrong_worst, 10.0) << "the bound is too loose to see a skipped decay";
  }
}

// A small layer's weights and inputs: dv is not a whole vector, and 100 tokens × 104 channels
// take the conv phase through the pool.
struct TinyLayer {
  DeltaNetConfig c{.conv_kernel = 4,
                   .key_dim = 8,
                   .n_k_heads = 2,
                   .n_v_heads = 6,
                   .value_dim = 12,
                   .v_head_map = VHeadMap::kModulo};
  std::vector<float> conv, dt_bias, a, norm;
  LayerWeights L;
  explicit TinyLayer(std::mt19937& rng)
      : conv(Random(rng, c.conv_channels() * c.conv_kernel, -0.5f, 0.5f)),
        dt_bias(Random(rng, c.n_v_heads, -1.0f, 1.0f)),
        a(Random(rng, c.n_v_heads, -2.0f, -0.1f)),
        norm(Random(rng, c.value_dim, 0.5f, 1.5f)) {
    L.ssm_conv = conv.data();
    L.ssm_dt_bias = dt_bias.data();
    L.ssm_a = a.data();
    L.ssm_norm = norm.data();
  }
};

TEST(DeltaNetBlock, ABlockGivesTheBitsOfItsTokensOneAtATimeOnAnyThreadCount) {
  std::mt19937 rng(42);
  const TinyLayer layer(rng);
  const DeltaNetConfig& c = layer.c;
  const int64_t n = 100, C = c.conv_channels(), Cv = c.v_channels(), Hv = c.n_v_heads;
  const std::vector<float> qkv = Random(rng, n * C, -2.0f, 2.0f),
                           z = Random(rng, n * Cv, -2.0f, 2.0f);
  const std::vector<float> beta = Random(rng, n * Hv, -3.0f, 3.0f),
                           alpha = Random(rng, n * Hv, -3.0f, 3.0f);
  const std::vector<float> state0 = Random(rng, c.state_floats(), -0.5f, 0.5f);
  auto input = [&](int64_t t) {
    return DeltaNetInput{.qkv = qkv.data() + t * C,
                         .z = z.data() + t * Cv,
                         .beta = beta.data() + t * Hv,
                         .alpha = alpha.data() + t * Hv};
  };
  // Token by token on one thread: the baseline.
  std::vector<float> state_one = state0, out_one(n * Cv);
  DeltaNetScratch scratch;
  for (int64_t t = 0; t < n; ++t)
    DeltaNetBlock(c, layer.L, 1e-6f, input(t), 1, state_one.data(), out_one.data() + t * Cv,
                  &scratch, ThreadPool::Shared(1));
  for (int32_t threads : {1, 2, 3}) {
    std::vector<float> state = state0, out(n * Cv);
    DeltaNetBlock(c, layer.L, 1e-6f, input(0), n, state.data(), out.data(), &scratch, ThreadPool::Shared(threads));
    EXPECT_EQ(std::memcmp(out.data(), out_one.data(), out.size() * sizeof(float)), 0)
        << threads << " threads";
    EXPECT_EQ(std::memcmp(state.data(), state_one.data(), state.size() * sizeof(float)), 0)
        << threads << " threads";
  }
  // The comparison can fail: the last token's gate moved gives that token other bits. (A state
  // one ulp off does not show: the decay and the delta rule's pull towards v wash it out.)
  std::vector<float> z2 = z;
  z2[(n - 1) * Cv] += 0.5f;
  std::vector<float> state = state0, out(n * Cv);
  DeltaNetInput moved = input(0);
  moved.z = z2.data();
  DeltaNetBlock(c, layer.L, 1e-6f, moved, n, state.data(), out.data(), &scratch, ThreadPool::Shared(2));
  EXPECT_NE(std::memcmp(out.data(), out_one.data(), out.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace kvq
