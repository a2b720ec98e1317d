// Q4_1, Q5_0 and Q5_1 beyond the conformance suite (weight_type_conformance_test.cc):
//   - the reference quantisers on hand-built inputs whose bytes are worked out by hand (ggml's
//     rounding: round-half-up by truncation, Q5_0's clamp of the extreme to 31);
//   - the known-answer permutation's qh, by hand;
//   - the matvec tolerance catches plausible kernel bugs: the quantised product of a
//     deliberately wrong decoding (qh bits reversed, qh halves swapped, the 5th bit dropped,
//     nibble halves swapped, the min dropped or negated) is outside the bound on every row,
//     while every target's kernel is inside it (checked here too, for these matrices).
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL  // as the weight kernels, so the target list below includes AVX3_DL
#endif
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "base/float_codes.h"
#include "test_util/known_block.h"
#include "test_util/matvec_bounds.h"
#include "weights/known_blocks/q5_0.h"
#include "weights/matvec.h"
#include "weights/weight_type.h"

namespace kvq {
namespace {

const WeightTypeDesc& Type(const char* name) { return **FindWeightTypeByName(name); }

std::vector<uint8_t> Quantize(const char* name, const std::vector<float>& x) {
  const WeightTypeDesc& d = Type(name);
  std::vector<uint8_t> block(d.block_bytes);
  d.quantize_block_ref(x.data(), block.data());
  return block;
}

TEST(LegacyQuantizers, Q4_1ExactRampAndRoundHalfUp) {
  // x_j = j mod 16: min 0, max 15, d = 1 (0x3C00), m = 0, nibble j mod 16 in both halves.
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j % 16);
  std::vector<uint8_t> want = {0x00, 0x3C, 0x00, 0x00};
  for (int j = 0; j < 16; ++j) want.push_back(static_cast<uint8_t>(j | j << 4));
  EXPECT_EQ(Quantize("q4_1", x), want);
  // 7.5 lies halfway between nibbles 7 and 8: ggml's trunc(x + 0.5) takes 8.
  x[3] = 7.5f;
  want[4 + 3] = 0x38;  // element 3 -> 8, element 19 -> 3
  EXPECT_EQ(Quantize("q4_1", x), want);
}

TEST(LegacyQuantizers, Q5_0ExactRampAndClampedExtreme) {
  // x_j = j − 16: the first value of largest magnitude is −16 (j = 0), d = −16 / −16 = 1, code
  // trunc(x + 16.5) = j: qs byte j = j | j << 4 (element j + 16 has 5-bit value 16 + j, low bits
  // j), qh = 0xFFFF0000.
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16);
  std::vector<uint8_t> want = {0x00, 0x3C, 0x00, 0x00, 0xFF, 0xFF};
  for (int j = 0; j < 16; ++j) want.push_back(static_cast<uint8_t>(j | j << 4));
  EXPECT_EQ(Quantize("q5_0", x), want);
  // x = {16, −16, 0...}: d = 16 / −16 = −1 (0xBC00); 16 -> trunc(−16 + 16.5) = 0; −16 ->
  // trunc(32.5) = 32, clamped to 31 (decodes to −15, as ggml's); 0 -> 16 (5th bit set, low 0).
  std::vector<float> y(32, 0.0f);
  y[0] = 16.0f, y[1] = -16.0f;
  std::vector<uint8_t> want_y = {0x00, 0xBC, 0xFE, 0xFF, 0xFF, 0xFF, 0x00, 0x0F};
  for (int j = 2; j < 16; ++j) want_y.push_back(0x00);
  EXPECT_EQ(Quantize("q5_0", y), want_y);
  std::vector<float> decoded(32);
  Type("q5_0").dequantize_block_ref(want_y.data(), decoded.data());
  EXPECT_EQ(decoded[0], 16.0f);
  EXPECT_EQ(decoded[1], -15.0f);
  EXPECT_EQ(decoded[2], 0.0f);
}

TEST(LegacyQuantizers, Q5_1ExactRamp) {
  // x_j = j: min 0, max 31, d = 1, m = 0, 5-bit value j: qs byte j = j | j << 4, qh = 0xFFFF0000.
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j);
  std::vector<uint8_t> want = {0x00, 0x3C, 0x00, 0x00, 0x00, 0x00, 0xFF, 0xFF};
  for (int j = 0; j < 16; ++j) want.push_back(static_cast<uint8_t>(j | j << 4));
  EXPECT_EQ(Quantize("q5_1", x), want);
}

TEST(LegacyKnownBlocks, PermutationHighBitsWorkedOutByHand) {
  // n_i = 7i mod 32 is ≥ 16 at i = 3, 4, 7, 8, 9, 12, 13 (0x3398) and 16, 17, 18, 21, 22, 26, 27,
  // 30, 31 (0xCC67 << 16).
  const std::vector<uint8_t> bytes = test::FiveBitBytes(test::FiveBitPermutation());
  const std::vector<uint8_t> qh = test::U32(0xCC673398);
  EXPECT_EQ(std::vector<uint8_t>(bytes.begin(), bytes.begin() + 4), qh);
}

// ---- Wrong decodings are outside the tolerance ----

// A decoding of one block into exact weights w [32], possibly wrong.
using Decoder = std::function<void(const uint8_t* block, double* w)>;

struct Layout {
  int d_at, m_at, qh_at, qs_at;  // byte offsets; −1 when absent
};

double Half(const uint8_t* p) { return F16ToF32(static_cast<uint16_t>(p[0] | p[1] << 8)); }

// Decodes with the given mistakes: bit(i) chooses which qh bit element i takes (−1: none),
// swap_nibbles exchanges the halves, min_sign multiplies m (1 correct, 0 dropped, −1 negated).
Decoder Decode(Layout l, int offset, std::function<int(int)> bit, bool swap_nibbles, double min_sign) {
  return [=](const uint8_t* b, double* w) {
    const double d = Half(b + l.d_at), m = l.m_at >= 0 ? Half(b + l.m_at) : 0.0;
    uint32_t qh = 0;
    if (l.qh_at >= 0) std::memcpy(&qh, b + l.qh_at, 4);
    for (int i = 0; i < 32; ++i) {
      const uint8_t byte = b[l.qs_at + i % 16];
      const bool low = (i < 16) != swap_nibbles;
      int n = low ? (byte & 0x0F) : (byte >> 4);
      const int k = l.qh_at >= 0 ? bit(i) : -1;
      if (k >= 0) n |= static_cast<int>((qh >> k) & 1) << 4;
      w[i] = d * (n - offset) + min_sign * m;
    }
  };
}

// Per row, Σ_b d_x·Σ_i w_i·q_i with w from `decode` (double; exact weights, so only the sum rounds).
std::vector<double> QuantizedProduct(const Matrix& w, const Decoder& decode, const std::vector<float>& x) {
  const WeightTypeDesc& desc = *FindWeightType(w.type);
  std::vector<int8_t> q(w.cols);       // [cols]
  std::vector<float> d(w.cols / 32);   // [cols / 32]
  QuantizeActivationReference(x.data(), w.cols, q.data(), d.data());
  std::vector<double> y(w.rows, 0.0);  // [rows]
  double wb[32];
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t b = 0; b < w.cols / 32; ++b) {
      decode(w.data + (r * w.cols / 32 + b) * desc.block_bytes, wb);
      double dot = 0.0;
      for (int i = 0; i < 32; ++i) dot += wb[i] * q[b * 32 + i];
      y[r] += static_cast<double>(d[b]) * dot;
    }
  }
  return y;
}

void ExpectWrongDecodingsCaught(const char* name, Layout l, int offset,
                                const std::vector<std::pair<const char*, Decoder>>& wrong) {
  const WeightTypeDesc& desc = Type(name);
  const int64_t rows = 16, cols = 1024;
  std::mt19937 rng(404);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> wf(rows * cols), x(cols);  // [rows][cols], [cols]
  for (float& v : wf) v = normal(rng) + 0.5f;    // an offset, so a min type's m matters
  for (float& v : x) v = normal(rng) + 0.25f;    // and Σq does
  std::vector<uint8_t> bytes(rows * MatrixRowBytes(desc.type, cols));
  QuantizeRowRef(desc, wf.data(), rows * cols, bytes.data());
  const Matrix w{.type = desc.type, .data = bytes.data(), .rows = rows, .cols = cols};
  std::vector<QuantizedProductReference> ref(rows);
  MatVecQuantizedReference(w, x.data(), ref.data());
  std::vector<double> tol(rows);
  for (int64_t r = 0; r < rows; ++r) tol[r] = test::QuantTolerance(cols, ref[r].abs_sum, desc.matvec_roundings);
  // The correct decoding here is the reference itself (a check on the helper).
  const std::vector<double> right = QuantizedProduct(w, Decode(l, offset, [](int i) { return i; }, false, 1.0), x);
  for (int64_t r = 0; r < rows; ++r) ASSERT_LE(std::fabs(right[r] - ref[r].y), tol[r]) << "row " << r;
  for (const auto& [what, decode] : wrong) {
    SCOPED_TRACE(what);
    const std::vector<double> y = QuantizedProduct(w, decode, x);
    for (int64_t r = 0; r < rows; ++r) EXPECT_GT(std::fabs(y[r] - ref[r].y), tol[r]) << "row " << r;
  }
  // Every target's kernels are inside the same tolerance.
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    test::TargetScope scope(target);
    SCOPED_TRACE(hwy::TargetName(target));
    std::vector<float> y(rows);
    MatVec(w, x.data(), y.data(), ThreadPool::Shared(1));
    for (int64_t r = 0; r < rows; ++r) ASSERT_LE(std::fabs(y[r] - ref[r].y), tol[r]) << "row " << r;
  }
}

const auto kReversed = [](int i) { return i < 16 ? 15 - i : 47 - i; };  // qh bits reversed per half
const auto kSwapped = [](int i) { return i ^ 16; };                     // qh halves swapped
const auto kDropped = [](int) { return -1; };                           // no 5th bit
const auto kRight = [](int i) { return i; };

TEST(LegacyKernels, WrongDecodingsOfQ4_1AreOutsideTheTolerance) {
  const Layout l{0, 2, -1, 4};
  ExpectWrongDecodingsCaught("q4_1", l, 0,
                             {{"nibble halves swapped", Decode(l, 0, kRight, true, 1.0)},
                              {"min dropped", Decode(l, 0, kRight, false, 0.0)},
                              {"min negated", Decode(l, 0, kRight, false, -1.0)}});
}

TEST(LegacyKernels, WrongDecodingsOfQ5_0AreOutsideTheTolerance) {
  const Layout l{0, -1, 2, 6};
  ExpectWrongDecodingsCaught("q5_0", l, 16,
                             {{"qh bits reversed", Decode(l, 16, kReversed, false, 1.0)},
                              {"qh halves swapped", Decode(l, 16, kSwapped, false, 1.0)},
                              {"5th bit dropped", Decode(l, 16, kDropped, false, 1.0)},
                              {"nibble halves swapped", Decode(l, 16, kRight, true, 1.0)}});
}

TEST(LegacyKernels, WrongDecodingsOfQ5_1AreOutsideTheTolerance) {
  const Layout l{0, 2, 4, 8};
  ExpectWrongDecodingsCaught("q5_1", l, 0,
                             {{"qh bits reversed", Decode(l, 0, kReversed, false, 1.0)},
                              {"qh halves swapped", Decode(l, 0, kSwapped, false, 1.0)},
                              {"5th bit dropped", Decode(l, 0, kDropped, false, 1.0)},
                              {"nibble halves swapped", Decode(l, 0, kRight, true, 1.0)},
                              {"min dropped", Decode(l, 0, kRight, false, 0.0)},
                              {"min negated", Decode(l, 0, kRight, false, -1.0)}});
}

}  // namespace
}  // namespace kvq
