// ApplyRope's partial rotation (RopeParams::rotary_dims, Qwen3-Next's 64 of 256): the first
// rotary_dims numbers of each head rotate exactly as a head of that size would, with the
// frequencies spread over rotary_dims, and the rest pass through untouched; 0 means the whole head.
#include "kvq/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace kvq {
namespace {

std::vector<float> Ramp(int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = std::sin(0.37f * i + 0.1f) + 0.01f * i;
  return v;
}

TEST(Rope, PartialRotationIsASmallerHeadPlusPassThrough) {
  constexpr int kHead = 32, kRot = 8, kHeads = 3;
  for (RopePairing pairing : {RopePairing::kHalves, RopePairing::kAdjacent}) {
    const std::vector<float> original = Ramp(kHead * kHeads);
    std::vector<float> partial = original;
    ApplyRope(partial.data(), kHead * kHeads, kHead, 17,
              {.theta = 1e4f, .pairing = pairing, .rotary_dims = kRot});
    for (int h = 0; h < kHeads; ++h) {
      std::vector<float> small(original.begin() + h * kHead, original.begin() + h * kHead + kRot);
      ApplyRope(small.data(), kRot, kRot, 17, {.theta = 1e4f, .pairing = pairing});
      for (int i = 0; i < kRot; ++i) EXPECT_EQ(partial[h * kHead + i], small[i]) << h << " " << i;
      for (int i = kRot; i < kHead; ++i)
        EXPECT_EQ(partial[h * kHead + i], original[h * kHead + i]) << h << " " << i;
    }
    // rotary_dims = head_dim and 0 are the same (whole-head) rotation, bit for bit.
    std::vector<float> whole = original, zero = original;
    ApplyRope(whole.data(), kHead * kHeads, kHead, 17,
              {.theta = 1e4f, .pairing = pairing, .rotary_dims = kHead});
    ApplyRope(zero.data(), kHead * kHeads, kHead, 17, {.theta = 1e4f, .pairing = pairing});
    EXPECT_EQ(whole, zero);
    EXPECT_NE(whole, partial);
  }
}

// RopeCosSin's cos and sin are the correctly rounded ones (cosl/sinl of the float angle, rounded
// once), for every pair of a qwen3 head (θ = 10^6, head_dim 128) at positions 0 .. 4095: values
// that are unique, so every C library and SIMD target gives these bits (the page's musl build and
// native glibc ones; glibc's own cosf/sinf miss the correctly rounded value for about 1% of these
// angles, musl's for others, which moved the browser's greedy ids off native kvq run's).
TEST(Rope, CosSinAreCorrectlyRounded) {
  constexpr int kHead = 128;
  const RopeParams params{.theta = 1e6f, .pairing = RopePairing::kHalves};
  std::vector<float> cos_sin(kHead);
  int wrong = 0;
  for (int64_t pos = 0; pos < 4096; ++pos) {
    RopeCosSin(kHead, pos, params, cos_sin.data());
    for (int i = 0; i < kHead / 2; ++i) {
      // AngleOf's arithmetic (rope.cc), the part both sides share.
      const float freq = 1.0f / std::pow(1e6f, static_cast<float>(2 * i) / static_cast<float>(kHead));
      const long double angle = static_cast<float>(pos) * freq;
      const float want_cos = static_cast<float>(std::cos(angle)), want_sin = static_cast<float>(std::sin(angle));
      if (cos_sin[2 * i] != want_cos || cos_sin[2 * i + 1] != want_sin) {
        if (++wrong <= 5)
          ADD_FAILURE() << "pos " << pos << " pair " << i << ": " << cos_sin[2 * i] << ", " << cos_sin[2 * i + 1]
                        << " vs " << want_cos << ", " << want_sin;
      }
    }
  }
  EXPECT_EQ(wrong, 0);
}

// Angles no model should produce still give defined results (a fuzz finding: a NaN angle, and
// one past 2^63 quarter turns, reached an integer conversion): NaN for ±inf and NaN, and for a
// huge finite angle a unit (cos, sin) pair.
TEST(Rope, CosSinOfNonFiniteAndHugeAnglesAreDefined) {
  for (float theta : {std::numeric_limits<float>::quiet_NaN(), 0.0f}) {  // 1 / pow(0, x) = inf
    const RopeParams params{.theta = theta};
    std::vector<float> cos_sin(8);
    RopeCosSin(8, 3, params, cos_sin.data());
    // Pair 0's frequency is 1 / θ^0 = 1 (pow(x, 0) is 1 even for NaN); the others' are NaN or inf.
    for (int i = 1; i < 4; ++i) {
      EXPECT_TRUE(std::isnan(cos_sin[2 * i]) && std::isnan(cos_sin[2 * i + 1])) << theta << " pair " << i;
    }
  }
  const RopeParams tiny{.theta = 1e-30f};  // frequencies up to 1e30: angles far past 2^63 · π/2
  std::vector<float> cos_sin(8);
  RopeCosSin(8, 1000, tiny, cos_sin.data());
  for (int i = 0; i < 4; ++i) {
    const double c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
    EXPECT_NEAR(c * c + s * s, 1.0, 1e-6) << "pair " << i;
  }
}

}  // namespace
}  // namespace kvq
