// Every type with an interleaved kernel (Q4_0 / Q8_0 / Q2_0 / Q1_0, weights/repack.h; Q2_K / Q3_K /
// Q4_K / Q5_K / Q6_K, weights/kquant_repack.h) repacked into MatrixLayout::kInterleaved16 on every SIMD target:
// the repack round-trips (each block's plain bytes, the decoded rows, the quantised reference);
// MatVec on the repacked layout is within γ_{n_blocks+r}·abs_sum of MatVecQuantizedReference (the
// interleaved kernels round each term at most n_blocks + r times: r = 1 in interleaved_rows-inl.h,
// Q2_0's two activation blocks per scale included, 2 in kquant_interleaved-inl.h) and, in the
// 16-row groups, the same bits on every target; MatMul equals MatVec bit for bit for 1..21 tokens
// and row counts that are not multiples of 16, and for the K-quants' multi-token steps at up to 23
// tokens; the thread count changes no bit; special activations as in matvec.h.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL  // as the weight kernels, so the target list below includes AVX3_DL
#endif
#include "weights/repack.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "test_util/matvec_bounds.h"
#include "weights/kquant_repack.h"
#include "weights/matvec.h"
#include "weights/q1_0/q1_0.h"
#include "weights/q2_0/q2_0.h"
#include "weights/q4_0/q4_0.h"
#include "weights/q5_k/q5_k.h"
#include "weights/weight_type.h"

