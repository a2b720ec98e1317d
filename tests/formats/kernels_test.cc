// Every codec's SIMD kernels, on every SIMD target compiled in, against the codec's scalar
// reference: accumulate decodes exactly what decode_row decodes (bit for bit), score equals the
// reference dot within the summation-order bound, and the online-softmax update matches a double
// computation within its rounding bound.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "formats/int_token/int_token.h"
#include "formats/row_sequence.h"
#include "kvq/format.h"
#include "test_util/target_scope.h"

namespace kvq {
namespace {

constexpr double kU = 0x1p-24;  // unit roundoff of f32

using test::TargetScope;  // test_util/target_scope.h

struct Stored {
  std::vector<float> x;        // the input rows
  std::vector<uint8_t> blocks;  // complete blocks only
  CodecArgs args;
  int64_t n_rows;
};

Stored Encode(const Codec& codec, RowShape shape, int64_t n_blocks, uint32_t seed) {
  Stored s;
  s.n_rows = n_blocks * codec.rows_per_block;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  s.x.resize(s.n_rows * shape.elems());
  for (float& v : s.x) v = dist(rng);
  s.args = {.shape = shape};
  if (codec.calibrated) s.args.tensor_scale = codec.calibrate(s.x.data(), s.x.size());
  const int64_t bb = codec.block_bytes(shape);
  s.blocks.resize(n_blocks * bb);
  for (int64_t b = 0; b < n_blocks; ++b) {
    codec.encode_block(s.x.data() + b * codec.rows_per_block * shape.elems(), s.blocks.data() + b * bb,
                       s.args);
  }
  return s;
}

RowTile Tile(const Codec& codec, const Stored& s, int64_t row, int32_t n) {
  const int64_t bb = codec.block_bytes(s.args.shape);
  const int32_t per = codec.rows_per_block;
  return {s.blocks.data() + (row / per) * bb, bb, static_cast<int32_t>(row % per), n};
}

template <class Fn>
void ForEachCodecShapeAndTarget(Fn fn) {
  const RowShape shapes[] = {{2, 16}, {4, 8}, {1, 128}, {2, 24}};
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    TargetScope scope(target);
    for (const FormatDesc* f : Formats()) {
      for (RowShape shape : shapes) {
        if (!CheckShape(*f, shape).ok()) continue;
        for (const Codec* codec : {&f->key, &f->value}) {
          SCOPED_TRACE(::testing::Message() << hwy::TargetName(target) << " " << f->name << " "
                                            << (codec == &f->key ? "K" : "V") << " "
                                            << shape.n_kv_heads << "x" << shape.head_dim);
          ASSERT_STREQ(codec->kernels().target, hwy::TargetName(target));
          fn(*codec, shape);
        }
      }
    }
  }
}

TEST(CodecKernels, AccumulateDecodesExactlyLikeTheReference) {
  ForEachCodecShapeAndTarget([](const Codec& codec, RowShape shape) {
    const Stored s = Encode(codec, shape, 2, 1);
    std::vector<float> want(shape.elems());
    float c[kMaxTileRows], e[kMaxTileRows];
    std::fill(c, c + kMaxTileRows, 1.0f);
    std::fill(e, e + kMaxTileRows, 1.0f);
    for (int64_t r = 0; r < s.n_rows; ++r) {
      codec.decode_row(Tile(codec, s, r, 1).block, Tile(codec, s, r, 1).first_row, want.data(), s.args);
      for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
        std::vector<float> acc(shape.head_dim, 0.0f);  // acc = 0·1 + 1·x = x exactly
        codec.kernels().accumulate(c, e, 1, Tile(codec, s, r, 1), h, s.args, acc.data());
        for (int32_t i = 0; i < shape.head_dim; ++i) {
          ASSERT_EQ(acc[i], want[h * shape.head_dim + i]) << "row " << r << " head " << h << " i " << i;
        }
      }
    }
  });
}

// Every code byte through accumulate, bit for bit as decode_row, on every target: encoded rows
// never hold int4's or int2's lowest code (x/s ≥ −(2^(b−1) − 1)), so the random rows above leave
// that entry of a vector unpacker's lookup table unread. Head 0 holds the 256 byte values in
// order, head 1 in reverse, each with its own f16 scale (0.375 = 0x3600, 1.5 = 0x3E00).
TEST(CodecKernels, IntTokenAccumulateDecodesEveryCodeByte) {
  const struct {
    const FormatDesc& format;
    int32_t bits;
  } formats[] = {{Int8Format(), 8}, {Int4Format(), 4}, {Int2Format(), 2}};
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    TargetScope scope(target);
    for (const auto& [format, bits] : formats) {
      const Codec& codec = format.value;
      const RowShape shape{2, 256 * 8 / bits};  // 256 code bytes per head
      SCOPED_TRACE(::testing::Message() << hwy::TargetName(target) << " " << format.name);
      const CodecArgs args{.shape = shape};
      std::vector<uint8_t> block;  // [2][f16 scale, 256 code bytes]
      for (const uint16_t scale : {uint16_t{0x3600}, uint16_t{0x3E00}}) {
        block.push_back(static_cast<uint8_t>(scale & 0xFF));
        block.push_back(static_cast<uint8_t>(scale >> 8));
        for (int32_t b = 0; b < 256; ++b) block.push_back(static_cast<uint8_t>(scale == 0x3600 ? b : 255 - b));
      }
      ASSERT_EQ(static_cast<int64_t>(block.size()), codec.block_bytes(shape));
      std::vector<float> want(shape.elems());
      codec.decode_row(block.data(), 0, want.data(), args);
      float c[kMaxTileRows], e[kMaxTileRows];
      std::fill(c, c + kMaxTileRows, 1.0f);
      std::fill(e, e + kMaxTileRows, 1.0f);
      for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
        std::vector<float> acc(shape.head_dim, 0.0f);  // acc = 0·1 + 1·x' = x' exactly
        codec.kernels().accumulate(c, e, 1, RowTile{block.data(), codec.block_bytes(shape), 0, 1}, h, args,
                                   acc.data());
        for (int32_t i = 0; i < shape.head_dim; ++i) {
          ASSERT_EQ(acc[i], want[h * shape.head_dim + i]) << "head " << h << " element " << i;
        }
      }
    }
  }
}

