// MatVec, part 2: the Q8_0/Q4_0 path with the activation quantised per block of 32 (matvec.h,
// "Numerics, Q8_0/Q4_0").
//   - QuantizeActivation on hand-built blocks (ties to even, zero and non-finite blocks), and
//     equal bit for bit to QuantizeActivationReference on every SIMD target;
//   - hand-built weight and activation blocks whose integer dot products are worked out by hand,
//     through BlockDotReference and through MatVec on every target (exact: powers-of-two scales);
//   - MatVec on every target within the f32 rounding bound of the quantised reference, identical
//     bits for 1..4 threads, MatMul equal to MatVec per token;
//   - the bound from quantising x against the unquantised product, and that it is tight.
//
// The rounding bound. I_b and its lane partials are exact integers; each term d_w·d_x·partial is
// rounded at most n_blocks + 4 times (matvec.h), so |simd − Σ_b d_w·d_x·I_b| ≤ γ_{n_blocks+4}·A,
// A = Σ_b |d_w·d_x|·Σ_i |code_i·q_i|, γ_n = n·u/(1 − n·u), u = 2^-24. The reference sums in
// double: its own error is at most γ'_{n_blocks+1}·A with u' = 2^-53. The tolerance is the sum.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL  // as matvec.cc, so the target list below includes AVX3_DL
#endif
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/float_codes.h"
#include "weights/matvec.h"
#include "weights/repack.h"
#include "weights/weight_type.h"
#include "test_util/target_scope.h"

namespace kvq {
namespace {

constexpr double kU = 0x1p-24;   // unit roundoff of f32
constexpr double kUd = 0x1p-53;  // unit roundoff of double
constexpr float kInf = std::numeric_limits<float>::infinity();

using test::TargetScope;  // test_util/target_scope.h

void PutU16(std::vector<uint8_t>& bytes, uint16_t v) {  // little-endian, as in a GGUF file
  bytes.push_back(static_cast<uint8_t>(v & 0xFF));
  bytes.push_back(static_cast<uint8_t>(v >> 8));
}

struct Stored {
  std::vector<uint8_t> bytes;
  Matrix m;
};

Stored FromBytes(WeightType type, std::vector<uint8_t> bytes, int64_t rows, int64_t cols) {
  Stored s{std::move(bytes), {}};
  EXPECT_EQ(static_cast<int64_t>(s.bytes.size()), rows * MatrixRowBytes(type, cols));
  s.m = Matrix{.type = type, .data = s.bytes.data(), .rows = rows, .cols = cols};
  return s;
}

// Random codes (every byte value) and scales of either sign in [0.002, 0.05].
Stored RandomBlockMatrix(WeightType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> scale(0.002f, 0.05f);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> bytes;
  bytes.reserve(rows * MatrixRowBytes(type, cols));
  const int64_t n = FindWeightType(type)->block_bytes - 2;  // code bytes after the f16 scale
  for (int64_t b = 0; b < rows * cols / 32; ++b) {
    PutU16(bytes, F32ToF16(byte(rng) < 128 ? scale(rng) : -scale(rng)));
    for (int64_t i = 0; i < n; ++i) bytes.push_back(static_cast<uint8_t>(byte(rng)));
  }
  return FromBytes(type, std::move(bytes), rows, cols);
}

std::vector<float> RandomVector(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

double Gamma(int64_t n, double u) { return n * u / (1.0 - n * u); }

// |MatVec − reference.y| allowed (see the file comment).
double RoundingTolerance(int64_t cols, const QuantizedProductReference& ref) {
  const int64_t n_blocks = cols / 32;
  return (Gamma(n_blocks + 4, kU) + Gamma(cols + n_blocks, kUd)) * ref.abs_sum;
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// The registry's quantised-activation types.
const std::vector<WeightType> kBlockTypes = [] {
  std::vector<WeightType> out;
  for (const WeightTypeDesc& d : WeightTypes()) {
    // The hand-built cases below write Q8_0 and Q4_0 bytes; every other quantised-activation type
    // gets the same checks, on blocks from its own quantiser, in weight_type_conformance_test.cc.
    if (d.type == WeightType::kQ8_0 || d.type == WeightType::kQ4_0) out.push_back(d.type);
  }
  return out;
}();

// ---- 1. Activation quantisation ----

TEST(QuantizeActivation, HandBuiltBlocks) {
  std::vector<float> x(6 * 32, 0.0f);
  std::vector<int8_t> want_q(6 * 32, 0);
  // Block 0: amax 63.5 -> d = 0.5; q = RNE(x / 0.5).
  // x/d: 127, 2.5 -> 2, 3.5 -> 4, −0.5 -> −0, −1.5 -> −2, 0.4, −127, 20, 0.52, −63.5 -> −64,
  // 62.5 -> 62, −0.6 (ties go to the even neighbour).
  const float x0[12] = {63.5f, 1.25f, 1.75f,  -0.25f, -0.75f, 0.2f,
                        -63.5f, 10.0f, 0.26f, -31.75f, 31.25f, -0.3f};
  const int8_t q0[12] = {127, 2, 4, 0, -2, 0, -127, 20, 1, -64, 62, -1};
  for (int i = 0; i < 12; ++i) {
    x[i] = x0[i];
    want_q[i] = q0[i];
  }
  // Block 1: all zeros -> d = 0, q = 0. Block 2 holds an inf, block 3 a NaN: d = NaN, q = 0.
  x[64 + 5] = kInf;
  x[64 + 6] = 1.0f;
  x[96 + 31] = std::numeric_limits<float>::quiet_NaN();
  x[96 + 0] = 2.0f;
  // Block 4: amax 15.875 = 127/8 -> d = 0.125; 0.0625 -> 0.5 -> 0, 0.1875 -> 1.5 -> 2, −0.3125 ->
  // −2.5 -> −2.
  x[128 + 3] = -15.875f;
  x[128 + 4] = 0.0625f;
  x[128 + 5] = 0.1875f;
  x[128 + 6] = -0.3125f;
  want_q[128 + 3] = -127;
  want_q[128 + 5] = 2;
  want_q[128 + 6] = -2;
  // Block 5: amax 127 -> d = 1, integers kept: x_i = i − 16 for i < 31, x_31 = 127.
  for (int i = 0; i < 32; ++i) {
    x[160 + i] = i < 31 ? static_cast<float>(i - 16) : 127.0f;
    want_q[160 + i] = static_cast<int8_t>(i < 31 ? i - 16 : 127);
  }
  const float want_d[6] = {0.5f, 0.0f, NAN, NAN, 0.125f, 1.0f};

  auto check = [&](const std::vector<int8_t>& q, const std::vector<float>& d, const char* who) {
    for (int b = 0; b < 6; ++b) {
      if (std::isnan(want_d[b])) {
        EXPECT_TRUE(std::isnan(d[b])) << who << " block " << b << ": d " << d[b];
      } else {
        EXPECT_EQ(d[b], want_d[b]) << who << " block " << b;
      }
    }
    for (int i = 0; i < 6 * 32; ++i) EXPECT_EQ(q[i], want_q[i]) << who << " element " << i << " x " << x[i];
  };
  std::vector<int8_t> q(x.size());
  std::vector<float> d(6);
  QuantizeActivationReference(x.data(), 6 * 32, q.data(), d.data());
  check(q, d, "reference");
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    TargetScope scope(target);
    std::fill(q.begin(), q.end(), int8_t{99});
    QuantizeActivation(x.data(), 6 * 32, q.data(), d.data());
    check(q, d, hwy::TargetName(target));
  }
}

// Random blocks at magnitudes from 1e-38 to 1e30, plus blocks made of exact ties (k + ½)·d:
// every target gives the reference's bytes and scale bits.
TEST(QuantizeActivation, EveryTargetEqualsTheReferenceBitForBit) {
  std::vector<float> x;
  uint32_t seed = 7;
  for (float sigma : {1e-38f, 1e-30f, 1e-3f, 1.0f, 3e4f, 1e30f}) {
    const std::vector<float> v = RandomVector(32 * 64, seed++, sigma);
    x.insert(x.end(), v.begin(), v.end());
  }
  std::mt19937 rng(3);
  for (int b = 0; b < 64; ++b) {  // ties: amax 127·2^e, the rest (k + ½)·2^e
    const float unit = std::ldexp(1.0f, b % 20 - 10);
    x.push_back((b % 2 ? -127.0f : 127.0f) * unit);
    for (int i = 1; i < 32; ++i) {
      x.push_back((static_cast<float>(static_cast<int>(rng() % 253) - 126) + 0.5f) * unit);
    }
  }
  const int64_t cols = static_cast<int64_t>(x.size());
  std::vector<int8_t> ref_q(cols), q(cols);
  std::vector<float> ref_d(cols / 32), d(cols / 32);
  QuantizeActivationReference(x.data(), cols, ref_q.data(), ref_d.data());
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    TargetScope scope(target);
    QuantizeActivation(x.data(), cols, q.data(), d.data());
    for (int64_t b = 0; b < cols / 32; ++b) {
      ASSERT_TRUE(SameBits(d[b], ref_d[b])) << hwy::TargetName(target) << " block " << b;
    }
    for (int64_t i = 0; i < cols; ++i) {
      ASSERT_EQ(q[i], ref_q[i]) << hwy::TargetName(target) << " element " << i << " x " << x[i];
    }
  }
}

// ---- 2. Hand-built blocks with known integer dot products ----

// x for both matrices below: block 0 has amax 127 (d_x = 1, q = x), block 1 is constant.
std::vector<float> HandBuiltX(float block0_offset, float block1_value) {
  std::vector<float> x(64);
  for (int i = 0; i < 32; ++i) x[i] = i < 31 ? static_cast<float>(i) - block0_offset : 127.0f;
  for (int i = 32; i < 64; ++i) x[i] = block1_value;
  return x;
}

// MatVec on every target, MatVecQuantizedReference and BlockDotReference against hand values.
// The scales are powers of two and every dot product is below 2^19, so every f32 step is exact.
void ExpectHandBuilt(const Stored& w, const std::vector<float>& x, const int32_t (&want_dot)[2][2],
                     const float (&want_y)[2]) {
  std::vector<int8_t> q(64);
  std::vector<float> d(2);
  QuantizeActivationReference(x.data(), 64, q.data(), d.data());
  for (int r = 0; r < 2; ++r) {
    for (int b = 0; b < 2; ++b) {
      EXPECT_EQ(BlockDotReference(w.m, r, b, q.data()), want_dot[r][b]) << "row " << r << " block " << b;
    }
  }
  QuantizedProductReference ref[2];
  MatVecQuantizedReference(w.m, x.data(), ref);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(ref[r].y, want_y[r]) << "reference row " << r;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    TargetScope scope(target);
    float y[2] = {NAN, NAN};
    MatVec(w.m, x.data(), y, ThreadPool::Shared(1));
    for (int r = 0; r < 2; ++r) EXPECT_EQ(y[r], want_y[r]) << hwy::TargetName(target) << " row " << r;
  }
}

TEST(QuantizedMatVec, Q8_0HandBuiltIntegerDots) {
  // x: block 0 q_i = i (i < 31), q_31 = 127, d_x = 1; block 1 all −63.5 -> d_x = 0.5, q = −127.
  const std::vector<float> x = HandBuiltX(0.0f, -63.5f);
  std::vector<uint8_t> bytes;
  // Row 0, block 0: d = 1 (0x3C00), codes all 1: I = (0 + … + 30) + 127 = 465 + 127 = 592.
  PutU16(bytes, 0x3C00);
  for (int i = 0; i < 32; ++i) bytes.push_back(1);
  // Row 0, block 1: d = 0.25 (0x3400), codes −128 (even i), 127 (odd): I = −127·16·(−128 + 127) = 2032.
  PutU16(bytes, 0x3400);
  for (int i = 0; i < 32; ++i) bytes.push_back(static_cast<uint8_t>(i % 2 == 0 ? 0x80 : 0x7F));
  // Row 1, block 0: d = 2 (0x4000), codes all −128: I = −128·592 = −75776.
  PutU16(bytes, 0x4000);
  for (int i = 0; i < 32; ++i) bytes.push_back(0x80);
  // Row 1, block 1: d = −1 (0xBC00), codes i − 16: I = −127·Σ(i − 16) = −127·(−16) = 2032.
  PutU16(bytes, 0xBC00);
  for (int i = 0; i < 32; ++i) bytes.push_back(static_cast<uint8_t>(static_cast<int8_t>(i - 16)));
  const Stored w = FromBytes(WeightType::kQ8_0, std::move(bytes), 2, 64);
  // y0 = 1·1·592 + 0.25·0.5·2032 = 846; y1 = 2·1·(−75776) + (−1)·0.5·2032 = −152568.
  ExpectHandBuilt(w, x, {{592, 2032}, {-75776, 2032}}, {846.0f, -152568.0f});
}

TEST(QuantizedMatVec, Q4_0HandBuiltIntegerDots) {
  // x: block 0 q_i = i − 15 (i < 31), q_31 = 127, d_x = 1; block 1 all 63.5 -> d_x = 0.5, q = 127.
  const std::vector<float> x = HandBuiltX(15.0f, 63.5f);
  std::vector<uint8_t> bytes;
  // Row 0, block 0: d = 1, bytes 0x0F: elements 0..15 code 7 (low F), 16..31 code −8 (high 0):
  //   I = 7·Σ_{i<16}(i − 15) − 8·Σ_{16≤i<31}(i − 15) − 8·127 = 7·(−120) − 8·120 − 1016 = −2816.
  PutU16(bytes, 0x3C00);
  for (int j = 0; j < 16; ++j) bytes.push_back(0x0F);
  // Row 0, block 1: d = 0.5 (0x3800), bytes 0x00 (codes −8): I = −8·127·32 = −32512.
  PutU16(bytes, 0x3800);
  for (int j = 0; j < 16; ++j) bytes.push_back(0x00);
  // Row 1, block 0: d = −0.25 (0xB400), byte j = j | (15 − j) << 4: element j code j − 8,
  // element j + 16 code 7 − j:
  //   I = Σ_{j<16}(j − 8)(j − 15) + Σ_{j<15}(7 − j)(j + 1) + (−8)·127 = 400 − 280 − 1016 = −896.
  PutU16(bytes, 0xB400);
  for (int j = 0; j < 16; ++j) bytes.push_back(static_cast<uint8_t>(j | (15 - j) << 4));
  // Row 1, block 1: d = 4 (0x4400), bytes 0xFF (codes 7): I = 7·127·32 = 28448.
  PutU16(bytes, 0x4400);
  for (int j = 0; j < 16; ++j) bytes.push_back(0xFF);
  const Stored w = FromBytes(WeightType::kQ4_0, std::move(bytes), 2, 64);
  // y0 = 1·1·(−2816) + 0.5·0.5·(−32512) = −10944; y1 = −0.25·1·(−896) + 4·0.5·28448 = 57120.
  ExpectHandBuilt(w, x, {{-2816, -32512}, {-896, 28448}}, {-10944.0f, 57120.0f});
}

// The extremes of the integer dot: Q8_0 codes −128 against q = −127 everywhere (I = 32·128·127 =
// 520192, where AVX2's i16 pair sums reach 2·128·127 = 32512 of 32767) and Q4_0 codes −8.
TEST(QuantizedMatVec, LargestIntegerDots) {
  const std::vector<float> x(32, -127.0f);  // d_x = 1, q = −127
  std::vector<uint8_t> q8, q4;
  PutU16(q8, 0x3C00);
  for (int i = 0; i < 32; ++i) q8.push_back(0x80);
  PutU16(q4, 0x3C00);
  for (int j = 0; j < 16; ++j) q4.push_back(0x00);
  const Stored w8 = FromBytes(WeightType::kQ8_0, std::move(q8), 1, 32);
  const Stored w4 = FromBytes(WeightType::kQ4_0, std::move(q4), 1, 32);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    TargetScope scope(target);
    float y = 0;
    MatVec(w8.m, x.data(), &y, ThreadPool::Shared(1));
    EXPECT_EQ(y, 520192.0f) << hwy::TargetName(target);
    MatVec(w4.m, x.data(), &y, ThreadPool::Shared(1));
    EXPECT_EQ(y, 32512.0f) << hwy::TargetName(target);  // (−8)·(−127)·32
  }
}

// ---- 3. SIMD against the quantised reference ----

struct Shape {
  int64_t rows, cols;
};

std::vector<Shape> BlockShapes() {
  std::vector<Shape> shapes;
  for (int64_t rows : {1, 2, 3, 4, 5, 17, 64, 1000}) {
    for (int64_t cols : {32, 64, 96, 256, 4096}) shapes.push_back({rows, cols});
  }
  // 17 and 33 blocks: the kernels convert scales 16 blocks at a time; partial chunks.
  for (int64_t rows : {1, 5, 17}) {
    shapes.push_back({rows, 17 * 32});
    shapes.push_back({rows, 33 * 32});
  }
  // Rows fewer than the threads, with enough work (rows·cols ≥ 2^16) that MatVec asks for the
  // threads: one 16-row work item, so one thread computes it.
  for (int64_t rows : {2, 3}) shapes.push_back({rows, 32768});
  shapes.push_back({33, 2048});  // odd: 3 work items (16, 16, 1 rows) for 2..4 threads
  return shapes;
}

TEST(QuantizedMatVec, EveryTargetWithinTheRoundingBoundAndThreadIndependent) {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  std::string names;
  for (int64_t t : targets) names += std::string(" ") + hwy::TargetName(t);
  std::printf("targets:%s\n", names.c_str());
  uint32_t seed = 1;
  for (WeightType type : kBlockTypes) {
    double worst_ratio = 0.0;  // max |simd − ref| / tolerance
    for (const Shape& shape : BlockShapes()) {
      SCOPED_TRACE(::testing::Message() << WeightTypeName(type) << " " << shape.rows << "x" << shape.cols);
      const Stored w = RandomBlockMatrix(type, shape.rows, shape.cols, seed++);
      ASSERT_TRUE(CheckMatrix(w.m).ok()) << CheckMatrix(w.m).message();
      const std::vector<float> x = RandomVector(shape.cols, seed++);
      std::vector<QuantizedProductReference> ref(shape.rows);
      MatVecQuantizedReference(w.m, x.data(), ref.data());
      for (int64_t target : targets) {
        TargetScope scope(target);
        ASSERT_STREQ(MatVecTargetName(), hwy::TargetName(target));
        std::vector<float> y1(shape.rows, NAN);
        MatVec(w.m, x.data(), y1.data(), ThreadPool::Shared(1));
        for (int64_t r = 0; r < shape.rows; ++r) {
          const double tol = RoundingTolerance(shape.cols, ref[r]);
          const double err = std::fabs(static_cast<double>(y1[r]) - ref[r].y);
          ASSERT_LE(err, tol) << hwy::TargetName(target) << " row " << r << ": simd " << y1[r] << " ref "
                              << ref[r].y;
          if (tol > 0) worst_ratio = std::max(worst_ratio, err / tol);
        }
        for (int32_t threads = 2; threads <= 4; ++threads) {
          std::vector<float> yt(shape.rows, NAN);
          MatVec(w.m, x.data(), yt.data(), ThreadPool::Shared(threads));
          ASSERT_EQ(std::memcmp(y1.data(), yt.data(), 4 * shape.rows), 0)
              << hwy::TargetName(target) << ": 1 thread and " << threads << " threads differ";
        }
      }
    }
    std::printf("%-5s worst |simd - quantised ref| / rounding tolerance = %.3g\n", WeightTypeName(type),
                worst_ratio);
  }
}

TEST(QuantizedMatVec, MatMulEqualsMatVecPerToken) {
  uint32_t seed = 500;
  for (WeightType type : kBlockTypes) {
    for (const Shape& shape : {Shape{37, 256}, Shape{3, 32768}}) {
      const Stored w = RandomBlockMatrix(type, shape.rows, shape.cols, seed++);
      const int64_t n = 5;
      const std::vector<float> x = RandomVector(n * shape.cols, seed++);
      for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
        TargetScope scope(target);
        for (int32_t threads = 1; threads <= 4; ++threads) {
          std::vector<float> y(n * shape.rows, NAN), one(shape.rows, NAN);
          MatMul(w.m, x.data(), n, y.data(), ThreadPool::Shared(threads));
          for (int64_t t = 0; t < n; ++t) {
            MatVec(w.m, x.data() + t * shape.cols, one.data(), ThreadPool::Shared(threads));
            ASSERT_EQ(std::memcmp(y.data() + t * shape.rows, one.data(), 4 * shape.rows), 0)
                << WeightTypeName(type) << " " << hwy::TargetName(target) << " threads " << threads
                << " token " << t;
          }
        }
      }
    }
  }
}

// The targets whose kernels have no FMA (Highway's 128-bit and scalar targets: SSE4, WebAssembly's
// SIMD128, EMU128, SCALAR) run the row kernels' integer dots on vectors or in plain loops but the
// same f32 operations (quant_rows-inl.h, kquant_rows-inl.h), so every quantised-activation type in
// the registry gives the same bits on each of them, blocks from its own quantiser. The main build
// compiles one such target (SCALAR); the sanitizer build compiles SSE4 and EMU128. Q4_0's and
// Q8_0's rows there round as their 16-row groups do on every target (one fma per block), so the
// whole groups of a matrix give the groups' bits, which the best target here computes.
TEST(QuantizedMatVec, TargetsWithoutFmaGiveTheSameBits) {
  std::vector<int64_t> no_fma;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) {
    const std::string name = hwy::TargetName(t);
    if (name == "SSE4" || name == "SSSE3" || name == "WASM" || name == "EMU128" || name == "SCALAR") no_fma.push_back(t);
  }
  std::printf("targets without FMA compared:%s\n", no_fma.size() < 2 ? " (fewer than two here)" : "");
  for (int64_t t : no_fma) std::printf(" %s", hwy::TargetName(t));
  std::printf("\n");
  uint32_t seed = 900;
  for (const WeightTypeDesc& d : WeightTypes()) {
    if (!d.quantized_activation) continue;
    for (const int64_t rows : {1, 4, 7, 18, 32}) {  // whole quads of rows and tails
      const int64_t cols = 1024;
      std::mt19937 rng(seed++);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<uint8_t> bytes(rows * MatrixRowBytes(d.type, cols));
      std::vector<float> block(d.block_elems);
      for (int64_t b = 0; b < rows * cols / d.block_elems; ++b) {
        for (float& v : block) v = normal(rng);
        d.quantize_block_ref(block.data(), bytes.data() + b * d.block_bytes);
      }
      const Matrix w{.type = d.type, .data = bytes.data(), .rows = rows, .cols = cols};
      const std::vector<float> x = RandomVector(cols, seed++);
      std::vector<float> first;
      std::vector<float> grouped;  // the rows of whole groups, repacked, on the best target
      const bool legacy = d.type == WeightType::kQ4_0 || d.type == WeightType::kQ8_0;
      if (legacy && rows >= kInterleaveRows) {
        std::vector<uint8_t> repacked(bytes.size());
        const Matrix g = RepackMatrix(w, repacked.data());
        grouped.assign(rows, NAN);
        MatVec(g, x.data(), grouped.data(), ThreadPool::Shared(1));
        grouped.resize(rows / kInterleaveRows * kInterleaveRows);
      }
      for (int64_t target : no_fma) {
        TargetScope scope(target);
        std::vector<float> y(rows, NAN);
        MatVec(w, x.data(), y.data(), ThreadPool::Shared(1));
        if (first.empty()) first = y;
        ASSERT_EQ(std::memcmp(first.data(), y.data(), 4 * rows), 0)
            << d.name << " " << rows << " rows: " << hwy::TargetName(target) << " differs from "
            << hwy::TargetName(no_fma.front());
        if (legacy) {
          ASSERT_EQ(std::memcmp(grouped.data(), y.data(), 4 * grouped.size()), 0)
              << d.name << " " << rows << " rows: " << hwy::TargetName(target) << "'s rows differ from the groups";
        }
      }
    }
  }
}

// ---- 4. The bound against the unquantised product ----

// |MatVec − Σ w·x| ≤ x_error_bound + rounding tolerance on every row, and on random data with one
// block per row the realised error reaches well over a quarter of the bound: it is not loose.
TEST(QuantizedMatVec, BoundAgainstTheUnquantisedProductHoldsAndIsTight) {
  uint32_t seed = 900;
  for (WeightType type : kBlockTypes) {
    for (int64_t cols : {32, 256, 4096}) {
      const int64_t rows = cols == 32 ? 4000 : 500;
      const Stored w = RandomBlockMatrix(type, rows, cols, seed++);
      const std::vector<float> x = RandomVector(cols, seed++);
      std::vector<QuantizedProductReference> ref(rows);
      MatVecQuantizedReference(w.m, x.data(), ref.data());
      std::vector<float> y(rows), row(cols);
      MatVec(w.m, x.data(), y.data(), ThreadPool::Shared(2));
      double worst = 0.0;
      for (int64_t r = 0; r < rows; ++r) {
        DecodeWeightRow(w.m, r, row.data());
        double exact = 0.0, abs = 0.0;  // Σ w·x in double: each product exact, cols additions
        for (int64_t c = 0; c < cols; ++c) {
          exact += static_cast<double>(row[c]) * x[c];
          abs += std::fabs(static_cast<double>(row[c]) * x[c]);
        }
        const double err = std::fabs(y[r] - exact);
        ASSERT_LE(err, ref[r].x_error_bound + RoundingTolerance(cols, ref[r]) + Gamma(cols, kUd) * abs)
            << WeightTypeName(type) << " cols " << cols << " row " << r;
        worst = std::max(worst, err / ref[r].x_error_bound);
      }
      std::printf("%s cols %4lld: max |y - unquantised| / x_error_bound over %lld rows = %.3f\n",
                  WeightTypeName(type), static_cast<long long>(cols), static_cast<long long>(rows), worst);
      if (cols == 32) {
        EXPECT_GT(worst, 0.25) << WeightTypeName(type);
      }
    }
  }
}

// The bound is reached: x's elements sit exactly halfway between codes, rounding (ties to even)
// moves each by d_x/2 in the direction of its weight's sign, so the errors add up. With d_x = 1
// and 31 of 32 elements off by ½ (the amax element is exact), the error is 31/32 of the bound
// (less its 2^-17 slack).
TEST(QuantizedMatVec, BoundIsReachedByHalfwayActivations) {
  std::vector<float> x(32);
  x[0] = 127.0f;
  // x_i = 2k + ½ rounds (ties to even) to 2k: every error x − q is +½, in the weights' direction.
  for (int i = 1; i < 32; ++i) x[i] = static_cast<float>(2 * (i - 16)) + 0.5f;
  for (WeightType type : kBlockTypes) {
    std::vector<uint8_t> bytes;
    PutU16(bytes, 0x3C00);  // d_w = 1
    if (type == WeightType::kQ8_0) {
      for (int i = 0; i < 32; ++i) bytes.push_back(100);  // codes 100 > 0
    } else {
      for (int j = 0; j < 16; ++j) bytes.push_back(0xFF);  // codes 7 > 0
    }
    const Stored w = FromBytes(type, std::move(bytes), 1, 32);
    QuantizedProductReference ref;
    MatVecQuantizedReference(w.m, x.data(), &ref);
    const double code = type == WeightType::kQ8_0 ? 100.0 : 7.0;
    double exact = 0.0;
    for (float v : x) exact += code * v;
    const double err = std::fabs(ref.y - exact);
    EXPECT_EQ(err, 31.0 * 0.5 * code);                        // every element but the amax off by ½
    EXPECT_EQ(ref.x_error_bound, 32.0 * (0.5 + 0x1p-17) * code);
    std::printf("%s halfway activations: error / x_error_bound = %.6f\n", WeightTypeName(type),
                err / ref.x_error_bound);
    EXPECT_GT(err / ref.x_error_bound, 0.96);
    for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
      TargetScope scope(target);
      float y = 0;
      MatVec(w.m, x.data(), &y, ThreadPool::Shared(1));
      EXPECT_EQ(y, ref.y) << hwy::TargetName(target);  // small integers: exact on every target
    }
  }
}

// ---- 5. The tolerance is tight enough to catch real bugs ----

// Q4_0 read with the tempting wrong nibble order (elements 2j and 2j+1 in byte j), and a Q8_0
// kernel that forgets element 31 of each block, miss the quantised reference by more than the
// rounding tolerance in nearly every row.
TEST(QuantizedMatVec, ToleranceCatchesWrongKernels) {
  uint32_t seed = 1000;
  for (WeightType type : kBlockTypes) {
    for (int64_t cols : {32, 256, 4096}) {
      const int64_t rows = 64;
      const Stored w = RandomBlockMatrix(type, rows, cols, seed++);
      const std::vector<float> x = RandomVector(cols, seed++);
      std::vector<QuantizedProductReference> ref(rows);
      MatVecQuantizedReference(w.m, x.data(), ref.data());
      std::vector<int8_t> q(cols);
      std::vector<float> d(cols / 32);
      QuantizeActivationReference(x.data(), cols, q.data(), d.data());
      int caught = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* row = w.bytes.data() + r * MatrixRowBytes(type, cols);
        double wrong = 0.0;
        for (int64_t b = 0; b < cols / 32; ++b) {
          const uint8_t* block = row + b * (type == WeightType::kQ8_0 ? 34 : 18);
          uint16_t h;
          std::memcpy(&h, block, 2);
          int64_t dot = 0;
          for (int j = 0; j < 16; ++j) {
            if (type == WeightType::kQ4_0) {
              dot += ((block[2 + j] & 0x0F) - 8) * q[b * 32 + 2 * j];
              dot += ((block[2 + j] >> 4) - 8) * q[b * 32 + 2 * j + 1];
            } else {
              dot += static_cast<int8_t>(block[2 + j]) * q[b * 32 + j];
              if (16 + j != 31) dot += static_cast<int8_t>(block[18 + j]) * q[b * 32 + 16 + j];
            }
          }
          wrong += static_cast<double>(F16ToF32(h)) * d[b] * static_cast<double>(dot);
        }
        if (std::fabs(wrong - ref[r].y) > RoundingTolerance(cols, ref[r])) ++caught;
      }
      std::printf("%s cols %4lld: the wrong kernel exceeds the tolerance in %d of %lld rows\n",
                  WeightTypeName(type), static_cast<long long>(cols), caught, static_cast<long long>(rows));
      EXPECT_GE(caught, rows * 9 / 10) << WeightTypeName(type) << " cols " << cols;
    }
  }
}

// ---- 6. Special activations ----

TEST(QuantizedMatVec, NonFiniteActivationGivesNaNAndZeroGivesZero) {
  for (WeightType type : kBlockTypes) {
    const Stored w = RandomBlockMatrix(type, 9, 128, 77);
    std::vector<float> x = RandomVector(128, 78);
    std::vector<float> zero(128, 0.0f);
    for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
      TargetScope scope(target);
      for (float bad : {kInf, -kInf, std::numeric_limits<float>::quiet_NaN()}) {
        x[70] = bad;
        std::vector<float> y(9, 0.0f);
        MatVec(w.m, x.data(), y.data(), ThreadPool::Shared(1));
        for (float v : y) {
          EXPECT_TRUE(std::isnan(v)) << WeightTypeName(type) << " " << hwy::TargetName(target);
        }
      }
      std::vector<float> y(9, 1.0f);
      MatVec(w.m, zero.data(), y.data(), ThreadPool::Shared(1));
      for (float v : y) EXPECT_EQ(v, 0.0f) << WeightTypeName(type) << " " << hwy::TargetName(target);
    }
  }
}

}  // namespace
}  // namespace kvq