namespace kvq {
namespace {

using test::QuantTolerance;
using test::TargetScope;

// Every registered type with an interleaved kernel (the registry's kernel table says so).
std::vector<WeightType> RepackedTypes() {
  std::vector<WeightType> types;
  for (const WeightTypeDesc& d : WeightTypes()) {
    if (d.kernels().interleaved_rows != nullptr) types.push_back(d.type);
  }
  return types;
}
const std::vector<WeightType> kTypes = RepackedTypes();

bool IsKQuant(WeightType type) { return IsInterleavedKQuant(type); }

// Q1_0's repacked kernels give each target's row-kernel bits (q1_0.h), not one result for all targets.
bool RowKernelBits(WeightType type) { return type == WeightType::kQ1_0; }

// Roundings per term beyond one per activation block: interleaved_rows-inl.h (Q4_0, Q8_0),
// kquant_interleaved-inl.h (the K-quants: a second accumulator and the add that joins them), and
// Q1_0's row kernels' count (its repacked kernels repeat their float operations).
int64_t InterleavedRoundings(WeightType type) {
  if (RowKernelBits(type)) return FindWeightType(type)->matvec_roundings;
  return IsKQuant(type) ? 2 : 1;
}

// Row lengths: whole blocks of 32, 128 for Q1_0 (1 to 17 blocks: odd counts, and counts that are
// and are not multiples of the kernels' 4-block groups), or of 256 for the K-quants (`small` for
// the byte checks).
std::vector<int64_t> ColsFor(WeightType type, bool small) {
  if (type == WeightType::kQ1_0) return small ? std::vector<int64_t>{128, 384, 512} : std::vector<int64_t>{128, 384, 512, 640, 2176};
  if (type == WeightType::kQ2_0) return small ? std::vector<int64_t>{64, 192, 256} : std::vector<int64_t>{64, 192, 1024, 2112};
  if (IsKQuant(type)) return small ? std::vector<int64_t>{256, 512, 768} : std::vector<int64_t>{256, 768, 1024, 2048};
  return small ? std::vector<int64_t>{32, 64, 96, 256} : std::vector<int64_t>{32, 96, 256, 1024};
}

// A plain matrix of N(0, 1) rows by the type's quantiser, and its repacked copy.
struct Pair {
  std::vector<uint8_t> plain_bytes, packed_bytes;
  Matrix plain, packed;
};

Pair MakePair(WeightType type, int64_t rows, int64_t cols, uint32_t seed) {
  const WeightTypeDesc& d = *FindWeightType(type);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Pair p;
  const int64_t row_bytes = MatrixRowBytes(type, cols);
  p.plain_bytes.resize(rows * row_bytes);
  std::vector<float> row(cols);  // [cols]
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = normal(rng);
    QuantizeRowRef(d, row.data(), cols, p.plain_bytes.data() + r * row_bytes);
  }
  p.plain = Matrix{.type = type, .data = p.plain_bytes.data(), .rows = rows, .cols = cols};
  p.packed_bytes.resize(p.plain_bytes.size());
  p.packed = RepackMatrix(p.plain, p.packed_bytes.data());
  return p;
}

std::vector<float> RandomX(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
}

TEST(Repack, OnlyRowMajorQ4_0AndQ8_0WithAWholeGroup) {
  EXPECT_TRUE(CanRepack(Matrix{.type = WeightType::kQ4_0, .rows = 16, .cols = 32}));
  EXPECT_TRUE(CanRepack(Matrix{.type = WeightType::kQ8_0, .rows = 17, .cols = 64}));
  EXPECT_FALSE(CanRepack(Matrix{.type = WeightType::kQ4_0, .rows = 15, .cols = 32}));
  EXPECT_FALSE(CanRepack(Matrix{.type = WeightType::kQ4_1, .rows = 16, .cols = 32}));
  EXPECT_TRUE(CanRepack(Matrix{.type = WeightType::kQ4_K, .rows = 16, .cols = 256}));
  EXPECT_TRUE(CanRepack(Matrix{.type = WeightType::kQ6_K, .rows = 33, .cols = 512}));
  EXPECT_FALSE(CanRepack(Matrix{.type = WeightType::kQ6_K, .rows = 15, .cols = 256}));
  EXPECT_FALSE(CanRepack(Matrix{.type = WeightType::kF32, .rows = 16, .cols = 32}));
  // Q1_0: only on the target with the lookup-table kernels (elsewhere the plain rows are faster).
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    TargetScope scope(target);
    const bool lookup = std::strcmp(weights_q1_0::Kernels().target, "AVX3_DL") == 0;
    EXPECT_EQ(CanRepack(Matrix{.type = WeightType::kQ1_0, .rows = 19, .cols = 128}), lookup) << hwy::TargetName(target);
  }
  EXPECT_FALSE(CanRepack(Matrix{.type = WeightType::kQ1_0, .rows = 15, .cols = 128}));
  // Q2_0: only where the interleaved kernel runs 512-bit byte dots (AVX3_DL; measured there).
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    TargetScope scope(target);
    const bool vnni = std::strcmp(weights_q2_0::Kernels().target, "AVX3_DL") == 0;
    EXPECT_EQ(CanRepack(Matrix{.type = WeightType::kQ2_0, .rows = 16, .cols = 64}), vnni) << hwy::TargetName(target);
  }
  EXPECT_FALSE(CanRepack(Matrix{.type = WeightType::kQ2_0, .rows = 15, .cols = 64}));
  // Q4_0 and Q8_0: only where the interleaved kernel runs x86 byte dots (AVX2 or better); the
  // portable group loop is slower than the 128-bit row kernels (the WebAssembly module's).
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    TargetScope scope(target);
    const std::string name = weights_q4_0::Kernels().target;
    const bool x86 = name.rfind("AVX", 0) == 0;
    EXPECT_EQ(CanRepack(Matrix{.type = WeightType::kQ4_0, .rows = 16, .cols = 32}), x86) << hwy::TargetName(target);
    EXPECT_EQ(CanRepack(Matrix{.type = WeightType::kQ8_0, .rows = 17, .cols = 64}), x86) << hwy::TargetName(target);
  }
  // Q2_K, Q3_K and Q5_K: only where the interleaved kernels run x86 byte dots (AVX2 or better; measured there).
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    TargetScope scope(target);
    const std::string name = weights_q5_k::Kernels().target;
    const bool x86 = name.rfind("AVX", 0) == 0;
    EXPECT_EQ(CanRepack(Matrix{.type = WeightType::kQ5_K, .rows = 16, .cols = 256}), x86) << hwy::TargetName(target);
    EXPECT_EQ(CanRepack(Matrix{.type = WeightType::kQ3_K, .rows = 16, .cols = 256}), x86) << hwy::TargetName(target);
    EXPECT_EQ(CanRepack(Matrix{.type = WeightType::kQ2_K, .rows = 16, .cols = 256}), x86) << hwy::TargetName(target);
  }
  EXPECT_FALSE(CanRepack(Matrix{.type = WeightType::kQ3_K, .rows = 15, .cols = 256}));
  EXPECT_FALSE(CanRepack(
      Matrix{.type = WeightType::kQ4_0, .rows = 16, .cols = 32, .layout = MatrixLayout::kInterleaved16}));
}

