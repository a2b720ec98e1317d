// Known-answer and decode-only tests for the fp8-e4m3 codecs (src/formats/fp8_e4m3).
//
// The format: e = the smallest integer in [-126, 119] with amax <= 448 · 2^e, stored as the byte
// e + 127; c = roundE4M3(x · 2^-e) (RNE, saturating); x' = E4M3(c) · 2^e. Keys: per head of a
// group of 32 rows, [e byte][32 rows x head_dim codes], the block zero-padded to a multiple of 32
// bytes; values: per row, [e byte][n_kv_heads x head_dim codes].
//
// E4M3 codes are S.EEEE.MMM (bias 7): 2^k (k >= -6) is exponent field k + 7, mantissa 0; in
// [2^k, 2^(k+1)) the step is 2^(k-3); below 2^-6 the subnormals are m · 2^-9. The code's lowest bit
// is the mantissa's, so a tie goes to the even code. All expected bytes and values below were
// worked out by hand (the working is in the comments); nothing expected comes from the code under
// test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "formats/fp8_e4m3/fp8_e4m3.h"
#include "formats/row_sequence.h"
#include "kvq/format.h"

namespace kvq {
namespace {

const Codec& Keys() { return Fp8E4m3Format().key; }
const Codec& Values() { return Fp8E4m3Format().value; }

// Encodes rows_per_block rows into a poisoned block, so a byte the encoder forgets shows up.
std::vector<uint8_t> Encode(const Codec& codec, RowShape shape, const std::vector<float>& rows) {
  EXPECT_EQ(static_cast<int64_t>(rows.size()), codec.rows_per_block * shape.elems());
  std::vector<uint8_t> block(static_cast<size_t>(codec.block_bytes(shape)), 0xCD);
  codec.encode_block(rows.data(), block.data(), {.shape = shape});
  return block;
}

std::vector<float> Decode(const Codec& codec, RowShape shape, const std::vector<uint8_t>& block,
                          int32_t row) {
  std::vector<float> out(static_cast<size_t>(shape.elems()), std::numeric_limits<float>::quiet_NaN());
  codec.decode_row(block.data(), row, out.data(), {.shape = shape});
  return out;
}

TEST(Fp8E4m3Format, IdNameAndShapeOfTheCodecs) {
  EXPECT_EQ(Fp8E4m3Format().id, FormatId::kFp8E4m3);
  EXPECT_EQ(static_cast<int>(FormatId::kFp8E4m3), 11);
  EXPECT_EQ(FindFormat(static_cast<FormatId>(4)), nullptr);  // the retired per-tensor layout
  EXPECT_EQ(Keys().rows_per_block, 32);
  EXPECT_EQ(Values().rows_per_block, 1);
  EXPECT_FALSE(Keys().calibrated);
  EXPECT_FALSE(Values().calibrated);
  // Keys: n_kv_heads · (1 + 32 · head_dim), rounded up to a multiple of 32.
  EXPECT_EQ(Keys().block_bytes({4, 8}), 1056);      // 4 · 257 = 1028 -> 33 per position
  EXPECT_EQ(Keys().block_bytes({8, 128}), 32800);   // 8 · 4097 = 32776 -> 1025 per position
  EXPECT_EQ(Keys().block_bytes({40, 8}), 10304);    // 40 · 257 = 10280 -> 322 per position
  EXPECT_EQ(Keys().block_bytes({1, 2}), 96);        // 65 -> 96
  EXPECT_EQ(Values().block_bytes({4, 8}), 33);
  EXPECT_EQ(Values().block_bytes({8, 128}), 1025);
  EXPECT_DOUBLE_EQ(BitsPerNumber(Keys(), {4, 8}), 8.25);
  EXPECT_DOUBLE_EQ(BitsPerNumber(Values(), {4, 8}), 8.25);
  EXPECT_DOUBLE_EQ(BitsPerNumber(Keys(), {8, 128}), 8.0078125);
  EXPECT_DOUBLE_EQ(BitsPerNumber(Values(), {8, 128}), 8.0078125);
}

// One value row, 1 head x 8. amax = 3.5 = 448 · 2^-7 (and 448 · 2^-8 = 1.75 < 3.5): e = -7, byte
// 120 = 0x78; codes are of x · 128:
//   3.5    -> 448 = 1.75 · 2^8: 0 1111 110 = 0x7E
//   1      -> 128 = 2^7:        0 1110 000 = 0x70
//   -0.25  -> -32 = -2^5:       1 1100 000 = 0xE0
//   0      -> 0:                             0x00
//   17/128 -> 17, a tie of 16 (0 1011 000) and 18 (0 1011 001): even, 16 = 0x58
//   19/128 -> 19, a tie of 18 (…001) and 20 (0 1011 010): even, 20 = 0x5A
//   2^-16  -> 2^-9, the smallest subnormal:  0 0000 001 = 0x01
//   3·2^-17 -> 3·2^-10, a tie of 2^-9 (…001) and 2^-8 (0 0000 010): even, 0x02
TEST(Fp8E4m3Values, OneRowByteForByteWithTies) {
  const RowShape shape = {1, 8};
  const std::vector<float> x = {3.5f, 1.0f, -0.25f, 0.0f, 17.0f / 128, 19.0f / 128, 0x1p-16f, 0x3p-17f};
  const std::vector<uint8_t> want = {0x78, 0x7E, 0x70, 0xE0, 0x00, 0x58, 0x5A, 0x01, 0x02};
  const std::vector<uint8_t> block = Encode(Values(), shape, x);
  EXPECT_EQ(block, want);
  const std::vector<float> decoded = {3.5f, 1.0f, -0.25f, 0.0f, 0.125f, 0.15625f, 0x1p-16f, 0x1p-15f};
  EXPECT_EQ(Decode(Values(), shape, block, 0), decoded);
  // The bound is half a step: 2^-4 · |x|, or 2^-10 · 2^-7 among subnormals; the ties reach it.
  const CodecArgs args{.shape = shape};
  EXPECT_EQ(Values().error_bound(x[4], block.data(), 0, 0, 4, args), 17.0f / 128 / 16);
  EXPECT_EQ(Values().error_bound(x[7], block.data(), 0, 0, 7, args), 0x1p-17f);
  EXPECT_EQ(std::fabs(x[7] - decoded[7]), 0x1p-17f);
}

// The exponent is shared by all heads of a value row: head 1's values 2^-20 smaller keep their own
// codes (scaling by a power of two is exact) while they stay above E4M3's subnormals.
TEST(Fp8E4m3Values, OneExponentPerRowAcrossHeads) {
  const RowShape shape = {2, 1};
  const std::vector<uint8_t> block = Encode(Values(), shape, {3.5f, 3.5f * 0x1p-12f});
  // 3.5 · 2^-12 · 128 = 448 · 2^-12 = 1.75 · 2^-4: 0 0011 110 = 0x1E.
  EXPECT_EQ(block, (std::vector<uint8_t>{0x78, 0x7E, 0x1E}));
  EXPECT_EQ(Decode(Values(), shape, block, 0), (std::vector<float>{3.5f, 3.5f * 0x1p-12f}));
}

// Exponent choice at its edges: amax exactly 448 · 2^e keeps e; a little more takes e + 1; zero
// takes -126 (byte 1); values past 448 · 2^119 saturate (e stops at 119, byte 246).
TEST(Fp8E4m3Values, ExponentEdges) {
  const RowShape shape = {1, 1};
  EXPECT_EQ(Encode(Values(), shape, {448.0f}), (std::vector<uint8_t>{127, 0x7E}));
  EXPECT_EQ(Encode(Values(), shape, {-448.0f}), (std::vector<uint8_t>{127, 0xFE}));
  // 449 > 448: e = 1, 449/2 = 224.5 in [128, 256) (step 16): 224 (0 1110 110 = 0x76), no tie.
  EXPECT_EQ(Encode(Values(), shape, {449.0f}), (std::vector<uint8_t>{128, 0x76}));
  EXPECT_EQ(Encode(Values(), shape, {0.0f}), (std::vector<uint8_t>{1, 0x00}));
  EXPECT_EQ(Decode(Values(), shape, {1, 0x00}, 0), (std::vector<float>{0.0f}));
  // 2^-140 (an f32 subnormal): e = -126, x · 2^126 = 2^-14 rounds to 0; the bound 2^-136 holds it.
  const std::vector<uint8_t> tiny = Encode(Values(), shape, {0x1p-140f});
  EXPECT_EQ(tiny, (std::vector<uint8_t>{1, 0x00}));
  EXPECT_EQ(Values().error_bound(0x1p-140f, tiny.data(), 0, 0, 0, {.shape = shape}), 0x1p-136f);
  // 3.3e38 > 448 · 2^119 ≈ 2.98e38: byte 246, code 448 (0x7E), error |x| − 448 · 2^119.
  const float huge = 3.3e38f;
  const std::vector<uint8_t> big = Encode(Values(), shape, {huge});
  EXPECT_EQ(big, (std::vector<uint8_t>{246, 0x7E}));
  EXPECT_EQ(Decode(Values(), shape, big, 0), (std::vector<float>{448.0f * 0x1p119f}));
  EXPECT_EQ(Values().error_bound(huge, big.data(), 0, 0, 0, {.shape = shape}), huge - 448.0f * 0x1p119f);
}

// One key group, 2 heads x 2, 32 rows: row r of head 0 is (r + 1, −(r + 1)/64), head 1 the same
// times 2^-20. Head 0's amax is 32 (448 · 2^-4 = 28 < 32 <= 56): e = -3, byte 124 = 0x7C; head 1:
// e = -23, byte 104 = 0x68. Codes of x · 8 (and the same for head 1):
//   row 0:  8 = 2^3: 0 1010 000 = 0x50;   −1/8 = −2^-3: 1 0100 000 = 0xA0
//   row 31: 256 = 2^8: 0 1111 000 = 0x78; −4 = −2^2:    1 1001 000 = 0xC8
//   row 2:  24 = 1.5 · 2^4: 0 1011 100 = 0x5C; −3/8 = −1.5 · 2^-2: 1 0101 100 = 0xAC
// Each head takes 1 + 32 · 2 = 65 bytes; 130 bytes are padded with zeros to 160.
TEST(Fp8E4m3Keys, OneGroupByteForByte) {
  const RowShape shape = {2, 2};
  std::vector<float> rows;  // [32][2][2]
  for (int r = 0; r < 32; ++r) {
    const float a = static_cast<float>(r + 1), b = -static_cast<float>(r + 1) / 64;
    rows.insert(rows.end(), {a, b, a * 0x1p-20f, b * 0x1p-20f});
  }
  const std::vector<uint8_t> block = Encode(Keys(), shape, rows);
  ASSERT_EQ(block.size(), 160u);
  EXPECT_EQ(block[0], 0x7C);
  EXPECT_EQ(block[65], 0x68);
  for (int head : {0, 1}) {
    const uint8_t* codes = block.data() + head * 65 + 1;
    EXPECT_EQ(codes[0], 0x50) << head;
    EXPECT_EQ(codes[1], 0xA0) << head;
    EXPECT_EQ(codes[2 * 2], 0x5C) << head;
    EXPECT_EQ(codes[2 * 2 + 1], 0xAC) << head;
    EXPECT_EQ(codes[31 * 2], 0x78) << head;
    EXPECT_EQ(codes[31 * 2 + 1], 0xC8) << head;
  }
  for (size_t i = 130; i < 160; ++i) EXPECT_EQ(block[i], 0) << "pad byte " << i;
  // Rows whose r + 1 has at most 4 significant bits (E4M3's 1 + 3) decode exactly.
  for (int r : {0, 2, 7, 15, 31}) {
    const float a = static_cast<float>(r + 1), b = -static_cast<float>(r + 1) / 64;
    EXPECT_EQ(Decode(Keys(), shape, block, r), (std::vector<float>{a, b, a * 0x1p-20f, b * 0x1p-20f})) << r;
  }
  // r + 1 = 17: 17 · 8 = 136 in [128, 256), step 16: a tie of 128 (…000) and 144 (…001), even:
  // 128, decoded 16.
  EXPECT_EQ(Decode(Keys(), shape, block, 16)[0], 16.0f);
}

// The failure mode of the retired per-tensor scale: a decode-only cache (one row per append) whose
// first row is small and whose later rows grow to 10x its amax. Every number must stay within
// half an E4M3 step of itself: |x − x'| <= max(|x| · 2^-4, 2^(e-10)) with 2^e < amax / 224 (e is
// the smallest with amax <= 448 · 2^e, so 448 · 2^(e-1) < amax), amax over the numbers sharing
// the exponent — and the codec's own bound must say so too. Saturation at the first row's scale
// would miss by up to 9x the first row's amax. The 8 newest keys (the incomplete group) are f32.
TEST(Fp8E4m3DecodeOnly, LaterRowsTenTimesTheFirstDoNotSaturate) {
  const RowShape shape = {2, 16};
  constexpr int64_t kRows = 72;  // two key groups and 8 residual rows
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(kRows * shape.elems());  // [kRows][2][16]
  for (int64_t r = 0; r < kRows; ++r) {
    const float growth = 1.0f + 9.0f * static_cast<float>(r) / (kRows - 1);  // 1 .. 10
    for (int64_t i = 0; i < shape.elems(); ++i) x[r * shape.elems() + i] = growth * normal(rng);
  }
  // Row 0 scaled to amax 1: the later rows reach past 10x it.
  float first_amax = 0.0f;
  for (int64_t i = 0; i < shape.elems(); ++i) first_amax = std::fmax(first_amax, std::fabs(x[i]));
  for (int64_t i = 0; i < shape.elems(); ++i) x[i] /= first_amax;
  first_amax = 0.0f;
  for (int64_t i = 0; i < shape.elems(); ++i) first_amax = std::fmax(first_amax, std::fabs(x[i]));
  ASSERT_EQ(first_amax, 1.0f);
  float later_amax = 0.0f;
  for (size_t i = shape.elems(); i < x.size(); ++i) later_amax = std::fmax(later_amax, std::fabs(x[i]));
  ASSERT_GT(later_amax, 10.0f * first_amax);  // the sequence does what it says

  for (const Codec* codec : {&Keys(), &Values()}) {
    SCOPED_TRACE(codec == &Keys() ? "K" : "V");
    RowSequence seq(*codec, shape);
    for (int64_t r = 0; r < kRows; ++r) seq.Append(x.data() + r * shape.elems(), 1);
    ASSERT_EQ(seq.size(), kRows);
    const int32_t per = codec->rows_per_block;
    const int64_t in_blocks = kRows / per * per;
    const RowsView view = seq.View(0, kRows);
    std::vector<float> out(shape.elems());
    for (int64_t r = 0; r < kRows; ++r) {
      seq.DecodeRow(r, out.data());
      if (r >= in_blocks) {  // the residual of an incomplete key group: f32, exact
        for (int64_t i = 0; i < shape.elems(); ++i) ASSERT_EQ(out[i], x[r * shape.elems() + i]) << "row " << r;
        continue;
      }
      for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
        // amax of the numbers sharing (r, h)'s exponent: the key group's head, or the value row.
        float amax = 0.0f;
        const int64_t r0 = per == 1 ? r : r / per * per;
        const int32_t h0 = per == 1 ? 0 : h, h1 = per == 1 ? shape.n_kv_heads : h + 1;
        for (int64_t rr = r0; rr < r0 + per; ++rr) {
          for (int64_t j = rr * shape.elems() + h0 * shape.head_dim; j < rr * shape.elems() + h1 * shape.head_dim; ++j) {
            amax = std::fmax(amax, std::fabs(x[j]));
          }
        }
        for (int32_t i = 0; i < shape.head_dim; ++i) {
          const int64_t j = r * shape.elems() + h * shape.head_dim + i;
          const float err = std::fabs(x[j] - out[h * shape.head_dim + i]);
          const float limit = std::fmax(std::fabs(x[j]) * 0x1p-4f, amax / 224.0f * 0x1p-10f);
          ASSERT_LE(err, limit) << "row " << r << " head " << h << " i " << i << ": x " << x[j];
          const uint8_t* block = view.blocks + r / per * codec->block_bytes(shape);
          const float bound = codec->error_bound(x[j], block, static_cast<int32_t>(r % per), h, i, view.args);
          ASSERT_LE(err, bound) << "row " << r;
          ASSERT_LE(bound, limit) << "row " << r;  // the derived bound is the no-saturation bound
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvq
