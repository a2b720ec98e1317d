// MatVec, part 1: the scalar decoders against hand-built blocks (values worked out by hand from
// the ggml block definitions), the plain types' SIMD kernels (F32, F16, BF16) against
// MatVecReference on every SIMD target compiled in within a derived rounding bound, and
// CheckMatrix's refusals. The quantised-activation path of Q8_0/Q4_0 is tested in
// matvec_quant_test.cc.
//
// The bound (plain types). Let p_c = w_c·x_c (w_c the exactly decoded weight) and u = 2^-24.
// MatVecReference rounds each product once and adds them in column order: cols − 1 rounded
// additions, so |ref − Σp| ≤ γ_cols·Σ|p| with γ_n = n·u/(1 − n·u). The SIMD kernel rounds each
// product at most once (an FMA rounds product and sum together), adds along lanes (cols/N terms)
// and adds the lanes (log2 N): every term passes through at most cols + 2 roundings, so
// |simd − Σp| ≤ γ_{cols+2}·Σ|p|. Hence |simd − ref| ≤ (γ_cols + γ_{cols+2})·Σ|p| — the tolerance
// used (computed in double; for cols ≤ 4096 it is below matvec.h's 2·(cols + 4)·u·Σ|p|).
// The matvec translation unit compiles AVX3_DL (matvec.cc); so must this one, for its target list.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/float_codes.h"
#include "weights/matvec.h"
#include "weights/weight_type.h"
#include "test_util/target_scope.h"