TEST(Repack, RoundTripsEveryBlockAndRow) {
  uint32_t seed = 100;
  for (WeightType type : kTypes) {
    const WeightTypeDesc& d = *FindWeightType(type);
    for (int64_t rows : {16, 17, 31, 32, 37}) {
      for (int64_t cols : ColsFor(type, true)) {
        SCOPED_TRACE(::testing::Message() << d.label << " " << rows << "x" << cols);
        const Pair p = MakePair(type, rows, cols, seed++);
        ASSERT_EQ(p.packed.layout, MatrixLayout::kInterleaved16);
        // The layout really moved bytes (a copy would pass the checks below trivially).
        EXPECT_NE(std::memcmp(p.plain_bytes.data(), p.packed_bytes.data(), 16 * MatrixRowBytes(type, cols)), 0);
        uint8_t scratch_a[256], scratch_b[256];  // one plain block (≤ 210 bytes)
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t b = 0; b < cols / d.block_elems; ++b) {
            ASSERT_EQ(std::memcmp(PlainBlock(p.plain, r, b, scratch_a), PlainBlock(p.packed, r, b, scratch_b),
                                  d.block_bytes), 0) << "row " << r << " block " << b;
          }
          std::vector<float> a(cols), b(cols);
          DecodeWeightRow(p.plain, r, a.data());
          DecodeWeightRow(p.packed, r, b.data());
          ASSERT_TRUE(SameBits(a, b)) << "row " << r;
          for (int64_t c : {int64_t{0}, cols / 2 + 1, cols - 1}) {
            ASSERT_EQ(DecodeWeight(p.plain, r, c), DecodeWeight(p.packed, r, c));
          }
        }
        // The quantised reference reads the repacked matrix as the plain one.
        const std::vector<float> x = RandomX(cols, seed++);
        std::vector<QuantizedProductReference> ra(rows), rb(rows);
        MatVecQuantizedReference(p.plain, x.data(), ra.data());
        MatVecQuantizedReference(p.packed, x.data(), rb.data());
        for (int64_t r = 0; r < rows; ++r) {
          ASSERT_EQ(ra[r].y, rb[r].y);
          ASSERT_EQ(ra[r].abs_sum, rb[r].abs_sum);
        }
      }
    }
  }
}

