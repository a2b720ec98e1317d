// ApplyRope's partial rotation (RopeParams::rotary_dims, Qwen3-Next's 64 of 256): the first
// rotary_dims numbers of each head rotate exactly as a head of that size would, with the
// frequencies spread over rotary_dims, and the rest pass through untouched; 0 means the whole head.
#include "kvq/rope.h"

#include <gtest/gtest.h>

#include <cmath>
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

}  // namespace
}  // namespace kvq