namespace kvq {
namespace {

constexpr double kU = 0x1p-24;  // unit roundoff of f32

using test::TargetScope;  // test_util/target_scope.h

Matrix View(WeightType type, const std::vector<uint8_t>& bytes, int64_t rows, int64_t cols) {
  return Matrix{.type = type, .data = bytes.data(), .rows = rows, .cols = cols};
}

void PutU16(std::vector<uint8_t>& bytes, uint16_t v) {  // little-endian, as in a GGUF file
  bytes.push_back(static_cast<uint8_t>(v & 0xFF));
  bytes.push_back(static_cast<uint8_t>(v >> 8));
}

bool IsBlockType(WeightType type) { return FindWeightType(type)->quantized_activation; }

// Column c of W through MatVec on the current target, times ColumnFactor. Plain types: x = e_c,
// so y = W[:, c] exactly (every other product is 0·w = ±0, and adding zeros is exact). Q8_0/Q4_0
// quantise x: x = 127·e_c makes the block's d_x = 1 and q_c = 127, every other code 0, so
// y = d_w·(127·code), exact when d_w is a power of two (127·code has at most 14 significant bits),
// as in the hand-built blocks below.
float ColumnFactor(WeightType type) { return IsBlockType(type) ? 127.0f : 1.0f; }
std::vector<float> ColumnViaMatVec(const Matrix& w, int64_t c) {
  std::vector<float> x(w.cols, 0.0f), y(w.rows, -1.0f);
  x[c] = ColumnFactor(w.type);
  MatVec(w, x.data(), y.data(), ThreadPool::Shared(1));
  return y;
}

// Every element of W, decoded by DecodeWeight, by DecodeWeightRow and by MatVec on every target,
// equals want[r][c].
void ExpectDecodes(const Matrix& w, const std::vector<std::vector<float>>& want) {
  ASSERT_EQ(static_cast<int64_t>(want.size()), w.rows);
  std::vector<float> row(w.cols);
  for (int64_t r = 0; r < w.rows; ++r) {
    ASSERT_EQ(static_cast<int64_t>(want[r].size()), w.cols);
    DecodeWeightRow(w, r, row.data());
    for (int64_t c = 0; c < w.cols; ++c) {
      EXPECT_EQ(DecodeWeight(w, r, c), want[r][c]) << "row " << r << " col " << c;
      EXPECT_EQ(row[c], want[r][c]) << "row " << r << " col " << c;
    }
  }
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    TargetScope scope(target);
    ASSERT_STREQ(MatVecTargetName(), hwy::TargetName(target));
    for (int64_t c = 0; c < w.cols; ++c) {
      const std::vector<float> col = ColumnViaMatVec(w, c);
      for (int64_t r = 0; r < w.rows; ++r) {
        EXPECT_EQ(col[r], ColumnFactor(w.type) * want[r][c])
            << hwy::TargetName(target) << " row " << r << " col " << c;
      }
    }
  }
}

// ---- 1. Hand-built blocks ----

TEST(MatVecDecode, Q8_0HandBuiltBlocks) {
  // Row 0, block 0: d = 0.5 (f16 0x3800), then 32 int8 codes; element i = 0.5·qs[i].
  const int8_t qs0[32] = {0,  1,  -1,  127, -128, 2,   -2,  64,  -64, 3,   -3,  10,  -10, 100, -100, 5,
                          -5, 7,  -7,  8,   -8,   16,  -16, 32,  -32, 50,  -50, 126, -127, 4,   -4,  9};
  const float want0[32] = {0.0f,  0.5f,  -0.5f, 63.5f, -64.0f, 1.0f,  -1.0f, 32.0f,
                           -32.0f, 1.5f, -1.5f, 5.0f,  -5.0f,  50.0f, -50.0f, 2.5f,
                           -2.5f, 3.5f,  -3.5f, 4.0f,  -4.0f,  8.0f,  -8.0f, 16.0f,
                           -16.0f, 25.0f, -25.0f, 63.0f, -63.5f, 2.0f, -2.0f, 4.5f};
  // Row 0, block 1: d = −0.25 (0xB400); qs[0] = 4 -> −1, qs[31] = −128 -> 32, qs[17] = 3 -> −0.75,
  // every other code 0.
  // Row 1: d = 2 (0x4000) in both blocks, qs[i] = i − 16 in block 0 and 15 − i in block 1.
  std::vector<uint8_t> bytes;
  PutU16(bytes, 0x3800);
  for (int8_t q : qs0) bytes.push_back(static_cast<uint8_t>(q));
  PutU16(bytes, 0xB400);
  for (int i = 0; i < 32; ++i) {
    const int8_t q = i == 0 ? 4 : i == 31 ? -128 : i == 17 ? 3 : 0;
    bytes.push_back(static_cast<uint8_t>(q));
  }
  for (int b = 0; b < 2; ++b) {
    PutU16(bytes, 0x4000);
    for (int i = 0; i < 32; ++i) {
      bytes.push_back(static_cast<uint8_t>(static_cast<int8_t>(b == 0 ? i - 16 : 15 - i)));
    }
  }
  ASSERT_EQ(bytes.size(), 4u * 34u);
  const Matrix w = View(WeightType::kQ8_0, bytes, 2, 64);
  ASSERT_EQ(MatrixRowBytes(WeightType::kQ8_0, 64), 68);

  std::vector<std::vector<float>> want(2, std::vector<float>(64, 0.0f));
  for (int i = 0; i < 32; ++i) want[0][i] = want0[i];
  want[0][32] = -1.0f;
  want[0][32 + 17] = -0.75f;
  want[0][63] = 32.0f;
  for (int i = 0; i < 32; ++i) {
    want[1][i] = 2.0f * static_cast<float>(i - 16);
    want[1][32 + i] = 2.0f * static_cast<float>(15 - i);
  }
  // Spot checks written out: row 1 col 0 = 2·(−16), col 63 = 2·(15 − 31).
  ASSERT_EQ(want[1][0], -32.0f);
  ASSERT_EQ(want[1][63], -32.0f);
  ExpectDecodes(w, want);
}

TEST(MatVecDecode, Q4_0HandBuiltBlocksAndNibbleOrder) {
  // Block 0: d = 0.5 (f16 0x3800), 16 bytes of nibbles. Byte j holds element j in its LOW nibble
  // and element j+16 in its HIGH nibble; code = nibble − 8.
  const uint8_t qs0[16] = {0x1F, 0x80, 0x08, 0xF0, 0x7A, 0x2C, 0x39, 0x4D,
                           0x5E, 0x61, 0xB2, 0xC3, 0xD4, 0xE5, 0x96, 0xA7};
  // Low nibbles F 0 8 0 A C 9 D E 1 2 3 4 5 6 7 -> codes 7 −8 0 −8 2 4 1 5 6 −7 −6 −5 −4 −3 −2 −1.
  // High nibbles 1 8 0 F 7 2 3 4 5 6 B C D E 9 A -> codes −7 0 −8 7 −1 −6 −5 −4 −3 −2 3 4 5 6 1 2.
  const float want0[32] = {3.5f,  -4.0f, 0.0f,  -4.0f, 1.0f,  2.0f,  0.5f,  2.5f,   // elements 0..7
                           3.0f,  -3.5f, -3.0f, -2.5f, -2.0f, -1.5f, -1.0f, -0.5f,  // 8..15
                           -3.5f, 0.0f,  -4.0f, 3.5f,  -0.5f, -3.0f, -2.5f, -2.0f,  // 16..23
                           -1.5f, -1.0f, 1.5f,  2.0f,  2.5f,  3.0f,  0.5f,  1.0f};  // 24..31
  // Block 1: d = −2 (0xC000); every byte 0x88 (codes 0) except byte 3 = 0x0F: element 3 (low F,
  // code 7) = −14 and element 19 (high 0, code −8) = 16.
  // Row 1: d = 0.25 (0x3400) in both blocks, byte j = j | (15 − j) << 4: element j = 0.25·(j − 8),
  // element j + 16 = 0.25·(7 − j).
  std::vector<uint8_t> bytes;
  PutU16(bytes, 0x3800);
  bytes.insert(bytes.end(), qs0, qs0 + 16);
  PutU16(bytes, 0xC000);
  for (int j = 0; j < 16; ++j) bytes.push_back(j == 3 ? 0x0F : 0x88);
  for (int b = 0; b < 2; ++b) {
    PutU16(bytes, 0x3400);
    for (int j = 0; j < 16; ++j) bytes.push_back(static_cast<uint8_t>(j | (15 - j) << 4));
  }
  ASSERT_EQ(bytes.size(), 4u * 18u);
  const Matrix w = View(WeightType::kQ4_0, bytes, 2, 64);
  ASSERT_EQ(MatrixRowBytes(WeightType::kQ4_0, 64), 36);

  // The nibble order, stated directly: element 0 = low nibble of byte 0, element 16 = its high
  // nibble, element 1 = low nibble of byte 1 (not the high nibble of byte 0).
  EXPECT_EQ(DecodeWeight(w, 0, 0), 0.5f * (0xF - 8));
  EXPECT_EQ(DecodeWeight(w, 0, 16), 0.5f * (0x1 - 8));
  EXPECT_EQ(DecodeWeight(w, 0, 1), 0.5f * (0x0 - 8));
  EXPECT_EQ(DecodeWeight(w, 0, 17), 0.5f * (0x8 - 8));

  std::vector<std::vector<float>> want(2, std::vector<float>(64, -0.0f));  // −2·0 = −0 (== 0)
  for (int i = 0; i < 32; ++i) want[0][i] = want0[i];
  want[0][32 + 3] = -14.0f;
  want[0][32 + 19] = 16.0f;
  for (int b = 0; b < 2; ++b) {
    for (int j = 0; j < 16; ++j) {
      want[1][32 * b + j] = 0.25f * static_cast<float>(j - 8);
      want[1][32 * b + 16 + j] = 0.25f * static_cast<float>(7 - j);
    }
  }
  ASSERT_EQ(want[1][0], -2.0f);   // byte 0 = 0xF0: low 0 -> −8
  ASSERT_EQ(want[1][16], 1.75f);  // high F -> 7
  ExpectDecodes(w, want);
}

TEST(MatVecDecode, F16AndBf16HandBuiltRows) {
  // 20 columns: on 8- and 16-lane targets both the vector loop and the scalar tail run.
  std::vector<uint16_t> f16(20, 0x0000), bf16(20, 0x0000);
  std::vector<float> want_f16(20, 0.0f), want_bf16(20, 0.0f);
  const int at[6] = {0, 1, 2, 15, 16, 19};
  const uint16_t f16_codes[6] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x3555, 0x8000};
  const float f16_values[6] = {1.0f, -2.0f, 65504.0f, 0x1p-24f, 0.333251953125f, -0.0f};
  const uint16_t bf16_codes[6] = {0x3F80, 0xC040, 0x4049, 0x0001, 0x7F7F, 0xBF00};
  const float bf16_values[6] = {1.0f, -3.0f, 3.140625f, 0x1p-133f, 0x1.FEp127f, -0.5f};
  for (int k = 0; k < 6; ++k) {
    f16[at[k]] = f16_codes[k];
    want_f16[at[k]] = f16_values[k];
    bf16[at[k]] = bf16_codes[k];
    want_bf16[at[k]] = bf16_values[k];
  }
  std::vector<uint8_t> f16_bytes, bf16_bytes;
  for (uint16_t v : f16) PutU16(f16_bytes, v);
  for (uint16_t v : bf16) PutU16(bf16_bytes, v);
  ExpectDecodes(View(WeightType::kF16, f16_bytes, 1, 20), {want_f16});
  ExpectDecodes(View(WeightType::kBf16, bf16_bytes, 1, 20), {want_bf16});
}

// ---- 2. SIMD against the reference ----

struct Stored {
  std::vector<uint8_t> bytes;
  Matrix m;
};

Stored RandomPlainMatrix(WeightType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Stored s;
  const int64_t row_bytes = MatrixRowBytes(type, cols);
  s.bytes.resize(rows * row_bytes);
  std::vector<float> values(cols);  // [cols] one row, drawn in order
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : values) v = normal(rng);
    QuantizeRowRef(*FindWeightType(type), values.data(), cols, s.bytes.data() + r * row_bytes);
  }
  EXPECT_EQ(static_cast<int64_t>(s.bytes.size()), rows * row_bytes);
  s.m = View(type, s.bytes, rows, cols);
  return s;
}

std::vector<float> RandomVector(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

/// Σ_c |W[r][c]·x[c]| and Σ_c W[r][c]·x[c] in double, from the scalar decoder.
struct RowSums {
  double abs_sum;
  double exact;
};
std::vector<RowSums> Sums(const Matrix& w, const std::vector<float>& x) {
  std::vector<RowSums> out(w.rows);
  std::vector<float> row(w.cols);
  for (int64_t r = 0; r < w.rows; ++r) {
    DecodeWeightRow(w, r, row.data());
    double a = 0.0, e = 0.0;
    for (int64_t c = 0; c < w.cols; ++c) {
      const double p = static_cast<double>(row[c]) * x[c];
      a += std::fabs(p);
      e += p;
    }
    out[r] = {a, e};
  }
  return out;
}

double Gamma(int64_t n) { return n * kU / (1.0 - n * kU); }
double Tolerance(int64_t cols, double abs_sum) { return (Gamma(cols) + Gamma(cols + 2)) * abs_sum; }

// The registry's plain types (one element per block, the activation used as given).
std::vector<WeightType> PlainTypes() {
  std::vector<WeightType> out;
  for (const WeightTypeDesc& d : WeightTypes()) {
    if (!d.quantized_activation) out.push_back(d.type);
  }
  return out;
}

struct Shape {
  int64_t rows, cols;
};

std::vector<Shape> PlainShapes() {
  std::vector<Shape> shapes;
  for (int64_t rows : {1, 3, 4, 5, 17, 64, 1000}) {
    for (int64_t cols : {32, 64, 96, 256, 4096}) shapes.push_back({rows, cols});
  }
  // Plain types take any cols: shorter than a vector, and with a scalar tail.
  for (int64_t rows : {1, 5, 17}) {
    for (int64_t cols : {1, 7, 33, 100}) shapes.push_back({rows, cols});
  }
  // Rows fewer than the threads, with enough work (rows·cols ≥ 2^16) that MatVec asks for the
  // threads: one 16-row work item, so one thread computes it.
  for (int64_t rows : {2, 3}) shapes.push_back({rows, 40000});
  return shapes;
}

TEST(MatVec, PlainTypesMatchTheReferenceOnEveryTarget) {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  std::string names;
  for (int64_t t : targets) names += std::string(" ") + hwy::TargetName(t);
  std::printf("targets:%s\n", names.c_str());
  uint32_t seed = 1;
  for (WeightType type : PlainTypes()) {
    double worst_ratio = 0.0;  // max |simd − ref| / tolerance over all rows, targets and shapes
    for (const Shape& shape : PlainShapes()) {
      SCOPED_TRACE(::testing::Message() << WeightTypeName(type) << " " << shape.rows << "x" << shape.cols);
      const Stored w = RandomPlainMatrix(type, shape.rows, shape.cols, seed++);
      ASSERT_TRUE(CheckMatrix(w.m).ok()) << CheckMatrix(w.m).message();
      const std::vector<float> x = RandomVector(shape.cols, seed++);
      std::vector<float> ref(shape.rows);
      MatVecReference(w.m, x.data(), ref.data());
      const std::vector<RowSums> sums = Sums(w.m, x);
      // The oracle itself is within its own bound γ_cols·Σ|p| of the exact sum.
      for (int64_t r = 0; r < shape.rows; ++r) {
        ASSERT_LE(std::fabs(ref[r] - sums[r].exact), Gamma(shape.cols) * sums[r].abs_sum)
            << "reference, row " << r;
      }
      for (int64_t target : targets) {
        TargetScope scope(target);
        ASSERT_STREQ(MatVecTargetName(), hwy::TargetName(target));
        std::vector<float> y1(shape.rows, NAN);
        MatVec(w.m, x.data(), y1.data(), ThreadPool::Shared(1));
        for (int64_t r = 0; r < shape.rows; ++r) {
          const double tol = Tolerance(shape.cols, sums[r].abs_sum);
          const double err = std::fabs(static_cast<double>(y1[r]) - ref[r]);
          ASSERT_LE(err, tol) << hwy::TargetName(target) << " row " << r << ": simd " << y1[r] << " ref "
                              << ref[r];
          if (tol > 0) worst_ratio = std::max(worst_ratio, err / tol);
        }
        // Rows are computed alike whatever the thread count: bit-identical results.
        for (int32_t threads = 2; threads <= 4; ++threads) {
          std::vector<float> yt(shape.rows, NAN);
          MatVec(w.m, x.data(), yt.data(), ThreadPool::Shared(threads));
          ASSERT_EQ(std::memcmp(y1.data(), yt.data(), 4 * shape.rows), 0)
              << hwy::TargetName(target) << ": 1 thread and " << threads << " threads differ";
        }
      }
    }
    std::printf("%-5s worst |simd - ref| / tolerance = %.3g\n", WeightTypeName(type), worst_ratio);
  }
}

// ---- 3. CheckMatrix ----

TEST(CheckMatrix, RefusesBlockTypesWhoseRowsAreNotWholeBlocks) {
  for (const WeightTypeDesc& d : WeightTypes()) {
    if (d.block_elems == 1) continue;
    const WeightType type = d.type;
    // Half a block past whole blocks (48 for blocks of 32), then two whole blocks.
    const int64_t cols = d.block_elems + d.block_elems / 2;
    const Status s = CheckMatrix(Matrix{.type = type, .rows = 8, .cols = cols});
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find(WeightTypeName(type)), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(std::to_string(cols)), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("multiple of " + std::to_string(d.block_elems)), std::string::npos) << s.message();
    EXPECT_TRUE(CheckMatrix(Matrix{.type = type, .rows = 8, .cols = 2 * d.block_elems}).ok());
  }
  EXPECT_EQ(CheckMatrix(Matrix{.type = WeightType::kQ4_0, .rows = 8, .cols = 48}).message(),
            "Q4_0 matrix has 48 columns, which is not a multiple of 32: Q4_0 stores each row as blocks "
            "of 32 elements");
  // Plain types take any width.
  for (WeightType type : PlainTypes()) {
    EXPECT_TRUE(CheckMatrix(Matrix{.type = type, .rows = 3, .cols = 48}).ok());
    EXPECT_TRUE(CheckMatrix(Matrix{.type = type, .rows = 3, .cols = 7}).ok());
  }
}