TEST(Repack, EveryTargetWithinTheBoundAndTheSameBits) {
  uint32_t seed = 200;
  for (WeightType type : kTypes) {
    const WeightTypeDesc& d = *FindWeightType(type);
    double worst_ratio = 0;
    // 117 rows: 7 groups, which Q1_0's lookup kernel runs as blocks of 4 and 3 groups, and a tail.
    for (int64_t rows : {16, 21, 32, 37, 117}) {
      for (int64_t cols : ColsFor(type, false)) {
        SCOPED_TRACE(::testing::Message() << d.label << " " << rows << "x" << cols);
        const Pair p = MakePair(type, rows, cols, seed++);
        const std::vector<float> x = RandomX(cols, seed++);
        std::vector<QuantizedProductReference> ref(rows);
        MatVecQuantizedReference(p.plain, x.data(), ref.data());
        std::vector<float> first;  // the first target's result: every target gives these bits
        for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
          TargetScope scope(target);
          SCOPED_TRACE(hwy::TargetName(target));
          ASSERT_NE(d.kernels().interleaved_rows, nullptr);
          std::vector<float> y(rows, NAN);
          MatVec(p.packed, x.data(), y.data(), ThreadPool::Shared(1));
          const int64_t grouped = rows / kInterleaveRows * kInterleaveRows;
          for (int64_t r = 0; r < rows; ++r) {
            // Grouped rows: the interleaved kernel's bound; the plain tail: the row kernel's.
            const int64_t roundings = r < grouped ? InterleavedRoundings(type) : d.matvec_roundings;
            const double tol = QuantTolerance(cols, ref[r].abs_sum, roundings);
            const double err = std::fabs(static_cast<double>(y[r]) - ref[r].y);
            ASSERT_LE(err, tol) << "row " << r << ": kernel " << y[r] << " reference " << ref[r].y;
            if (tol > 0 && r < grouped) worst_ratio = std::max(worst_ratio, err / tol);
          }
          // The tail rows are the row kernels' result on the plain rows, bit for bit.
          std::vector<float> plain(rows, NAN);
          MatVec(p.plain, x.data(), plain.data(), ThreadPool::Shared(1));
          ASSERT_EQ(std::memcmp(plain.data() + grouped, y.data() + grouped, 4 * (rows - grouped)), 0);
          // The grouped rows (the tail's row kernels depend on the target, as matvec.h says).
          if (RowKernelBits(type)) {
            ASSERT_EQ(std::memcmp(plain.data(), y.data(), 4 * grouped), 0);  // this target's row kernel
          } else if (first.empty()) {
            first = y;
          } else {
            ASSERT_EQ(std::memcmp(first.data(), y.data(), 4 * grouped), 0);
          }
        }
      }
    }
    std::printf("%-5s interleaved: worst |kernel - ref| / tolerance = %.3g\n", d.label, worst_ratio);
  }
}

TEST(Repack, MatMulIsMatVecPerTokenBitForBitAndThreadsChangeNoBit) {
  uint32_t seed = 300;
  for (WeightType type : kTypes) {
    const WeightTypeDesc& d = *FindWeightType(type);
    for (int64_t rows : {16, 29, 37, 64}) {
      const int64_t cols = 2048;  // 37 and 64 rows: rows·cols ≥ 2^16, so MatVec and MatMul use the threads
      SCOPED_TRACE(::testing::Message() << d.label << " " << rows << "x" << cols);
      const Pair p = MakePair(type, rows, cols, seed++);
      // Up to 21 tokens: every step size the interleaved kernels have (up to 10 tokens a step on
      // AVX3_DL), in one step or in several of balanced sizes (11 = 6 + 5, 21 = 7 + 7 + 7).
      constexpr int64_t kMaxTokens = 21;
      const std::vector<float> x = RandomX(kMaxTokens * cols, seed++);  // [kMaxTokens][cols]
      for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
        TargetScope scope(target);
        SCOPED_TRACE(hwy::TargetName(target));
        std::vector<std::vector<float>> per_token(kMaxTokens, std::vector<float>(rows));
        for (int64_t t = 0; t < kMaxTokens; ++t) {
          MatVec(p.packed, x.data() + t * cols, per_token[t].data(), ThreadPool::Shared(1));
          std::vector<float> threaded(rows, NAN);
          MatVec(p.packed, x.data() + t * cols, threaded.data(), ThreadPool::Shared(3));
          ASSERT_TRUE(SameBits(per_token[t], threaded)) << "token " << t;
        }
        for (int64_t n = 1; n <= kMaxTokens; ++n) {
          for (int32_t threads : {1, 2}) {
            std::vector<float> mm(n * rows, NAN);  // [n][rows]
            MatMul(p.packed, x.data(), n, mm.data(), ThreadPool::Shared(threads));
            for (int64_t t = 0; t < n; ++t) {
              ASSERT_EQ(std::memcmp(mm.data() + t * rows, per_token[t].data(), 4 * rows), 0)
                  << n << " tokens, token " << t << ", " << threads << " threads";
            }
          }
        }
      }
    }
  }
}

TEST(Repack, NonFiniteActivationGivesNaNAndZeroGivesZero) {
  for (WeightType type : kTypes) {
    const Pair p = MakePair(type, 17, 256, 400);
    for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
      TargetScope scope(target);
      SCOPED_TRACE(hwy::TargetName(target));
      std::vector<float> x = RandomX(256, 401), y(17, 0.0f);
      x[100] = std::numeric_limits<float>::infinity();
      MatVec(p.packed, x.data(), y.data(), ThreadPool::Shared(1));
      for (float v : y) ASSERT_TRUE(std::isnan(v));
      x[100] = std::numeric_limits<float>::quiet_NaN();
      MatVec(p.packed, x.data(), y.data(), ThreadPool::Shared(1));
      for (float v : y) ASSERT_TRUE(std::isnan(v));
      std::vector<float> zero(256, 0.0f);
      std::fill(y.begin(), y.end(), 1.0f);
      MatVec(p.packed, zero.data(), y.data(), ThreadPool::Shared(1));
      for (float v : y) ASSERT_EQ(v, 0.0f);
    }
  }
}

TEST(Repack, MatMulGroupEqualsEachMatMulAloneBitForBit) {
  // One input, several matrices of mixed types and layouts (so more than one quantised activation
  // form), handed out as one job: each output must equal MatMul of its matrix alone, for any
  // thread count and token count, whatever the order of the group.
  constexpr int64_t kCols = 512;
  std::vector<Pair> pairs;
  pairs.push_back(MakePair(WeightType::kQ4_0, 48, kCols, 1));
  pairs.push_back(MakePair(WeightType::kQ6_K, 33, kCols, 2));
  pairs.push_back(MakePair(WeightType::kQ4_K, 20, kCols, 3));
  pairs.push_back(MakePair(WeightType::kQ8_0, 40, kCols, 4));
  pairs.push_back(MakePair(WeightType::kQ1_0, 35, kCols, 5));
  pairs.push_back(MakePair(WeightType::kQ2_0, 19, kCols, 6));
  std::vector<Matrix> matrices = {pairs[0].packed, pairs[1].packed, pairs[2].plain, pairs[3].plain, pairs[4].packed,
                                  pairs[4].plain,  pairs[5].packed};
  ThreadPool one(1);
  for (int64_t n : {1, 3, 7}) {
    const std::vector<float> x = RandomX(n * kCols, 10 + static_cast<uint32_t>(n));
    std::vector<std::vector<float>> alone(matrices.size());
    for (size_t i = 0; i < matrices.size(); ++i) {
      alone[i].resize(n * matrices[i].rows);
      MatMul(matrices[i], x.data(), n, alone[i].data(), one);
    }
    for (int32_t threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      for (const bool reversed : {false, true}) {
        std::vector<std::vector<float>> grouped(matrices.size());
        std::vector<MatMulOutput> outs;
        for (size_t j = 0; j < matrices.size(); ++j) {
          const size_t i = reversed ? matrices.size() - 1 - j : j;
          grouped[i].assign(n * matrices[i].rows, -1.0f);
          outs.push_back({.w = &matrices[i], .y = grouped[i].data()});
        }
        MatMulGroup(outs, x.data(), n, pool);
        for (size_t i = 0; i < matrices.size(); ++i) {
          EXPECT_TRUE(SameBits(grouped[i], alone[i]))
              << "matrix " << i << ", " << n << " tokens, " << threads << " threads, reversed " << reversed;
        }
      }
    }
  }
}

