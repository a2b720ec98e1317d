// Q1_0 and Q2_0 beyond the registry-wide conformance suite: the kernels on arbitrary bytes (every
// sign pattern, Q2_0's code 3 which the reference quantiser never writes, scales of both signs),
// a deliberately wrong decoding of each (bit order, code 3, an activation block's scale) shown to
// miss the tolerance the kernels meet, the reference quantisers' rules, and DecodeWeightRow.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL  // as the weight kernels, so the target list below includes AVX3_DL
#endif
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "base/float_codes.h"
#include "test_util/matvec_bounds.h"
#include "weights/matvec.h"
#include "weights/weight_type.h"

namespace kvq {
namespace {

using test::QuantTolerance;
using test::TargetScope;

const WeightTypeDesc& Type(const char* name) { return **FindWeightTypeByName(name); }

float HalfAt(const uint8_t* block) { return F16ToF32(static_cast<uint16_t>(block[0] | block[1] << 8)); }

// rows × cols of random bytes: codes uniform over every byte value, scales f16 of both signs with
// exponents 2^-6 .. 2^2 (finite, normal).
std::vector<uint8_t> RandomBytes(const WeightTypeDesc& d, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255), exponent(9, 17);
  std::vector<uint8_t> out(rows * MatrixRowBytes(d.type, cols));
  for (size_t at = 0; at < out.size(); at += d.block_bytes) {
    const uint16_t h = static_cast<uint16_t>((byte(rng) & 1) << 15 | exponent(rng) << 10 | (byte(rng) << 2));
    out[at] = static_cast<uint8_t>(h), out[at + 1] = static_cast<uint8_t>(h >> 8);
    for (int64_t k = 2; k < d.block_bytes; ++k) out[at + k] = static_cast<uint8_t>(byte(rng));
  }
  return out;
}

// A quantised product like MatVecQuantizedReference's y, with weights from `weight(block, j)` and
// the scale of activation block b taken from `dx_of(b)`: for the deliberately wrong variants.
double VariantProduct(const Matrix& w, int64_t row, const std::vector<int8_t>& q, const std::vector<float>& dx,
                      const std::function<double(const uint8_t*, int64_t)>& weight,
                      const std::function<int64_t(int64_t)>& dx_of) {
  const WeightTypeDesc& d = *FindWeightType(w.type);
  const uint8_t* base = w.data + row * MatrixRowBytes(w.type, w.cols);
  double y = 0;
  for (int64_t b = 0; b < w.cols / 32; ++b) {
    double dot = 0;
    for (int64_t i = 32 * b; i < 32 * (b + 1); ++i) {
      dot += weight(base + i / d.block_elems * d.block_bytes, i % d.block_elems) * q[i];
    }
    y += static_cast<double>(dx[dx_of(b)]) * dot;
  }
  return y;
}

struct Variant {
  const char* what;
  std::function<double(const uint8_t*, int64_t)> weight;
  std::function<int64_t(int64_t)> dx_of;
};

// Every target's kernel on random bytes is within the matvec.h bound of the quantised reference;
// each wrong variant is outside it on some row (so the bound can tell them apart).
void CheckKernelsAndVariants(const WeightTypeDesc& d, const std::vector<Variant>& variants) {
  uint32_t seed = 100;
  for (int64_t rows : {1, 4, 5, 11}) {
    // 384, 1152, 1920: Q1_0 rows ending in a partial group of 3, 1, 3 weight blocks (the AVX3_DL
    // kernel takes four at a time, masked at a row's end).
    for (int64_t cols : {128, 256, 384, 1152, 1920, 4096}) {
      SCOPED_TRACE(::testing::Message() << d.label << " " << rows << "x" << cols);
      std::vector<uint8_t> bytes = RandomBytes(d, rows, cols, seed++);
      const Matrix w{.type = d.type, .data = bytes.data(), .rows = rows, .cols = cols};
      std::mt19937 rng(seed++);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> x(cols);
      for (float& v : x) v = normal(rng);
      std::vector<QuantizedProductReference> ref(rows);
      MatVecQuantizedReference(w, x.data(), ref.data());
      std::vector<int8_t> q(cols);
      std::vector<float> dx(cols / 32);
      QuantizeActivationReference(x.data(), cols, q.data(), dx.data());
      std::vector<double> tol(rows);
      for (int64_t r = 0; r < rows; ++r) tol[r] = QuantTolerance(cols, ref[r].abs_sum, d.matvec_roundings);
      for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
        TargetScope scope(target);
        SCOPED_TRACE(hwy::TargetName(target));
        std::vector<float> y(rows, NAN);
        MatVec(w, x.data(), y.data(), ThreadPool::Shared(1));
        for (int64_t r = 0; r < rows; ++r) {
          ASSERT_LE(std::fabs(y[r] - ref[r].y), tol[r]) << "row " << r << ": kernel " << y[r] << " ref " << ref[r].y;
        }
      }
      if (cols == 128) continue;  // a Q1_0 row of one block: a wrong activation scale may pick itself
      for (const Variant& v : variants) {
        bool caught = false;
        for (int64_t r = 0; r < rows && !caught; ++r) {
          caught = std::fabs(VariantProduct(w, r, q, dx, v.weight, v.dx_of) - ref[r].y) > tol[r];
        }
        EXPECT_TRUE(caught) << v.what << " is within the tolerance on every row";
      }
    }
  }
}

TEST(Q1_0, KernelsOnArbitraryBytesAndWrongVariants) {
  const auto bit = [](const uint8_t* block, int64_t j) { return block[2 + j / 8] >> (j % 8) & 1; };
  const auto same = [](int64_t b) { return b; };
  CheckKernelsAndVariants(
      Type("q1_0"),
      {{"most significant bit first",
        [](const uint8_t* block, int64_t j) { return (block[2 + j / 8] >> (7 - j % 8) & 1 ? 1.0 : -1.0) * HalfAt(block); },
        same},
       {"bit set -> -d", [&](const uint8_t* block, int64_t j) { return (bit(block, j) ? -1.0 : 1.0) * HalfAt(block); },
        same},
       {"activation blocks 0 and 1 of each weight block swapping scales",
        [&](const uint8_t* block, int64_t j) { return (bit(block, j) ? 1.0 : -1.0) * HalfAt(block); },
        [](int64_t b) { return b % 4 == 0 ? b + 1 : b % 4 == 1 ? b - 1 : b; }}});
}

TEST(Q2_0, KernelsOnArbitraryBytesAndWrongVariants) {
  const auto code = [](const uint8_t* block, int64_t j) { return block[2 + j / 4] >> (2 * (j % 4)) & 3; };
  const auto same = [](int64_t b) { return b; };
  CheckKernelsAndVariants(
      Type("q2_0"),
      {{"code 3 as -2 (a signed 2-bit code)",
        [&](const uint8_t* block, int64_t j) {
          const int c = code(block, j);
          return (c == 3 ? -2.0 : c - 1.0) * HalfAt(block);
        },
        same},
       {"codes high bits first",
        [](const uint8_t* block, int64_t j) {
          return ((block[2 + j / 4] >> (6 - 2 * (j % 4)) & 3) - 1.0) * HalfAt(block);
        },
        same},
       {"the two activation blocks swapping scales",
        [&](const uint8_t* block, int64_t j) { return (code(block, j) - 1.0) * HalfAt(block); },
        [](int64_t b) { return b ^ 1; }}});
}

TEST(Q1_0, ReferenceQuantiserMeanMagnitudeAndSignRule) {
  const WeightTypeDesc& d = Type("q1_0");
  std::vector<float> x(128, 0.5f);
  x[0] = 0.0f, x[1] = -0.0f, x[2] = -2.5f, x[3] = -0.5f, x[127] = -0.5f;
  std::vector<uint8_t> block(18);
  d.quantize_block_ref(x.data(), block.data());
  // Σ|x| = 0 + 0 + 2.5 + 0.5 + 123·0.5 + 0.5 = 65, mean 65/128 = 0.5078125 (exact in f16: 0x3810).
  EXPECT_EQ(HalfAt(block.data()), 0.5078125f);
  // Element 0 (+0) and 1 (−0) count as x ≥ 0: bits set; 2, 3 negative: clear; 4..7 positive.
  EXPECT_EQ(block[2], 0xF3);
  EXPECT_EQ(block[17], 0x7F);  // element 127 negative
  for (int k = 3; k < 17; ++k) EXPECT_EQ(block[k], 0xFF) << k;
  // A NaN element: bit clear (x ≥ 0 is false).
  std::vector<float> y(128, 1.0f);
  y[5] = std::numeric_limits<float>::quiet_NaN();
  d.quantize_block_ref(y.data(), block.data());
  EXPECT_EQ(block[2], 0xDF);
}

TEST(Q2_0, ReferenceQuantiserIsTernaryAroundMaxMagnitude) {
  const WeightTypeDesc& d = Type("q2_0");
  std::vector<float> x(64, 0.0f);
  // amax 2: 2 -> +1 (code 2), −2 -> −1 (code 0), ±1 (exactly half) -> ±1 (ties away from zero),
  // 0.99 -> 0 (code 1), −0.99 -> 0.
  x[0] = 2.0f, x[1] = -2.0f, x[2] = 1.0f, x[3] = -1.0f, x[4] = 0.99f, x[5] = -0.99f, x[63] = -1.5f;
  std::vector<uint8_t> block(18);
  d.quantize_block_ref(x.data(), block.data());
  EXPECT_EQ(HalfAt(block.data()), 2.0f);
  EXPECT_EQ(block[2], 2 | 0 << 2 | 2 << 4 | 0 << 6);
  EXPECT_EQ(block[3], 1 | 1 << 2 | 1 << 4 | 1 << 6);
  EXPECT_EQ(block[17], 1 | 1 << 2 | 1 << 4 | 0 << 6);  // −1.5 -> −1
  // The reference never writes code 3.
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int trial = 0; trial < 200; ++trial) {
    for (float& v : x) v = normal(rng);
    d.quantize_block_ref(x.data(), block.data());
    for (int k = 2; k < 18; ++k) {
      for (int c = 0; c < 4; ++c) ASSERT_NE(block[k] >> (2 * c) & 3, 3);
    }
  }
  // All zeros: d = 0, every code 1 (weight 0).
  std::fill(x.begin(), x.end(), 0.0f);
  d.quantize_block_ref(x.data(), block.data());
  EXPECT_EQ(HalfAt(block.data()), 0.0f);
  for (int k = 2; k < 18; ++k) EXPECT_EQ(block[k], 0x55);
}

// DecodeWeightRow (the embedding lookup) of a row of several blocks is each block's decode, and
// each value is ±d (Q1_0) or (code − 1)·d (Q2_0) read off the bytes here.
TEST(Q1_0Q2_0, DecodeWeightRowIsTheBlocksBitForBit) {
  for (const char* name : {"q1_0", "q2_0"}) {
    const WeightTypeDesc& d = Type(name);
    SCOPED_TRACE(d.label);
    const int64_t rows = 3, cols = 2048;
    std::vector<uint8_t> bytes = RandomBytes(d, rows, cols, 9);
    const Matrix w{.type = d.type, .data = bytes.data(), .rows = rows, .cols = cols};
    std::vector<float> row(cols);
    DecodeWeightRow(w, 2, row.data());
    const uint8_t* base = bytes.data() + 2 * MatrixRowBytes(d.type, cols);
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t* block = base + c / d.block_elems * d.block_bytes;
      const int64_t j = c % d.block_elems;
      const float scale = HalfAt(block);
      const float want = d.block_elems == 128 ? ((block[2 + j / 8] >> (j % 8) & 1) != 0 ? scale : -scale)
                                              : scale * static_cast<float>((block[2 + j / 4] >> (2 * (j % 4)) & 3) - 1);
      ASSERT_EQ(std::memcmp(&row[c], &want, 4), 0) << "column " << c;
    }
  }
}

}  // namespace
}  // namespace kvq
