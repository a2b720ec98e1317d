// Integer score arithmetic for int8 / int4 keys (formats/int_score.h): every path the CPU has
// gives exactly the scores of a plain C++ oracle (quantise the head, sum code·q in int64, two f32
// multiplies), scores do not depend on the tile, and the derived bound against the exact product
// holds, is nearly attained, and covers the distance to the f32-arithmetic kernel; a query prepared
// once scores exactly as the unprepared call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/float_codes.h"
#include "formats/codec_helpers.h"
#include "formats/int_score.h"
#include "formats/int_token/int_token.h"
#include "kvq/format.h"

namespace kvq {
namespace {

using int_score::Path;
constexpr double kU = 0x1p-24;  // unit roundoff of f32
double Gamma(int n) { return n * kU / (1.0 - n * kU); }

const Path kPaths[] = {Path::kPortable, Path::kAvx2, Path::kAvx512Vnni};

struct Keys {
  const Codec* codec;
  int bits;
  RowShape shape;
  std::vector<uint8_t> blocks;  // [n_rows] blocks
  int64_t n_rows;
  int64_t bb;
  // Row r, head h: the f16 scale and the centred code of element i.
  float Scale(int64_t r, int32_t h) const {
    return F16ToF32(format_internal::LoadU16(Head(r, h)));
  }
  int32_t Code(int64_t r, int32_t h, int32_t i) const {
    return static_cast<int32_t>(format_internal::UnpackCode(Head(r, h) + 2, i, bits)) - (1 << (bits - 1));
  }
  const uint8_t* Head(int64_t r, int32_t h) const {
    return blocks.data() + r * bb + h * (2 + shape.head_dim * bits / 8);
  }
  RowTile Tile(int64_t r, int32_t n) const { return {blocks.data() + r * bb, bb, 0, n}; }
};

Keys MakeKeys(int bits, RowShape shape, int64_t n_rows, uint32_t seed) {
  const FormatDesc& f = bits == 8 ? Int8Format() : Int4Format();
  Keys k{&f.key, bits, shape, {}, n_rows, f.key.block_bytes(shape)};
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> row(shape.elems());
  k.blocks.resize(n_rows * k.bb);
  const CodecArgs args{.shape = shape};
  for (int64_t r = 0; r < n_rows; ++r) {
    for (float& x : row) x = dist(rng) * (r % 5 == 3 ? 40.0f : 1.0f);  // rows of different scale
    k.codec->encode_block(row.data(), k.blocks.data() + r * k.bb, args);
  }
  return k;
}

// The oracle: fl(fl(s·d)·I) with I summed in int64 from the stored codes.
float OracleScore(const Keys& k, int64_t r, int32_t h, const float* q) {
  const int32_t d = k.shape.head_dim;
  std::vector<int8_t> qq(d);
  float dq;
  int32_t sum;
  int_score::QuantizeHeadReference(q, d, qq.data(), &dq, &sum);
  int64_t dot = 0;
  for (int32_t i = 0; i < d; ++i) dot += int64_t{k.Code(r, h, i)} * qq[i];
  return (k.Scale(r, h) * dq) * static_cast<float>(dot);
}

template <class Fn>
void ForEachCase(Fn fn) {
  const RowShape shapes[] = {{1, 128}, {2, 64}, {2, 256}, {4, 32}, {2, 24}, {1, 8}};
  for (int bits : {8, 4}) {
    for (RowShape shape : shapes) {
      if (!CheckShape(bits == 8 ? Int8Format() : Int4Format(), shape).ok()) continue;
      for (Path path : kPaths) {
        if (!int_score::Supported(path)) continue;
        SCOPED_TRACE(::testing::Message() << "int" << bits << " " << shape.n_kv_heads << "x"
                                          << shape.head_dim << " " << int_score::PathName(path));
        fn(bits, shape, path);
      }
    }
  }
}

std::vector<float> RandomQuery(int32_t n_q, int32_t d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> q(n_q * d);
  for (float& v : q) v = dist(rng);
  return q;
}

TEST(IntScore, EveryPathEqualsTheIntegerOracle) {
  ForEachCase([](int bits, RowShape shape, Path path) {
    const Keys k = MakeKeys(bits, shape, 45, 1);
    const int32_t d = shape.head_dim;
    for (int32_t n_q : {1, 2, 3, 4, 5, 8, 11}) {
      std::vector<float> q = RandomQuery(n_q, d, 7 + n_q);
      q[0] = 0.0f;
      if (n_q > 2) std::fill(q.begin() + 2 * d, q.begin() + 3 * d, 0.0f);  // an all-zero head: scores 0
      std::vector<float> scores(n_q * kMaxTileRows);
      for (int64_t r0 = 0; r0 < k.n_rows; r0 += 19) {
        const int32_t n = static_cast<int32_t>(std::min<int64_t>(19, k.n_rows - r0));
        for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
          int_score::IntTokenScore(path, bits, q.data(), n_q, k.Tile(r0, n), h, {.shape = shape}, scores.data());
          for (int32_t j = 0; j < n_q; ++j) {
            for (int32_t i = 0; i < n; ++i) {
              ASSERT_EQ(scores[j * kMaxTileRows + i], OracleScore(k, r0 + i, h, q.data() + j * d))
                  << "row " << r0 + i << " kv head " << h << " q head " << j << " of " << n_q;
            }
          }
        }
      }
    }
  });
}

TEST(IntScore, ScoresDoNotDependOnTheTile) {
  ForEachCase([](int bits, RowShape shape, Path path) {
    const Keys k = MakeKeys(bits, shape, 40, 2);
    const int32_t d = shape.head_dim, n_q = 4;
    const std::vector<float> q = RandomQuery(n_q, d, 3);
    std::vector<float> one(n_q * kMaxTileRows), many(n_q * kMaxTileRows);
    const int32_t h = shape.n_kv_heads - 1;
    for (int64_t r0 = 0; r0 < 8; ++r0) {
      for (int32_t n = 1; n <= kMaxTileRows; ++n) {
        int_score::IntTokenScore(path, bits, q.data(), n_q, k.Tile(r0, n), h, {.shape = shape}, many.data());
        for (int32_t i = 0; i < n; ++i) {
          int_score::IntTokenScore(path, bits, q.data(), n_q, k.Tile(r0 + i, 1), h, {.shape = shape}, one.data());
          for (int32_t j = 0; j < n_q; ++j) {
            ASSERT_EQ(std::memcmp(&many[j * kMaxTileRows + i], &one[j * kMaxTileRows], 4), 0)
                << "first row " << r0 << " n_rows " << n << " row " << i << " head " << j;
          }
        }
      }
    }
  });
}

// A query prepared once and scored tile by tile gives the unprepared score's bits, for every run
// of its heads (any first head, any count), so attention may prepare a call's heads once and score
// any subset of them.
TEST(IntScore, PreparedQueryScoresEqualTheUnpreparedScore) {
  ForEachCase([](int bits, RowShape shape, Path path) {
    const Keys k = MakeKeys(bits, shape, 45, 4);
    const int32_t d = shape.head_dim, n_all = 11;
    std::vector<float> q = RandomQuery(n_all, d, 5);
    std::fill(q.begin() + 3 * d, q.begin() + 4 * d, 0.0f);  // an all-zero head
    const CodecArgs args{.shape = shape};
    const int64_t head_bytes = int_score::PreparedHeadBytes(d);
    ASSERT_EQ(head_bytes % 64, 0);
    struct alignas(64) Line {
      uint8_t bytes[64];
    };
    std::vector<Line> prepared(n_all * head_bytes / 64);  // [n_all][head_bytes]
    int_score::PrepareQuery(path, bits, q.data(), n_all, args, prepared.data()->bytes);
    std::vector<float> want(n_all * kMaxTileRows), got(n_all * kMaxTileRows);
    for (int32_t first = 0; first < n_all; ++first) {
      for (int32_t n = 1; first + n <= n_all; ++n) {
        for (int64_t r0 = 0; r0 < k.n_rows; r0 += 19) {
          const int32_t rows = static_cast<int32_t>(std::min<int64_t>(19, k.n_rows - r0));
          const int32_t h = static_cast<int32_t>(r0 % shape.n_kv_heads);
          int_score::IntTokenScore(path, bits, q.data() + first * d, n, k.Tile(r0, rows), h, args, want.data());
          int_score::ScorePrepared(path, bits, prepared.data()->bytes + first * head_bytes, n, k.Tile(r0, rows), h,
                                   args, got.data());
          for (int32_t j = 0; j < n; ++j) {
            ASSERT_EQ(std::memcmp(&want[j * kMaxTileRows], &got[j * kMaxTileRows], 4 * rows), 0)
                << "heads [" << first << ", " << first + n << ") row " << r0 << " head " << j;
          }
        }
      }
    }
  });
}

// The bound of int_score.h for one (row, head): quantisation + γ_2, and the exact product.
struct Bound {
  double exact = 0;        // s · Σ q_i·c_i
  double quantise = 0;     // s · Q · Σ |c_i| + γ_2 · |s·d·I|
  double f32_kernel = 0;   // γ_{d+1} · s · Σ |q_i·c_i|
};
Bound BoundFor(const Keys& k, int64_t r, int32_t h, const float* q) {
  const int32_t d = k.shape.head_dim;
  std::vector<int8_t> qq(d);
  float dq;
  int32_t sum;
  int_score::QuantizeHeadReference(q, d, qq.data(), &dq, &sum);
  float amax = 0;
  for (int32_t i = 0; i < d; ++i) amax = std::max(amax, std::fabs(q[i]));
  const double s = k.Scale(r, h);
  const double per_element = dq > 0 ? dq * (0.5 + 0x1p-15) : amax;
  double exact = 0, abs_c = 0, abs_qc = 0, dot = 0;
  for (int32_t i = 0; i < d; ++i) {
    exact += double{q[i]} * k.Code(r, h, i);
    abs_c += std::abs(k.Code(r, h, i));
    abs_qc += std::fabs(double{q[i]} * k.Code(r, h, i));
    dot += static_cast<double>(qq[i]) * k.Code(r, h, i);
  }
  return {s * exact, s * per_element * abs_c + Gamma(2) * std::fabs(s * dq * dot), Gamma(d + 1) * s * abs_qc};
}

TEST(IntScore, WithinTheDerivedBoundOfTheExactProductAndOfTheF32Kernel) {
  ForEachCase([](int bits, RowShape shape, Path path) {
    if (path != int_score::Best()) return;  // every path has the same bits (test above)
    const Keys k = MakeKeys(bits, shape, 32, 4);
    const int32_t d = shape.head_dim, n_q = 5;
    const std::vector<float> q = RandomQuery(n_q, d, 5);
    std::vector<float> got(n_q * kMaxTileRows), f32(n_q * kMaxTileRows);
    const CodecKernels& kernels = k.codec->kernels();
    for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
      int_score::IntTokenScore(path, bits, q.data(), n_q, k.Tile(0, kMaxTileRows), h, {.shape = shape}, got.data());
      kernels.score_f32(q.data(), n_q, k.Tile(0, kMaxTileRows), h, {.shape = shape}, f32.data());
      for (int32_t j = 0; j < n_q; ++j) {
        for (int32_t i = 0; i < kMaxTileRows; ++i) {
          const Bound b = BoundFor(k, i, h, q.data() + j * d);
          const float score = got[j * kMaxTileRows + i];
          ASSERT_LE(std::fabs(score - b.exact), b.quantise) << "row " << i << " head " << j;
          ASSERT_LE(std::fabs(double{score} - f32[j * kMaxTileRows + i]), b.quantise + b.f32_kernel)
              << "row " << i << " head " << j;
        }
      }
    }
  });
}

// Queries whose every element sits 0.49 of a step from its integer, on the side that makes the
// quantisation error add up with the key's codes: the error reaches over 95% of the bound. `side`
// +1 puts q above the codes' direction (the quantised score is too small), −1 below; with
// |q_i| / step growing with the codes, a scale off by 1/2000 in either direction breaks the bound.
TEST(IntScore, TheBoundIsNearlyAttained) {
  for (int bits : {8, 4}) {
    const RowShape shape{1, 128};
    const Keys k = MakeKeys(bits, shape, 4, 6);
    for (int side : {+1, -1}) {
      for (int64_t r = 0; r < k.n_rows; ++r) {
        SCOPED_TRACE(::testing::Message() << "int" << bits << " row " << r << " side " << side);
        const float step = 0x1p-5f;  // a power of two: d = step and inv = 1/step exactly
        std::mt19937 rng(10 + r);
        std::uniform_int_distribution<int> mag(20, 120);
        std::vector<float> q(shape.head_dim);
        for (int32_t i = 1; i < shape.head_dim; ++i) {
          const int32_t c = k.Code(r, 0, i);
          const float dir = c > 0 ? 1.0f : c < 0 ? -1.0f : 0.0f;
          q[i] = (dir * mag(rng) + side * 0.49f * dir) * step;
        }
        q[0] = 127.0f * step;  // amax, exactly representable: no quantisation error at i = 0
        float score;
        int_score::IntTokenScore(int_score::Best(), bits, q.data(), 1, k.Tile(r, 1), 0, {.shape = shape}, &score);
        const Bound b = BoundFor(k, r, 0, q.data());
        EXPECT_LE(std::fabs(score - b.exact), b.quantise);
        EXPECT_GE(std::fabs(score - b.exact), 0.95 * b.quantise);
      }
    }
  }
}

TEST(IntScore, NonFiniteQueryGivesNaNScores) {
  const Keys k = MakeKeys(8, {1, 64}, 2, 8);
  for (Path path : kPaths) {
    if (!int_score::Supported(path)) continue;
    std::vector<float> q = RandomQuery(2, 64, 9);
    q[5] = std::numeric_limits<float>::infinity();
    std::vector<float> scores(2 * kMaxTileRows);
    int_score::IntTokenScore(path, 8, q.data(), 2, k.Tile(0, 2), 0, {.shape = {1, 64}}, scores.data());
    EXPECT_TRUE(std::isnan(scores[0]) && std::isnan(scores[1])) << int_score::PathName(path);
    EXPECT_FALSE(std::isnan(scores[kMaxTileRows]));  // the other head is unaffected
  }
}

TEST(IntScore, ScoreArithmeticSelectsTheKernelsScore) {
  for (const FormatDesc* f : {&Int8Format(), &Int4Format()}) {
    EXPECT_NE(f->key.kernels().score_int, nullptr);
    EXPECT_EQ(f->key.kernels().score, f->key.kernels().score_int) << f->name << ": integer is the default";
    SetScoreArithmetic(ScoreArithmetic::kF32);
    EXPECT_EQ(f->key.kernels().score, f->key.kernels().score_f32) << f->name;
    SetScoreArithmetic(ScoreArithmetic::kInteger);
  }
  for (const FormatDesc* f : {&Int8Format(), &Int4Format()}) {  // the prepared-query hooks go with score_int
    EXPECT_NE(f->key.kernels().prepare_query, nullptr) << f->name;
    EXPECT_NE(f->key.kernels().score_prepared, nullptr) << f->name;
    EXPECT_NE(f->key.kernels().prepared_head_bytes, nullptr) << f->name;
    SetScoreArithmetic(ScoreArithmetic::kF32);
    EXPECT_EQ(f->key.kernels().prepare_query, nullptr) << f->name << ": f32 scores have no prepared query";
    SetScoreArithmetic(ScoreArithmetic::kInteger);
  }
  EXPECT_EQ(Int2Format().key.kernels().prepare_query, nullptr);
  EXPECT_EQ(Int2Format().key.kernels().score_int, nullptr);
  EXPECT_EQ(Int2Format().key.kernels().score, Int2Format().key.kernels().score_f32);
}

}  // namespace
}  // namespace kvq