TEST(Repack, MatMulRunsEqualsEachMatMulOfItsTokensBitForBit) {
  // One input of 9 tokens; runs of mixed types and layouts (so more than one quantised activation
  // form), each over its own stretch of the tokens (a mixture of experts' block: each expert over
  // the rows routed to it), one of them empty: each run's output must equal MatMul of its matrix
  // over its tokens alone, for any thread count — so the run reads its own tokens' codes from the
  // activation quantised whole, and writes only its own output.
  constexpr int64_t kCols = 512, kTokens = 9;
  std::vector<Pair> pairs;
  pairs.push_back(MakePair(WeightType::kQ4_0, 48, kCols, 21));
  pairs.push_back(MakePair(WeightType::kQ6_K, 33, kCols, 22));
  pairs.push_back(MakePair(WeightType::kQ8_0, 40, kCols, 23));
  pairs.push_back(MakePair(WeightType::kQ4_K, 20, kCols, 24));
  const std::vector<float> x = RandomX(kTokens * kCols, 25);  // [kTokens][kCols]
  struct Stretch {
    Matrix w;
    int64_t first, n;
  };
  const std::vector<Stretch> stretches = {{pairs[0].packed, 0, 2}, {pairs[0].packed, 2, 1},
                                          {pairs[1].packed, 3, 4}, {pairs[2].plain, 3, 4},
                                          {pairs[2].packed, 7, 2}, {pairs[3].plain, 0, 9},
                                          {pairs[3].packed, 5, 0}, {pairs[0].plain, 8, 1}};
  ThreadPool one(1);
  std::vector<std::vector<float>> alone(stretches.size());  // [runs][n][rows]
  for (size_t i = 0; i < stretches.size(); ++i) {
    const Stretch& r = stretches[i];
    alone[i].assign(r.n * r.w.rows, -1.0f);
    MatMul(r.w, x.data() + r.first * kCols, r.n, alone[i].data(), one);
  }
  for (int32_t threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    std::vector<std::vector<float>> together(stretches.size());  // [runs][n][rows]
    std::vector<MatMulRun> runs;
    for (size_t i = 0; i < stretches.size(); ++i) {
      const Stretch& r = stretches[i];
      together[i].assign(r.n * r.w.rows, -1.0f);
      runs.push_back({.w = &r.w, .first_token = r.first, .n_tokens = r.n, .y = together[i].data()});
    }
    MatMulRuns(runs, x.data(), kTokens, pool);
    for (size_t i = 0; i < stretches.size(); ++i) {
      EXPECT_TRUE(SameBits(together[i], alone[i])) << "run " << i << ", " << threads << " threads";
    }
  }
}

TEST(Repack, KQuantMatMulTilesAtOddTokenAndRowCountsAreTokenByTokenBitForBit) {
  // The K-quant MatMul steps several tokens at a time (kquant_interleaved-inl.h): token counts
  // that fill whole steps, leave every remainder after them, or fall short of one step, on
  // odd row counts (a 16-row group or more, plus a tail the row kernels serve) and a single
  // super-block or several per row. Each token's row must equal MatVec of that token alone.
  uint32_t seed = 500;
  for (WeightType type : {WeightType::kQ4_K, WeightType::kQ6_K}) {
    const WeightTypeDesc& d = *FindWeightType(type);
    for (int64_t rows : {17, 35, 48}) {
      for (int64_t cols : {256, 768}) {
        SCOPED_TRACE(::testing::Message() << d.label << " " << rows << "x" << cols);
        const Pair p = MakePair(type, rows, cols, seed++);
        constexpr int64_t kMaxTokens = 23;
        const std::vector<float> x = RandomX(kMaxTokens * cols, seed++);  // [kMaxTokens][cols]
        for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
          TargetScope scope(target);
          SCOPED_TRACE(hwy::TargetName(target));
          std::vector<float> per_token(kMaxTokens * rows, NAN);  // [kMaxTokens][rows]
          for (int64_t t = 0; t < kMaxTokens; ++t) {
            MatVec(p.packed, x.data() + t * cols, per_token.data() + t * rows, ThreadPool::Shared(1));
          }
          for (int64_t n : {5, 8, 9, 11, 13, 15, 16, 19, 23}) {
            std::vector<float> mm(n * rows, NAN);  // [n][rows]
            MatMul(p.packed, x.data(), n, mm.data(), ThreadPool::Shared(1));
            for (int64_t t = 0; t < n; ++t) {
              ASSERT_EQ(std::memcmp(mm.data() + t * rows, per_token.data() + t * rows, 4 * rows), 0)
                  << n << " tokens, token " << t;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvq
