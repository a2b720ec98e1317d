// Known-answer tests for the fp4-e2m1 codec (src/format/fp4_e2m1).
//
// The format (seed 004's rounding, DeepSeek's layout): per group of 16 consecutive numbers of
// a row,
//   s  = roundE4M3(amax / 6)    OCP E4M3 ("e4m3fn", bias 7, max 448), RNE; s = 0 -> 2^-9
//   e  = roundE2M1(x / s)       OCP E2M1, RNE, saturating at ±6
//   x' = E2M1(e) · s
// stored as [E4M3 scale byte][8 bytes: element 2j in the LOW nibble of byte j]. A group may span
// heads when head_dim < 16.
//
// E2M1 nibbles are S.EE.M (bias 1):
//   0000 0   0001 0.5   0010 1   0011 1.5   0100 2   0101 3   0110 4   0111 6   (1xxx: negative)
// In E2M1 and E4M3 the code's lowest bit is the mantissa's lowest bit, so "ties to even" means
// ties go to the even code. All expected bytes and values below were worked out by hand (the
// working is in the comments) and are written out literally; nothing expected comes from the
// code under test.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "base/float_codes.h"
#include "formats/fp4_e2m1/fp4_e2m1.h"
#include "kvq/format.h"

namespace kvq {
namespace {

const Codec& Fp4() { return Fp4E2m1Format().value; }

std::vector<uint8_t> EncodeRow(RowShape shape, const std::vector<float>& row) {
  const CodecArgs args{.shape = shape};
  // Poison the block so a byte the encoder forgets to write shows up as a mismatch.
  std::vector<uint8_t> block(static_cast<size_t>(Fp4().block_bytes(shape)), 0xCD);
  Fp4().encode_block(row.data(), block.data(), args);
  return block;
}

std::vector<float> DecodeRow(RowShape shape, const std::vector<uint8_t>& block) {
  const CodecArgs args{.shape = shape};
  std::vector<float> out(static_cast<size_t>(shape.elems()),
                         std::numeric_limits<float>::quiet_NaN());
  Fp4().decode_row(block.data(), 0, out.data(), args);
  return out;
}

// One group of 16 (1 head × head_dim 16): 9 bytes, encode byte for byte, decode exactly.
void ExpectOneGroup(const std::vector<float>& input, const std::vector<uint8_t>& bytes,
                    const std::vector<float>& decoded) {
  const RowShape shape = {1, 16};
  ASSERT_EQ(input.size(), 16u);
  ASSERT_EQ(bytes.size(), 9u);
  ASSERT_EQ(decoded.size(), 16u);
  EXPECT_EQ(Fp4().check_shape(shape), "");
  ASSERT_EQ(Fp4().block_bytes(shape), 9);
  EXPECT_EQ(EncodeRow(shape, input), bytes);
  EXPECT_EQ(DecodeRow(shape, bytes), decoded);
}

// ---- the code tables --------------------------------------------------------------------------

TEST(Fp4E2m1Codes, E2m1NibbleValues) {
  const float kMagnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (uint8_t code = 0; code < 8; ++code) {
    EXPECT_EQ(E2m1ToF32(code), kMagnitudes[code]) << "code " << int{code};
    EXPECT_EQ(E2m1ToF32(static_cast<uint8_t>(code | 0x8)), -kMagnitudes[code])
        << "code " << int{code | 0x8};
  }
}

TEST(Fp4E2m1Codes, E4m3ScaleCodesUsedBelow) {
  EXPECT_EQ(E4m3ToF32(0x38), 1.0f);        // 0 0111 000: 2^(7-7)
  EXPECT_EQ(E4m3ToF32(0x40), 2.0f);        // 0 1000 000: 2^(8-7)
  EXPECT_EQ(E4m3ToF32(0x23), 0.171875f);   // 0 0100 011: 2^(4-7) · 1.375
  EXPECT_EQ(E4m3ToF32(0x01), 0.001953125f);  // 0 0000 001: subnormal 1/8 · 2^-6 = 2^-9
  EXPECT_EQ(E4m3ToF32(0x7E), 448.0f);      // 0 1111 110: 2^8 · 1.75, the largest finite
}

// ---- one group of 16 --------------------------------------------------------------------------

// amax = 6 -> s = roundE4M3(1) = 1.0 = 0x38. Every E2M1 magnitude and its negative, so each
// nibble appears once (codes 0..7, then 9..F, then 0):
//   codes: 0 1 2 3 4 5 6 7 | 9 A B C D E F 0
//   bytes: 0x10 0x32 0x54 0x76 | 0xA9 0xCB 0xED 0x0F
TEST(Fp4E2m1KnownAnswer, EveryValueWithUnitScale) {
  ExpectOneGroup({0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                  -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f, 0.0f},
                 {0x38, 0x10, 0x32, 0x54, 0x76, 0xA9, 0xCB, 0xED, 0x0F},
                 {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                  -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f, 0.0f});
}

// amax = 12 -> s = roundE4M3(2) = 2 = 0x40. x / s lands exactly on E2M1 midpoints:
//   2.5 -> 2 (0100 beats 0101)   3.5 -> 4 (0110 beats 0101)   5 -> 4 (0110 beats 0111)
//   0.25 -> 0 (0000 beats 0001)  0.75 -> 1 (0010 beats 0001)  1.25 -> 1 (0010 beats 0011)
//   1.75 -> 2 (0100 beats 0011)  6 -> 6
//   x = 2 · [2.5, 3.5, 5, 0.25, 0.75, 1.25, 1.75, 6] and the negatives.
//   codes: 4 6 6 0 2 2 4 7 | C E E 8 A A C F
//   (-0.25 rounds to -0: the sign bit is kept, as in IEEE rounding, giving nibble 8.)
//   bytes: 0x64 0x06 0x22 0x74 | 0xEC 0x8E 0xAA 0xFC
//   x' = 2 · e = [4, 8, 8, 0, 2, 2, 4, 12] and the negatives.
TEST(Fp4E2m1KnownAnswer, TiesRoundHalfToEven) {
  ExpectOneGroup({5.0f, 7.0f, 10.0f, 0.5f, 1.5f, 2.5f, 3.5f, 12.0f,
                  -5.0f, -7.0f, -10.0f, -0.5f, -1.5f, -2.5f, -3.5f, -12.0f},
                 {0x40, 0x64, 0x06, 0x22, 0x74, 0xEC, 0x8E, 0xAA, 0xFC},
                 {4.0f, 8.0f, 8.0f, 0.0f, 2.0f, 2.0f, 4.0f, 12.0f,
                  -4.0f, -8.0f, -8.0f, -0.0f, -2.0f, -2.0f, -4.0f, -12.0f});
}

// amax = 6.3 -> 6.3 / 6 = 1.05; E4M3 steps by 1/8 in [1, 2): 1.05 · 8 = 8.4 -> 8 -> s = 1.0
// (0x38). The scale rounded down, so x / s can pass 6 and must saturate:
//   6.3 -> 6 (7)   -6.3 -> -6 (F)   5.2 -> 6 (7, past the midpoint 5)   4.9 -> 4 (6)
//   0.2 -> 0 (0)   -0.3 -> -0.5 (9, past 0.25)   2.7 -> 3 (5)   -1.1 -> -1 (A)   zeros (0)
//   bytes: 0xF7 0x67 0x90 0xA5 0x00 0x00 0x00 0x00
TEST(Fp4E2m1KnownAnswer, SaturatesAtSix) {
  ExpectOneGroup({6.3f, -6.3f, 5.2f, 4.9f, 0.2f, -0.3f, 2.7f, -1.1f,
                  0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f},
                 {0x38, 0xF7, 0x67, 0x90, 0xA5, 0x00, 0x00, 0x00, 0x00},
                 {6.0f, -6.0f, 6.0f, 4.0f, 0.0f, -0.5f, 3.0f, -1.0f,
                  0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f});
}

// amax = 1 -> 1/6 = 0.1667. In [2^-3, 2^-2) E4M3 steps by 2^-6: 0.1667 · 64 = 10.67 -> 11, so
// s = 11/64 = 0.171875; exponent field -3 + 7 = 4, mantissa 11 - 8 = 3: 0 0100 011 = 0x23.
// x / s = x · 64 / 11:
//   1.0 -> 5.818 -> 6 (7)      0.5 -> 2.909 -> 3 (5)     -0.25 -> -1.4545 -> -1.5 (B)
//   0.1 -> 0.5818 -> 0.5 (1)  -1.0 -> -6 (F)             0.75 -> 4.364 -> 4 (6)
//   0.3 -> 1.745 -> 1.5 (3)   -0.6 -> -3.4909 -> -3 (D)  zeros (0)
//   bytes: 0x57 0x1B 0x6F 0xD3 0x00 0x00 0x00 0x00
//   x' = e · 0.171875: 6 -> 1.03125, 3 -> 0.515625, 1.5 -> 0.2578125, 0.5 -> 0.0859375,
//   4 -> 0.6875
TEST(Fp4E2m1KnownAnswer, RoundedE4m3Scale) {
  ExpectOneGroup({1.0f, 0.5f, -0.25f, 0.1f, -1.0f, 0.75f, 0.3f, -0.6f,
                  0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f},
                 {0x23, 0x57, 0x1B, 0x6F, 0xD3, 0x00, 0x00, 0x00, 0x00},
                 {1.03125f, 0.515625f, -0.2578125f, 0.0859375f, -1.03125f, 0.6875f, 0.2578125f,
                  -0.515625f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f});
}

// amax = 0 -> roundE4M3(0) = 0, replaced by the smallest subnormal 2^-9 (code 0x01) so no
// division by zero; every element is code 0 and decodes to 0.
TEST(Fp4E2m1KnownAnswer, ZeroGroup) {
  ExpectOneGroup(std::vector<float>(16, 0.0f),
                 {0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00},
                 std::vector<float>(16, 0.0f));
}

// ---- heads smaller than a group ---------------------------------------------------------------

// 4 KV heads × head_dim 8 = a row of 32 = 2 groups: heads 0 and 1 share group 0, heads 2 and 3
// share group 1; block_bytes = 2 · 9 = 18.
//   group 0 (amax 6, s = 1, 0x38): head 0 = [0 .5 1 1.5 2 3 4 6], head 1 = [-.5 -1 -1.5 -2 -3 -4
//     -6 0]; the bytes of EveryValueWithUnitScale.
//   group 1 (amax 12, s = 2, 0x40): head 2 = [2 4 6 8 12 -12 -1 0], x/s = [1 2 3 4 6 -6 -0.5 0]
//     -> codes 2 4 5 6 7 F 9 0 -> bytes 0x42 0x65 0xF7 0x09;
//     head 3 = [1 -2 3 -4 0.5 0 0 0], x/s = [0.5 -1 1.5 -2 0.25 0 0 0]
//     -> codes 1 A 3 C 0 0 0 0 -> bytes 0xA1 0xC3 0x00 0x00 (0.25 -> 0, tie to even)
const RowShape kFourHeads = {4, 8};
const std::vector<float> kFourHeadsInput = {
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,          // head 0
    -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f, 0.0f,   // head 1
    2.0f, 4.0f, 6.0f, 8.0f, 12.0f, -12.0f, -1.0f, 0.0f,      // head 2
    1.0f, -2.0f, 3.0f, -4.0f, 0.5f, 0.0f, 0.0f, 0.0f,        // head 3
};
const std::vector<uint8_t> kFourHeadsBytes = {
    0x38, 0x10, 0x32, 0x54, 0x76, 0xA9, 0xCB, 0xED, 0x0F,  // group 0: heads 0, 1
    0x40, 0x42, 0x65, 0xF7, 0x09, 0xA1, 0xC3, 0x00, 0x00,  // group 1: heads 2, 3
};
const std::vector<float> kFourHeadsDecoded = {
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
    -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f, 0.0f,
    2.0f, 4.0f, 6.0f, 8.0f, 12.0f, -12.0f, -1.0f, 0.0f,
    1.0f, -2.0f, 3.0f, -4.0f, 0.0f, 0.0f, 0.0f, 0.0f,
};

TEST(Fp4E2m1KnownAnswer, FourHeadsOfEightShareGroups) {
  EXPECT_EQ(Fp4().check_shape(kFourHeads), "");
  ASSERT_EQ(Fp4().block_bytes(kFourHeads), 18);
  EXPECT_EQ(EncodeRow(kFourHeads, kFourHeadsInput), kFourHeadsBytes);
  EXPECT_EQ(DecodeRow(kFourHeads, kFourHeadsBytes), kFourHeadsDecoded);
}

// dot and axpy read one head through the same per-head decode: head 1 must come from group 0's
// upper half (bytes 5..8, scale 0x38) and head 2 from group 1 (bytes 10..13, scale 0x40).
// Expectations are summed here, in order of i, over the hand-decoded values.
TEST(Fp4E2m1KnownAnswer, PerHeadDotAndAxpyReadTheRightGroup) {
  const CodecArgs args{.shape = kFourHeads};
  const float q[8] = {1.0f, -0.5f, 0.25f, 2.0f, -1.0f, 0.75f, 1.5f, -3.0f};
  for (int32_t h = 0; h < 4; ++h) {
    const float* x = kFourHeadsDecoded.data() + h * 8;
    float dot = 0.0f;
    for (int i = 0; i < 8; ++i) dot += q[i] * x[i];
    EXPECT_EQ(Fp4().dot(q, kFourHeadsBytes.data(), 0, h, args), dot) << "head " << h;

    std::vector<float> acc(8, 1.0f), expected(8, 1.0f);
    for (int i = 0; i < 8; ++i) expected[i] += 0.5f * x[i];
    Fp4().axpy(0.5f, kFourHeadsBytes.data(), 0, h, acc.data(), args);
    EXPECT_EQ(acc, expected) << "head " << h;
  }
  // Head 1 by hand: q · [-.5 -1 -1.5 -2 -3 -4 -6 0]
  //   = -0.5 + 0.5 - 0.375 - 4 + 3 - 3 - 9 + 0 = -13.375
  EXPECT_EQ(Fp4().dot(q, kFourHeadsBytes.data(), 0, 1, args), -13.375f);
  // Head 2 by hand: q · [2 4 6 8 12 -12 -1 0] = 2 - 2 + 1.5 + 16 - 12 - 9 - 1.5 + 0 = -5
  EXPECT_EQ(Fp4().dot(q, kFourHeadsBytes.data(), 0, 2, args), -5.0f);
}

// ---- shapes -----------------------------------------------------------------------------------

TEST(Fp4E2m1Shape, CheckShape) {
  // 1 × 8: a row of 8 is not a whole number of 16-number groups.
  EXPECT_NE(Fp4().check_shape({1, 8}), "");
  // head_dim 24 is neither a multiple nor a divisor of 16: rejected even where the row (2 × 24
  // = 48) is a whole number of groups, and where it is not (1 × 24).
  EXPECT_NE(Fp4().check_shape({2, 24}), "");
  EXPECT_NE(Fp4().check_shape({1, 24}), "");
  EXPECT_EQ(Fp4().check_shape({2, 8}), "");
  EXPECT_EQ(Fp4().check_shape({1, 32}), "");
  EXPECT_EQ(Fp4().check_shape({4, 8}), "");
}

TEST(Fp4E2m1Shape, BlockBytesAreNineBytesPerSixteenNumbers) {
  EXPECT_EQ(Fp4().block_bytes({2, 8}), 9);
  EXPECT_EQ(Fp4().block_bytes({1, 32}), 18);
  EXPECT_EQ(Fp4().block_bytes({4, 128}), 32 * 9);  // 512 numbers -> 4.5 bits per number
}

TEST(Fp4E2m1Registry, FindFormatByName) {
  EXPECT_EQ(*FindFormat("fp4-e2m1"), &Fp4E2m1Format());
  const FormatDesc& fp4 = **FindFormat("fp4-e2m1");
  EXPECT_EQ(fp4.id, FormatId::kFp4E2m1);
  EXPECT_EQ(fp4.key.encode_block, fp4.value.encode_block);
}

}  // namespace
}  // namespace kvq
