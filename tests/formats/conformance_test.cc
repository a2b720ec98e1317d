// One suite over the whole registry: every format and both of its codecs must keep the same
// contracts — unique ids and names, exact byte accounting, round trips within the codec's own
// error bound, and dot/axpy that equal decode-then-multiply. A new format is covered by adding it
// to the registry; nothing here names a format except where a seed fixes a number.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "formats/row_sequence.h"
#include "kvq/format.h"

namespace kvq {
namespace {

TEST(Registry, IdsAndNamesAreUniqueAndFindable) {
  std::set<int> ids;
  std::set<std::string> names;
  for (const FormatDesc* f : Formats()) {
    EXPECT_TRUE(ids.insert(static_cast<int>(f->id)).second) << f->name;
    EXPECT_TRUE(names.insert(f->name).second) << f->name;
    EXPECT_EQ(*FindFormat(f->name), f);
    EXPECT_EQ(FindFormat(f->id), f);
  }
  // Every FormatId value has an entry: ids are dense from 1 but for retired ones, which find
  // nothing (a snapshot that names one is refused, not misread). 4 was fp8-e4m3 with a per-tensor
  // scale; fp8-e4m3 is 11 since its layout changed.
  const std::set<int> retired = {4};
  const int largest = static_cast<int>(Formats().size() + retired.size());
  EXPECT_EQ(*ids.rbegin(), largest);
  for (int id = 1; id <= largest; ++id) {
    EXPECT_EQ(FindFormat(static_cast<FormatId>(id)) == nullptr, retired.count(id) == 1) << id;
  }
  EXPECT_EQ(static_cast<int>(FindFormat("fp8-e4m3").value()->id), 11);
  const Result<const FormatDesc*> unknown = FindFormat("int3");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("int3"), std::string::npos);
  EXPECT_NE(unknown.status().message().find("fp4-e2m1"), std::string::npos);  // lists known names
}

struct Case {
  const FormatDesc* format;
  const Codec* codec;
  const char* role;
  RowShape shape;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.format->name << " " << c.role << " " << c.shape.n_kv_heads << "x" << c.shape.head_dim;
}

std::string CaseName(const testing::TestParamInfo<Case>& info) {
  std::string n = std::string(info.param.format->name) + "_" + info.param.role + "_" +
                  std::to_string(info.param.shape.n_kv_heads) + "x" +
                  std::to_string(info.param.shape.head_dim);
  for (char& c : n) {
    if (c == '-') c = '_';
  }
  return n;
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  const RowShape shapes[] = {{1, 8}, {4, 8}, {2, 16}, {8, 128}, {1, 256}};
  for (const FormatDesc* f : Formats()) {
    for (RowShape s : shapes) {
      if (!CheckShape(*f, s).ok()) continue;
      cases.push_back({f, &f->key, "K", s});
      cases.push_back({f, &f->value, "V", s});
    }
  }
  return cases;
}

class CodecConformance : public testing::TestWithParam<Case> {
 protected:
  // Gaussian rows with a few outlier channels (as trained models' keys have), so scales vary.
  std::vector<float> Rows(int64_t n, uint32_t seed) const {
    const RowShape s = GetParam().shape;
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(n * s.elems());
    for (int64_t i = 0; i < static_cast<int64_t>(x.size()); ++i) {
      const bool outlier_channel = (i % s.head_dim) == 3;
      x[i] = dist(rng) * (outlier_channel ? 20.0f : 1.0f);
    }
    return x;
  }
};

TEST_P(CodecConformance, RoundTripWithinTheCodecsOwnBound) {
  const Case& c = GetParam();
  const int64_t n = 4 * c.codec->rows_per_block + 3;  // complete blocks and a residual
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    const std::vector<float> x = Rows(n, seed);
    RowSequence seq(*c.codec, c.shape);
    seq.Append(x.data(), n);
    const int64_t block_bytes = c.codec->block_bytes(c.shape);
    std::vector<uint8_t> block(block_bytes);
    for (int64_t b = 0; b + c.codec->rows_per_block <= n; b += c.codec->rows_per_block) {
      c.codec->encode_block(x.data() + b * c.shape.elems(), block.data(), seq.args());
      for (int32_t r = 0; r < c.codec->rows_per_block; ++r) {
        std::vector<float> out(c.shape.elems());
        c.codec->decode_row(block.data(), r, out.data(), seq.args());
        std::vector<float> via_seq(c.shape.elems());
        seq.DecodeRow(b + r, via_seq.data());
        ASSERT_EQ(out, via_seq);
        for (int32_t h = 0; h < c.shape.n_kv_heads; ++h) {
          for (int32_t i = 0; i < c.shape.head_dim; ++i) {
            const int64_t k = static_cast<int64_t>(h) * c.shape.head_dim + i;
            const float xi = x[(b + r) * c.shape.elems() + k];
            const float bound = c.codec->error_bound(xi, block.data(), r, h, i, seq.args());
            ASSERT_LE(std::fabs(xi - out[k]), bound)
                << "row " << b + r << " head " << h << " i " << i << " x " << xi;
          }
        }
      }
    }
  }
}

// The same contract at scales where f16 scales go subnormal or underflow to zero, and where
// integer scales grow large (values stay within f16's range, which every format here assumes).
TEST_P(CodecConformance, RoundTripWithinBoundAtExtremeScales) {
  const Case& c = GetParam();
  const int64_t n = 2 * c.codec->rows_per_block;
  for (float scale : {1e-9f, 1e-6f, 1e-3f, 1e2f, 5e2f}) {
    std::vector<float> x = Rows(n, 17);
    for (float& v : x) v *= scale;
    RowSequence seq(*c.codec, c.shape);
    seq.Append(x.data(), n);
    std::vector<uint8_t> block(c.codec->block_bytes(c.shape));
    std::vector<float> out(c.shape.elems());
    for (int64_t b = 0; b < n; b += c.codec->rows_per_block) {
      c.codec->encode_block(x.data() + b * c.shape.elems(), block.data(), seq.args());
      for (int32_t r = 0; r < c.codec->rows_per_block; ++r) {
        c.codec->decode_row(block.data(), r, out.data(), seq.args());
        for (int64_t k = 0; k < c.shape.elems(); ++k) {
          const float xi = x[(b + r) * c.shape.elems() + k];
          const float bound = c.codec->error_bound(
              xi, block.data(), r, static_cast<int32_t>(k / c.shape.head_dim),
              static_cast<int32_t>(k % c.shape.head_dim), seq.args());
          ASSERT_LE(std::fabs(xi - out[k]), bound) << "scale " << scale << " x " << xi;
        }
      }
    }
  }
}

// The bound must be tight enough to mean something: over many rows the worst error reaches at
// least 80% of what the bound allows somewhere (a loose bound would never be approached). f32 is
// exact: bound 0, error 0.
TEST_P(CodecConformance, ErrorBoundIsTight) {
  const Case& c = GetParam();
  const int64_t n = 64 * c.codec->rows_per_block;
  const std::vector<float> x = Rows(n, 5);
  RowSequence seq(*c.codec, c.shape);
  seq.Append(x.data(), n);
  std::vector<uint8_t> block(c.codec->block_bytes(c.shape));
  std::vector<float> out(c.shape.elems());
  double worst_ratio = 0.0, worst_error = 0.0;
  for (int64_t b = 0; b < n; b += c.codec->rows_per_block) {
    c.codec->encode_block(x.data() + b * c.shape.elems(), block.data(), seq.args());
    for (int32_t r = 0; r < c.codec->rows_per_block; ++r) {
      c.codec->decode_row(block.data(), r, out.data(), seq.args());
      for (int64_t k = 0; k < c.shape.elems(); ++k) {
        const float xi = x[(b + r) * c.shape.elems() + k];
        const float err = std::fabs(xi - out[k]);
        const float bound = c.codec->error_bound(xi, block.data(), r,
                                                 static_cast<int32_t>(k / c.shape.head_dim),
                                                 static_cast<int32_t>(k % c.shape.head_dim),
                                                 seq.args());
        worst_error = std::max<double>(worst_error, err);
        if (bound > 0) worst_ratio = std::max<double>(worst_ratio, err / bound);
      }
    }
  }
  if (c.format->id == FormatId::kF32) {
    EXPECT_EQ(worst_error, 0.0);
  } else {
    EXPECT_GT(worst_ratio, 0.8);
  }
}

TEST_P(CodecConformance, DotAndAxpyEqualDecodeThenMultiply) {
  const Case& c = GetParam();
  const int64_t n = c.codec->rows_per_block + 1;
  const std::vector<float> x = Rows(n, 11);
  RowSequence seq(*c.codec, c.shape);
  seq.Append(x.data(), n);
  std::mt19937 rng(2);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> q(c.shape.head_dim);
  for (float& v : q) v = dist(rng);
  std::vector<float> row(c.shape.elems());
  for (int64_t p = 0; p < n; ++p) {
    seq.DecodeRow(p, row.data());
    for (int32_t h = 0; h < c.shape.n_kv_heads; ++h) {
      const float* xh = row.data() + static_cast<int64_t>(h) * c.shape.head_dim;
      float dot = 0.0f;
      std::vector<float> acc(c.shape.head_dim, 0.25f), want(c.shape.head_dim, 0.25f);
      for (int32_t i = 0; i < c.shape.head_dim; ++i) {
        dot += q[i] * xh[i];
        want[i] += 0.75f * xh[i];
      }
      seq.Axpy(0.75f, p, h, acc.data());
      ASSERT_EQ(seq.Dot(q.data(), p, h), dot) << "p " << p << " h " << h;
      ASSERT_EQ(acc, want) << "p " << p << " h " << h;
    }
  }
}

TEST_P(CodecConformance, BytesMatchTheAccounting) {
  const Case& c = GetParam();
  RowSequence seq(*c.codec, c.shape);
  const std::vector<float> x = Rows(1, 3);
  for (int64_t n = 0; n <= 2 * c.codec->rows_per_block + 5; ++n) {
    ASSERT_EQ(seq.bytes(), BytesForRows(*c.codec, c.shape, n)) << n;
    seq.Append(x.data(), 1);
  }
  // Bits per number is the block's bits over its numbers, exactly.
  EXPECT_DOUBLE_EQ(BitsPerNumber(*c.codec, c.shape) * c.codec->rows_per_block * c.shape.elems(),
                   8.0 * c.codec->block_bytes(c.shape));
}

TEST_P(CodecConformance, EncodingIsDeterministicAndWritesEveryByte) {
  const Case& c = GetParam();
  const std::vector<float> x = Rows(c.codec->rows_per_block, 9);
  CodecArgs args{.shape = c.shape};
  if (c.codec->calibrated) args.tensor_scale = c.codec->calibrate(x.data(), x.size());
  std::vector<uint8_t> a(c.codec->block_bytes(c.shape), 0x00), b(a.size(), 0xFF);
  c.codec->encode_block(x.data(), a.data(), args);
  c.codec->encode_block(x.data(), b.data(), args);
  EXPECT_EQ(a, b);  // no byte depends on what the buffer held before
}

INSTANTIATE_TEST_SUITE_P(AllFormats, CodecConformance, testing::ValuesIn(AllCases()), CaseName);

}  // namespace
}  // namespace kvq
