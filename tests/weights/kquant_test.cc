// K-quant weight types (Q2_K .. Q6_K) beyond the conformance suite: the reference quantisers
// round-trip within a bound derived from their definitions and use the whole code range, and the
// matvec tolerance catches the layout bugs a kernel could have (wrong nibble or bit order, a
// sub-block's scale applied to its neighbour): the kernel run on bytes so permuted is outside the
// tolerance of the true block's reference on every row.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "test_util/matvec_bounds.h"
#include "weights/kquant.h"
#include "weights/matvec.h"
#include "weights/weight_type.h"

namespace kvq {
namespace {

const WeightTypeDesc& Type(const char* name) { return **FindWeightTypeByName(name); }

std::vector<float> Normal(int64_t n, uint32_t seed, float scale = 1.0f, float shift = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = scale * normal(rng) + shift;
  return x;
}

// Per type: the largest |x − decoded| its quantiser allows for element e of a block quantised from
// x, derived from the block's own scales (so the f16 rounding of d and dmin, and a scale clamped
// to its range, are accounted for), and its code range.
struct Bound {
  const char* type;
  std::function<double(const uint8_t* block, const float* x, int e)> max_error;
  int code_min, code_max;  // the code range the quantiser must reach on N(0, 1) data
  std::function<int(const uint8_t* block, int e)> code;
};

float Half(const uint8_t* p) { return KQuantHalf(p); }

std::vector<Bound> Bounds() {
  std::vector<Bound> out;
  // Q4_K (q4_k.h), sub-block [lo, hi] (lo ≤ 0), step s = d·sc, offset o = dmin·m: the code is
  // nearest((x + o)/s) clamped to [0, 15], so an unclamped one errs by ≤ s/2, one clamped at 15
  // by ≤ hi + o − 15·s, at 0 by ≤ −(lo + o).
  out.push_back({"q4_k",
                 [](const uint8_t* b, const float* x, int e) {
                   uint8_t sc[8], m[8];
                   KQuantScalesMins6(b + 4, sc, m);
                   const int j = e / 32;
                   const double s = static_cast<double>(Half(b)) * sc[j], o = static_cast<double>(Half(b + 2)) * m[j];
                   const float lo = std::min(0.0f, *std::min_element(x + 32 * j, x + 32 * j + 32));
                   const float hi = *std::max_element(x + 32 * j, x + 32 * j + 32);
                   return std::max({s / 2, hi + o - 15 * s, -(lo + o)});
                 },
                 0, 15,
                 [](const uint8_t* b, int e) {
                   const uint8_t byte = b[16 + 32 * (e / 64) + e % 32];
                   return e % 64 < 32 ? byte & 15 : byte >> 4;
                 }});
  // Q6_K (q6_k.h), sub-block of 16 with largest magnitude a, step s = |d·sc|: the code is
  // nearest(x/(d·sc)) clamped to [−32, 31], so an unclamped one errs by ≤ s/2 and a clamped one
  // (decoded with x's sign and magnitude ≥ 31·s) by ≤ a − 31·s.
  out.push_back({"q6_k",
                 [](const uint8_t* b, const float* x, int e) {
                   const int j = e / 16;
                   const double s = std::fabs(static_cast<double>(Half(b + 208)) * static_cast<int8_t>(b[192 + j]));
                   float a = 0.0f;
                   for (int l = 0; l < 16; ++l) a = std::max(a, std::fabs(x[16 * j + l]));
                   return std::max(s / 2, a - 31 * s);
                 },
                 0, 63,
                 [](const uint8_t* b, int e) {
                   const int h = e / 128, k = (e % 128) / 32, l = e % 32;
                   const uint8_t low = b[64 * h + 32 * (k % 2) + l];
                   return (k < 2 ? low & 15 : low >> 4) | ((b[128 + 32 * h + l] >> (2 * k)) & 3) << 4;
                 }});
  // Q5_K: as Q4_K with codes in [0, 31] (q5_k.h).
  out.push_back({"q5_k",
                 [](const uint8_t* b, const float* x, int e) {
                   uint8_t sc[8], m[8];
                   KQuantScalesMins6(b + 4, sc, m);
                   const int j = e / 32;
                   const double s = static_cast<double>(Half(b)) * sc[j], o = static_cast<double>(Half(b + 2)) * m[j];
                   const float lo = std::min(0.0f, *std::min_element(x + 32 * j, x + 32 * j + 32));
                   const float hi = *std::max_element(x + 32 * j, x + 32 * j + 32);
                   return std::max({s / 2, hi + o - 31 * s, -(lo + o)});
                 },
                 0, 31,
                 [](const uint8_t* b, int e) {
                   const int c = e / 64, l = e % 32;
                   const bool high = e % 64 >= 32;
                   const uint8_t byte = b[48 + 32 * c + l];
                   return (high ? byte >> 4 : byte & 15) | ((b[16 + l] >> (2 * c + (high ? 1 : 0))) & 1) << 4;
                 }});
  // Q3_K: as Q6_K with codes in [−4, 3] (q3_k.h): a clamped code errs by ≤ a − 3·s.
  out.push_back({"q3_k",
                 [](const uint8_t* b, const float* x, int e) {
                   uint8_t u[16];
                   KQuantScales6x16(b + 96, u);
                   const int j = e / 16;
                   const double s = std::fabs(static_cast<double>(Half(b + 108)) * (u[j] - 32));
                   float a = 0.0f;
                   for (int l = 0; l < 16; ++l) a = std::max(a, std::fabs(x[16 * j + l]));
                   return std::max(s / 2, a - 3 * s);
                 },
                 -4, 3,
                 [](const uint8_t* b, int e) {
                   const int h = e / 128, k = (e % 128) / 32, l = e % 32;
                   return ((b[32 + 32 * h + l] >> (2 * k)) & 3) - (((b[l] >> (4 * h + k)) & 1) != 0 ? 0 : 4);
                 }});
  // Q2_K: as Q4_K over sub-blocks of 16 with codes in [0, 3] (q2_k.h).
  out.push_back({"q2_k",
                 [](const uint8_t* b, const float* x, int e) {
                   const int j = e / 16;
                   const double s = static_cast<double>(Half(b + 80)) * (b[j] & 15);
                   const double o = static_cast<double>(Half(b + 82)) * (b[j] >> 4);
                   const float lo = std::min(0.0f, *std::min_element(x + 16 * j, x + 16 * j + 16));
                   const float hi = *std::max_element(x + 16 * j, x + 16 * j + 16);
                   return std::max({s / 2, hi + o - 3 * s, -(lo + o)});
                 },
                 0, 3,
                 [](const uint8_t* b, int e) {
                   const int h = e / 128, k = (e % 128) / 32, l = e % 32;
                   return (b[16 + 32 * h + l] >> (2 * k)) & 3;
                 }});
  return out;
}

TEST(KQuantQuantiser, RoundTripsWithinItsBoundAndUsesTheWholeCodeRange) {
  for (const Bound& bound : Bounds()) {
    const WeightTypeDesc& d = Type(bound.type);
    SCOPED_TRACE(d.label);
    std::vector<uint8_t> block(d.block_bytes);
    std::vector<float> out(256);
    int lo = 1 << 20, hi = -(1 << 20);
    for (int trial = 0; trial < 300; ++trial) {
      const float scale = trial % 3 == 0 ? 1e-3f : trial % 3 == 1 ? 1.0f : 300.0f;
      const std::vector<float> x = Normal(256, 100 + trial, scale, trial % 5 == 0 ? scale : 0.0f);
      d.quantize_block_ref(x.data(), block.data());
      d.dequantize_block_ref(block.data(), out.data());
      float amax = 0.0f;
      for (float v : x) amax = std::max(amax, std::fabs(v));
      for (int e = 0; e < 256; ++e) {
        // The f32 arithmetic of quantiser and decoder adds a few ulps of the block's magnitude.
        const double allowed = bound.max_error(block.data(), x.data(), e) * (1 + 0x1p-10) + 1e-6 * amax;
        ASSERT_LE(std::fabs(x[e] - out[e]), allowed) << "trial " << trial << " element " << e;
        lo = std::min(lo, bound.code(block.data(), e));
        hi = std::max(hi, bound.code(block.data(), e));
      }
    }
    EXPECT_EQ(lo, bound.code_min);
    EXPECT_EQ(hi, bound.code_max);
  }
}

// A layout bug, as a permutation of a block's bytes: the kernel on the permuted bytes computes
// what a kernel with that bug would compute on the true ones.
struct Bug {
  const char* type;
  const char* what;
  std::function<void(uint8_t* block)> apply;
};

std::vector<Bug> Bugs() {
  return {
      {"q4_k", "low and high nibbles swapped",
       [](uint8_t* b) {
         for (int i = 16; i < 144; ++i) b[i] = static_cast<uint8_t>(b[i] << 4 | b[i] >> 4);
       }},
      {"q4_k", "sub-block 0 and 1 scales swapped", [](uint8_t* b) { std::swap(b[4], b[5]); }},
      {"q4_k", "scales and mins swapped", [](uint8_t* b) { std::swap(b[0], b[2]), std::swap(b[1], b[3]); }},
      {"q6_k", "qh bit pairs 0-1 and 2-3 swapped",
       [](uint8_t* b) {
         for (int i = 128; i < 192; ++i) b[i] = static_cast<uint8_t>((b[i] & 0xF0) | (b[i] & 3) << 2 | (b[i] >> 2 & 3));
       }},
      {"q6_k", "the two ql halves of each 64 swapped",
       [](uint8_t* b) {
         for (int h = 0; h < 2; ++h) {
           for (int l = 0; l < 32; ++l) std::swap(b[64 * h + l], b[64 * h + 32 + l]);
         }
       }},
      {"q6_k", "sub-block 0 and 1 scales swapped", [](uint8_t* b) { std::swap(b[192], b[193]); }},
      {"q5_k", "5th bits of the low and high nibbles swapped",
       [](uint8_t* b) {
         for (int i = 16; i < 48; ++i) b[i] = static_cast<uint8_t>((b[i] & 0xAA) >> 1 | (b[i] & 0x55) << 1);
       }},
      {"q5_k", "low and high nibbles swapped",
       [](uint8_t* b) {
         for (int i = 48; i < 176; ++i) b[i] = static_cast<uint8_t>(b[i] << 4 | b[i] >> 4);
       }},
      {"q3_k", "hmask bits of halves swapped",
       [](uint8_t* b) {
         for (int i = 0; i < 32; ++i) b[i] = static_cast<uint8_t>(b[i] << 4 | b[i] >> 4);
       }},
      {"q3_k", "qs 2-bit fields 0 and 1 swapped",
       [](uint8_t* b) {
         for (int i = 32; i < 96; ++i) b[i] = static_cast<uint8_t>((b[i] & 0xF0) | (b[i] & 3) << 2 | (b[i] >> 2 & 3));
       }},
      {"q3_k", "the low 4 bits of sub-block scales 0 and 1 swapped",
       [](uint8_t* b) {
         const uint8_t u0 = b[96] & 0x0F, u1 = b[97] & 0x0F;
         b[96] = static_cast<uint8_t>((b[96] & 0xF0) | u1);
         b[97] = static_cast<uint8_t>((b[97] & 0xF0) | u0);
       }},
      {"q2_k", "scale and min nibbles swapped",
       [](uint8_t* b) {
         for (int i = 0; i < 16; ++i) b[i] = static_cast<uint8_t>(b[i] << 4 | b[i] >> 4);
       }},
      {"q2_k", "sub-block 0 and 1 scales swapped", [](uint8_t* b) { std::swap(b[0], b[1]); }},
      {"q2_k", "qs 2-bit fields 0 and 1 swapped",
       [](uint8_t* b) {
         for (int i = 16; i < 80; ++i) b[i] = static_cast<uint8_t>((b[i] & 0xF0) | (b[i] & 3) << 2 | (b[i] >> 2 & 3));
       }},
  };
}

TEST(KQuantKernels, TheToleranceCatchesLayoutBugs) {
  constexpr int64_t kRows = 8, kCols = 1024;
  for (const Bug& bug : Bugs()) {
    const WeightTypeDesc& d = Type(bug.type);
    SCOPED_TRACE(::testing::Message() << d.label << ": " << bug.what);
    const int64_t row_bytes = MatrixRowBytes(d.type, kCols);
    std::vector<uint8_t> bytes(kRows * row_bytes);
    const std::vector<float> w = Normal(kRows * kCols, 5);
    QuantizeRowRef(d, w.data(), kRows * kCols, bytes.data());
    const std::vector<float> x = Normal(kCols, 6);
    const Matrix good{.type = d.type, .data = bytes.data(), .rows = kRows, .cols = kCols};
    std::vector<QuantizedProductReference> ref(kRows);
    MatVecQuantizedReference(good, x.data(), ref.data());
    std::vector<float> y(kRows);
    MatVec(good, x.data(), y.data(), ThreadPool::Shared(1));  // the true kernel is within the tolerance
    std::vector<uint8_t> wrong = bytes;
    for (int64_t b = 0; b < kRows * kCols / 256; ++b) bug.apply(wrong.data() + b * d.block_bytes);
    std::vector<float> y_bug(kRows);
    MatVec(Matrix{.type = d.type, .data = wrong.data(), .rows = kRows, .cols = kCols}, x.data(), y_bug.data(), ThreadPool::Shared(1));
    for (int64_t r = 0; r < kRows; ++r) {
      const double tol = test::QuantTolerance(kCols, ref[r].abs_sum, d.matvec_roundings);
      EXPECT_LE(std::fabs(y[r] - ref[r].y), tol) << "row " << r;
      EXPECT_GT(std::fabs(y_bug[r] - ref[r].y), tol) << "row " << r;
    }
  }
}

}  // namespace
}  // namespace kvq
