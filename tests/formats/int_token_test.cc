// Known-answer tests for the int8 / int4 / int2 per-token codecs (src/format/int_token).
//
// Seed 000 defines the int4 row format; kvq generalises it to b bits:
//   s   = roundF16(max|x| / (2^(b-1) - 1))           one f16 scale per head row
//   raw = clamp(round(x / s) + 2^(b-1), 0, 2^b - 1)  round half to even; s = 0 gives raw 2^(b-1)
//   x'  = (raw - 2^(b-1)) · s
// stored per head as [f16 scale, 2 bytes LE][codes packed little-endian within bytes].
//
// Every expected byte and every expected decoded value below was worked out by hand from that
// definition (the working is in the comments) and is written out literally; nothing expected is
// produced by the code under test. Encoding must reproduce the bytes exactly, decoding the hand
// bytes must reproduce the values exactly, and dot/axpy must agree exactly with the same sums
// taken over the hand-decoded values (the summation order is part of the Codec contract).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "formats/int_token/int_token.h"
#include "kvq/format.h"

namespace kvq {
namespace {

// One known answer: an input row, the bytes it must encode to, and what those bytes decode to.
struct KnownAnswer {
  RowShape shape;
  std::vector<float> input;      // [n_kv_heads][head_dim]
  std::vector<uint8_t> bytes;    // the whole block, written out by hand
  std::vector<float> decoded;    // [n_kv_heads][head_dim], worked out by hand
};

std::vector<uint8_t> EncodeRow(const Codec& codec, RowShape shape, const std::vector<float>& row) {
  const CodecArgs args{.shape = shape};
  // Poison the block so a byte the encoder forgets to write shows up as a mismatch.
  std::vector<uint8_t> block(static_cast<size_t>(codec.block_bytes(shape)), 0xCD);
  codec.encode_block(row.data(), block.data(), args);
  return block;
}

std::vector<float> DecodeRow(const Codec& codec, RowShape shape,
                             const std::vector<uint8_t>& block) {
  const CodecArgs args{.shape = shape};
  std::vector<float> out(static_cast<size_t>(shape.elems()),
                         std::numeric_limits<float>::quiet_NaN());
  codec.decode_row(block.data(), 0, out.data(), args);
  return out;
}

// Checks block size, encode (byte for byte) and decode (exact values) against a known answer.
void ExpectKnownAnswer(const Codec& codec, const KnownAnswer& ka) {
  ASSERT_EQ(ka.input.size(), static_cast<size_t>(ka.shape.elems()));
  ASSERT_EQ(ka.decoded.size(), static_cast<size_t>(ka.shape.elems()));
  EXPECT_EQ(codec.check_shape(ka.shape), "");
  ASSERT_EQ(codec.block_bytes(ka.shape), static_cast<int64_t>(ka.bytes.size()));
  EXPECT_EQ(EncodeRow(codec, ka.shape, ka.input), ka.bytes);
  EXPECT_EQ(DecodeRow(codec, ka.shape, ka.bytes), ka.decoded);
}

const Codec& Int8() { return Int8Format().value; }
const Codec& Int4() { return Int4Format().value; }
const Codec& Int2() { return Int2Format().value; }

// ---- int4 -------------------------------------------------------------------------------------

// (a) Mixed signs. max|x| = 3.5, s = 3.5 / 7 = 0.5 exactly: f16 0x3800 -> bytes 00 38.
//   x / s = [1, -2, 7, -7, 2.4, -1.4, 0, 4.4] -> round [1, -2, 7, -7, 2, -1, 0, 4]
//   raw = +8 = [9, 6, 15, 1, 10, 7, 8, 12]
//   bytes (low nibble = even element): 0x69, 0x1F, 0x7A, 0xC8
//   x' = (raw - 8) · 0.5 = [0.5, -1, 3.5, -3.5, 1, -0.5, 0, 2]
const KnownAnswer kInt4Mixed = {
    .shape = {1, 8},
    .input = {0.5f, -1.0f, 3.5f, -3.5f, 1.2f, -0.7f, 0.0f, 2.2f},
    .bytes = {0x00, 0x38, 0x69, 0x1F, 0x7A, 0xC8},
    .decoded = {0.5f, -1.0f, 3.5f, -3.5f, 1.0f, -0.5f, 0.0f, 2.0f},
};

// (c) Largest magnitude negative: max|x| = |-14| = 14, s = 14 / 7 = 2: f16 0x4000 -> 00 40.
//   x / s = [-7, 2, 3, -1, 0, 4, -3, 6]; raw = [1, 10, 11, 7, 8, 12, 5, 14]
//   bytes: 0xA1, 0x7B, 0xC8, 0xE5; every value is a multiple of 2, so x' = x.
const KnownAnswer kInt4NegativeMax = {
    .shape = {1, 8},
    .input = {-14.0f, 4.0f, 6.0f, -2.0f, 0.0f, 8.0f, -6.0f, 12.0f},
    .bytes = {0x00, 0x40, 0xA1, 0x7B, 0xC8, 0xE5},
    .decoded = {-14.0f, 4.0f, 6.0f, -2.0f, 0.0f, 8.0f, -6.0f, 12.0f},
};

// (e) max|x| / 7 not representable in f16. max|x| = 1, 1/7 = 0.142857142857...
//   In [2^-3, 2^-2) an f16 step is 2^-13: (1/7) · 8192 = 1170.2857 -> 1170, so
//   s = 1170 / 8192 = 0.142822265625; exponent field -3 + 15 = 12, mantissa 1170 - 1024 = 146:
//   bits 0 01100 0010010010 = 0x3092 -> bytes 92 30.
//   x / s = x · 8192 / 1170:
//     1.0     ->  7.00171 ->  7   raw 15
//    -1.0     -> -7.00171 -> -7   raw 1
//     0.35712 ->  2.50045 ->  3   raw 11  (with the unrounded scale 1/7: 2.49984 -> 2; the f16
//    -0.35712 -> -2.50045 -> -3   raw 5    rounding of s decides these two)
//     0.1     ->  0.70017 ->  1   raw 9
//     0.3     ->  2.10051 ->  2   raw 10
//    -0.6     -> -4.20103 -> -4   raw 4
//     0       ->  0           raw 8
//   bytes: 0x1F, 0x5B, 0xA9, 0x84
//   x' = k · 1170 / 8192: 7 -> 8190/8192 = 0.999755859375, 3 -> 3510/8192 = 0.428466796875,
//   1 -> 0.142822265625, 2 -> 2340/8192 = 0.28564453125, -4 -> -4680/8192 = -0.5712890625
const KnownAnswer kInt4RoundedScale = {
    .shape = {1, 8},
    .input = {1.0f, -1.0f, 0.35712f, -0.35712f, 0.1f, 0.3f, -0.6f, 0.0f},
    .bytes = {0x92, 0x30, 0x1F, 0x5B, 0xA9, 0x84},
    .decoded = {0.999755859375f, -0.999755859375f, 0.428466796875f, -0.428466796875f,
                0.142822265625f, 0.28564453125f, -0.5712890625f, 0.0f},
};

TEST(Int4KnownAnswer, MixedRow) { ExpectKnownAnswer(Int4(), kInt4Mixed); }

// (b) A zero row (negative zeros included): s = 0 (bytes 00 00), every raw = 8 (bytes 0x88),
// and everything decodes to 0.
TEST(Int4KnownAnswer, ZeroRow) {
  ExpectKnownAnswer(Int4(), {
      .shape = {1, 8},
      .input = {0.0f, -0.0f, 0.0f, 0.0f, -0.0f, 0.0f, 0.0f, 0.0f},
      .bytes = {0x00, 0x00, 0x88, 0x88, 0x88, 0x88},
      .decoded = std::vector<float>(8, 0.0f),
  });
}

TEST(Int4KnownAnswer, LargestMagnitudeNegative) { ExpectKnownAnswer(Int4(), kInt4NegativeMax); }

// (d) Exact ties with s = 1 (max|x| = 7, f16 0x3C00 -> bytes 00 3C): round half to even.
//   x = ±0.5 ±1.5 ±2.5 ±3.5 ±4.5 ±5.5 ±6.5 ±7
//   round: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, 3.5 -> 4, 4.5 -> 4, 5.5 -> 6, 6.5 -> 6, 7 -> 7,
//          and the mirror for negatives (-0.5 -> -0, i.e. raw 8).
//   raw:   [8, 10, 10, 12, 12, 14, 14, 15,  8, 6, 6, 4, 4, 2, 2, 1]
//   bytes: 0xA8, 0xCA, 0xEC, 0xFE,  0x68, 0x46, 0x24, 0x12
TEST(Int4KnownAnswer, TiesRoundHalfToEven) {
  ExpectKnownAnswer(Int4(), {
      .shape = {1, 16},
      .input = {0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f, 6.5f, 7.0f,
                -0.5f, -1.5f, -2.5f, -3.5f, -4.5f, -5.5f, -6.5f, -7.0f},
      .bytes = {0x00, 0x3C, 0xA8, 0xCA, 0xEC, 0xFE, 0x68, 0x46, 0x24, 0x12},
      .decoded = {0.0f, 2.0f, 2.0f, 4.0f, 4.0f, 6.0f, 6.0f, 7.0f,
                  0.0f, -2.0f, -2.0f, -4.0f, -4.0f, -6.0f, -6.0f, -7.0f},
  });
}

TEST(Int4KnownAnswer, ScaleRoundedToF16) { ExpectKnownAnswer(Int4(), kInt4RoundedScale); }

// Scale overflow (documented in int_token.h): max|x| / 7 = 1e6 / 7 is past f16's range, so s
// saturates to 65504 = 0x7BFF (bytes FF 7B) and the codes then clamp to [0, 15].
//   x / s: 1e6 -> 15.27 -> 15 -> raw 23 -> clamp 15;  -1e6 -> -15 -> raw -7 -> clamp 0
//          65504 -> 1 (raw 9); -65504 -> -1 (raw 7); 0 -> raw 8; 131008 -> 2 (raw 10);
//          32752 -> 0.5 -> 0 (tie, raw 8); -98256 -> -1.5 -> -2 (tie, raw 6)
//   bytes: 0x0F, 0x79, 0xA8, 0x68
//   x' = (raw - 8) · 65504: 7 -> 458528, -8 -> -524032, ±1 -> ±65504, 2 -> 131008, -2 -> -131008
TEST(Int4KnownAnswer, ScaleSaturatesAndCodesClamp) {
  ExpectKnownAnswer(Int4(), {
      .shape = {1, 8},
      .input = {1e6f, -1e6f, 65504.0f, -65504.0f, 0.0f, 131008.0f, 32752.0f, -98256.0f},
      .bytes = {0xFF, 0x7B, 0x0F, 0x79, 0xA8, 0x68},
      .decoded = {458528.0f, -524032.0f, 65504.0f, -65504.0f, 0.0f, 131008.0f, 0.0f,
                  -131008.0f},
  });
}

// Two heads × head_dim 8: each head has its own scale and the heads follow one another.
// Head 0 is the mixed row (s = 0.5), head 1 the negative-max row (s = 2); a single row-wide
// scale would have been 2 for both. block_bytes = 2 × (2 + 8 · 4 / 8) = 12.
KnownAnswer TwoHeads() {
  KnownAnswer ka;
  ka.shape = {2, 8};
  for (const KnownAnswer* head : {&kInt4Mixed, &kInt4NegativeMax}) {
    ka.input.insert(ka.input.end(), head->input.begin(), head->input.end());
    ka.bytes.insert(ka.bytes.end(), head->bytes.begin(), head->bytes.end());
    ka.decoded.insert(ka.decoded.end(), head->decoded.begin(), head->decoded.end());
  }
  return ka;
}

TEST(Int4KnownAnswer, TwoHeadsEachWithItsOwnScale) {
  const KnownAnswer ka = TwoHeads();
  EXPECT_EQ(Int4().block_bytes(ka.shape), 12);
  EXPECT_EQ(ka.bytes, (std::vector<uint8_t>{0x00, 0x38, 0x69, 0x1F, 0x7A, 0xC8,    // head 0
                                            0x00, 0x40, 0xA1, 0x7B, 0xC8, 0xE5}));  // head 1
  ExpectKnownAnswer(Int4(), ka);
}

// ---- int8 and int2 ----------------------------------------------------------------------------

// int8: s = roundF16(max|x| / 127), offset 128, raw in [0, 255], one byte per element.
//   max|x| = 12.7, 12.7 / 127 = 0.1. In [2^-4, 2^-3) an f16 step is 2^-14: 0.1 · 16384 = 1638.4
//   -> 1638, s = 1638 / 16384 = 0.0999755859375; exponent field 11, mantissa 614 = 0x266:
//   bits 0 01011 1001100110 = 0x2E66 -> bytes 66 2E.
//   x / s = x · 16384 / 1638:
//     12.7 ->  127.03 ->  127  raw 255 = 0xFF     -3.3 -> -33.008 -> -33  raw  95 = 0x5F
//    -12.7 -> -127.03 -> -127  raw   1 = 0x01     6.35 ->  63.516 ->  64  raw 192 = 0xC0
//     0.05 ->  0.5001 ->    1  raw 129 = 0x81      1.0 ->  10.002 ->  10  raw 138 = 0x8A
//                                                 -0.1 ->  -1.0002 -> -1  raw 127 = 0x7F
//                                                    0 ->                  raw 128 = 0x80
//   x' = k · 1638 / 16384: 127 -> 208026/16384 = 12.6968994140625, 1 -> 0.0999755859375,
//   -33 -> -54054/16384 = -3.2991943359375, 64 -> 6.3984375, 10 -> 16380/16384 = 0.999755859375
TEST(Int8KnownAnswer, OneRow) {
  ExpectKnownAnswer(Int8(), {
      .shape = {1, 8},
      .input = {12.7f, -12.7f, 0.05f, -3.3f, 6.35f, 1.0f, -0.1f, 0.0f},
      .bytes = {0x66, 0x2E, 0xFF, 0x01, 0x81, 0x5F, 0xC0, 0x8A, 0x7F, 0x80},
      .decoded = {12.6968994140625f, -12.6968994140625f, 0.0999755859375f, -3.2991943359375f,
                  6.3984375f, 0.999755859375f, -0.0999755859375f, 0.0f},
  });
}

// int2: s = roundF16(max|x| / 1), offset 2, raw in [0, 3]; element 4j+k at bits 2k of byte j.
//   max|x| = 0.75 = f16 0x3A00 -> bytes 00 3A.
//   x / s = [1, -1, 0.5, -0.5, 0.2667, -0.6667, 0, 0.6667]
//   round = [1, -1, 0 (tie), -0 (tie), 0, -1, 0, 1]; raw = [3, 1, 2, 2, 2, 1, 2, 3]
//   byte 0 = 3 | 1<<2 | 2<<4 | 2<<6 = 0xA7;  byte 1 = 2 | 1<<2 | 2<<4 | 3<<6 = 0xE6
TEST(Int2KnownAnswer, OneRow) {
  ExpectKnownAnswer(Int2(), {
      .shape = {1, 8},
      .input = {0.75f, -0.75f, 0.375f, -0.375f, 0.2f, -0.5f, 0.0f, 0.5f},
      .bytes = {0x00, 0x3A, 0xA7, 0xE6},
      .decoded = {0.75f, -0.75f, 0.0f, 0.0f, 0.0f, -0.75f, 0.0f, 0.75f},
  });
}

// ---- shapes -----------------------------------------------------------------------------------

// Packed codes must fill whole bytes per head: head_dim a multiple of 2 for int4, of 4 for int2.
TEST(IntTokenShape, CheckShapeRequiresWholeBytesPerHead) {
  EXPECT_NE(Int4().check_shape({1, 7}), "");
  EXPECT_NE(Int2().check_shape({1, 6}), "");
  EXPECT_EQ(Int4().check_shape({1, 8}), "");
  EXPECT_EQ(Int2().check_shape({1, 8}), "");
  EXPECT_EQ(Int8().check_shape({1, 7}), "");
}

TEST(IntTokenShape, BlockBytesPerHead) {
  // 2 + head_dim · b / 8 per head.
  EXPECT_EQ(Int8().block_bytes({4, 128}), 4 * (2 + 128));
  EXPECT_EQ(Int4().block_bytes({4, 128}), 4 * (2 + 64));  // 528, the figure int_token.h quotes
  EXPECT_EQ(Int2().block_bytes({4, 128}), 4 * (2 + 32));
}

TEST(IntTokenRegistry, FindFormatByName) {
  EXPECT_EQ(*FindFormat("int8"), &Int8Format());
  EXPECT_EQ(*FindFormat("int4"), &Int4Format());
  EXPECT_EQ(*FindFormat("int2"), &Int2Format());
  // Keys and values use the same per-token codec.
  const FormatDesc& int4 = **FindFormat("int4");
  EXPECT_EQ(int4.key.encode_block, int4.value.encode_block);
  EXPECT_EQ(int4.key.element_bits, 4);
  EXPECT_EQ(int4.key.rows_per_block, 1);
}

// ---- dot and axpy -----------------------------------------------------------------------------

// dot = Σ_i q[i] · x'[i] in f32, i = 0 .. head_dim-1 in order; axpy: acc[i] += w · x'[i].
// The expectations are computed here from the hand-decoded values, so strict equality holds.
void ExpectDotAndAxpyMatchDecoded(const Codec& codec, const KnownAnswer& ka) {
  const CodecArgs args{.shape = ka.shape};
  const int32_t d = ka.shape.head_dim;
  const std::vector<float> q = {0.75f, -1.25f, 2.0f, 0.3f, -0.7f, 1.1f, 3.0f, -0.125f};
  ASSERT_EQ(static_cast<int32_t>(q.size()), d);
  for (int32_t h = 0; h < ka.shape.n_kv_heads; ++h) {
    const float* x = ka.decoded.data() + static_cast<size_t>(h) * d;
    float dot = 0.0f;
    for (int32_t i = 0; i < d; ++i) dot += q[i] * x[i];
    EXPECT_EQ(codec.dot(q.data(), ka.bytes.data(), 0, h, args), dot) << "head " << h;

    const float w = -0.6f;
    std::vector<float> acc(static_cast<size_t>(d)), expected(static_cast<size_t>(d));
    for (int32_t i = 0; i < d; ++i) acc[i] = expected[i] = 0.1f * static_cast<float>(i) - 0.3f;
    for (int32_t i = 0; i < d; ++i) expected[i] += w * x[i];
    codec.axpy(w, ka.bytes.data(), 0, h, acc.data(), args);
    EXPECT_EQ(acc, expected) << "head " << h;
  }
}

TEST(IntTokenDotAxpy, MatchHandDecodedRows) {
  ExpectDotAndAxpyMatchDecoded(Int4(), kInt4RoundedScale);
  ExpectDotAndAxpyMatchDecoded(Int4(), TwoHeads());
}

// A smaller, fully hand-summed instance: head 1 of the two-head block decodes to
// x' = [-14, 4, 6, -2, 0, 8, -6, 12]; with q = [1, 0.5, -1, 2, 9, 0.25, -0.5, 1]:
//   -14 + 2 - 6 - 4 + 0 + 2 + 3 + 12 = -5 (every partial sum exact in f32).
// axpy with w = 0.5 into zeros gives x' / 2.
TEST(IntTokenDotAxpy, HandSummedSecondHead) {
  const KnownAnswer ka = TwoHeads();
  const CodecArgs args{.shape = ka.shape};
  const float q[8] = {1.0f, 0.5f, -1.0f, 2.0f, 9.0f, 0.25f, -0.5f, 1.0f};
  EXPECT_EQ(Int4().dot(q, ka.bytes.data(), 0, 1, args), -5.0f);
  std::vector<float> acc(8, 0.0f);
  Int4().axpy(0.5f, ka.bytes.data(), 0, 1, acc.data(), args);
  EXPECT_EQ(acc, (std::vector<float>{-7.0f, 2.0f, 3.0f, -1.0f, 0.0f, 4.0f, -3.0f, 6.0f}));
}

}  // namespace
}  // namespace kvq