TEST(CodecKernels, ScoreF32MatchesReferenceDotWithinSummationBound) {
  ForEachCodecShapeAndTarget([](const Codec& codec, RowShape shape) {
    const Stored s = Encode(codec, shape, 2, 2);
    const int32_t d = shape.head_dim;
    std::mt19937 rng(9);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (int32_t n_q : {1, 3, 8, 11}) {
      std::vector<float> q(n_q * d);
      for (float& v : q) v = dist(rng);
      std::vector<float> scores(n_q * kMaxTileRows), row(shape.elems());
      for (int64_t r0 = 0; r0 < s.n_rows; r0 += 7) {
        const int32_t n = static_cast<int32_t>(std::min<int64_t>(7, s.n_rows - r0));
        RowTile t = Tile(codec, s, r0, n);
        if (codec.rows_per_block > 1) t.n_rows = std::min(n, codec.rows_per_block - t.first_row);
        for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
          codec.kernels().score_f32(q.data(), n_q, t, h, s.args, scores.data());
          for (int32_t i = 0; i < t.n_rows; ++i) {
            const RowTile one = Tile(codec, s, r0 + i, 1);
            codec.decode_row(one.block, one.first_row, row.data(), s.args);
            for (int32_t j = 0; j < n_q; ++j) {
              double magnitude = 0;
              for (int32_t k = 0; k < d; ++k) magnitude += std::fabs(double{q[j * d + k]} * row[h * d + k]);
              const float ref = codec.dot(q.data() + j * d, one.block, one.first_row, h, s.args);
              // Two f32 sums of the same d products in different orders each err by at most
              // γ_d · Σ|q·x| (γ_d = d·u / (1 − d·u)): they differ by at most twice that.
              const double bound = 2.0 * d * kU / (1.0 - d * kU) * magnitude;
              ASSERT_NEAR(scores[j * kMaxTileRows + i], ref, bound) << "row " << r0 + i << " q " << j;
            }
          }
        }
      }
    }
  });
}

TEST(CodecKernels, AccumulateMatchesDoubleRecurrenceWithinRounding) {
  ForEachCodecShapeAndTarget([](const Codec& codec, RowShape shape) {
    const Stored s = Encode(codec, shape, 1, 3);
    const int32_t d = shape.head_dim;
    const int32_t n_q = 5;
    const int32_t n = std::min<int32_t>(kMaxTileRows, static_cast<int32_t>(s.n_rows));
    std::mt19937 rng(4);
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    float c[n_q * kMaxTileRows], e[n_q * kMaxTileRows];
    for (int32_t k = 0; k < n_q * kMaxTileRows; ++k) {
      c[k] = (k % 3 == 0) ? 1.0f : unit(rng);  // some positions keep m (c = 1 exactly)
      e[k] = unit(rng);
    }
    std::vector<float> acc(n_q * d), row(shape.elems());
    for (float& v : acc) v = unit(rng);
    std::vector<double> ref(acc.begin(), acc.end()), bound(acc.size(), 0.0);
    for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
      std::vector<float> got = acc;
      codec.kernels().accumulate(c, e, n_q, Tile(codec, s, 0, n), h, s.args, got.data());
      std::vector<double> want(ref), err(bound);
      for (int32_t i = 0; i < n; ++i) {
        const RowTile one = Tile(codec, s, i, 1);
        codec.decode_row(one.block, one.first_row, row.data(), s.args);
        for (int32_t j = 0; j < n_q; ++j) {
          for (int32_t k = 0; k < d; ++k) {
            double& a = want[j * d + k];
            const double scaled = a * c[j * kMaxTileRows + i];
            // One rounding for acc·c, one for e·x (unless the multiply-add is fused: the
            // portable target's is not), one for the sum and one for e · RowScale (formats
            // that apply a per-row scale to e), each ≤ u·|its result|; the error carried in is
            // scaled by c (≤ 1).
            const double product = double{e[j * kMaxTileRows + i]} * row[h * d + k];
            a = scaled + product;
            err[j * d + k] = err[j * d + k] * c[j * kMaxTileRows + i] +
                             kU * (std::fabs(scaled) + 2.0 * std::fabs(product) + std::fabs(a)) * 1.01;
          }
        }
      }
      for (size_t k = 0; k < got.size(); ++k) {
        ASSERT_NEAR(got[k], want[k], err[k] + 1e-30) << "head " << h << " element " << k;
      }
    }
  });
}

}  // namespace
}  // namespace kvq