TEST(CheckMatrix, RefusesUnknownTypesAndEmptyRows) {
  // A value past every WeightType enumerator (registered or not).
  const Status unknown = CheckMatrix(Matrix{.type = static_cast<WeightType>(1000), .rows = 2, .cols = 32});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.message().find("not supported"), std::string::npos) << unknown.message();
  EXPECT_NE(unknown.message().find("F32, F16, BF16, Q8_0, Q4_0"), std::string::npos) << unknown.message();
  EXPECT_FALSE(CheckMatrix(Matrix{.type = WeightType::kF32, .rows = 2, .cols = 0}).ok());
  EXPECT_FALSE(CheckMatrix(Matrix{.type = WeightType::kF32, .rows = -1, .cols = 4}).ok());
}

TEST(MatrixRowBytes, MatchesTheBlockLayouts) {
  EXPECT_EQ(MatrixRowBytes(WeightType::kF32, 4096), 16384);
  EXPECT_EQ(MatrixRowBytes(WeightType::kF16, 4096), 8192);
  EXPECT_EQ(MatrixRowBytes(WeightType::kBf16, 4096), 8192);
  EXPECT_EQ(MatrixRowBytes(WeightType::kQ8_0, 4096), 128 * 34);
  EXPECT_EQ(MatrixRowBytes(WeightType::kQ4_0, 4096), 128 * 18);
}

}  // namespace
}  // namespace kvq
