// Tests of the int4-kivi / int2-kivi formats (src/format/kivi) and of RowSequence's f32 residual
// for their key codec (src/format/row_sequence.h).
//
// The codecs are checked against a plain reference quantiser written here from the KIVI formula
// documented in kivi.h — z = roundF16(min), s = roundF16((max - z) / (2^b - 1)),
// raw = clamp(roundHalfEven((x - z) / s), 0, 2^b - 1), x' = raw·s + z, z and s saturating at
// ±65504 — with its own f16 rounding and its own min/max, so a slip in either (or in the packing)
// shows up as a bit difference. Keys take min/max per channel over a group of 32 tokens, values
// per token per head row. On top of the bit-exact comparison the tests check:
//   - RowSequence keeps the newest < 32 key rows exactly (f32) and quantises a group when its
//     32nd row arrives, and its byte count is BytesForRows at every length;
//   - the key scale is per channel: an outlier channel does not cost the other channels precision
//     (KIVI's motivation), whereas a per-token scale would;
//   - the round-trip error bound |x - x'| <= s/2 + |min - z| holds element by element;
//   - bits per number, the head_dim rule, and that dot/axpy are exactly "decode, then multiply".
#include "formats/kivi/kivi.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "formats/row_sequence.h"
#include "kvq/format.h"

namespace kvq {
namespace {

constexpr int32_t kG = kKiviGroupRows;

// ---------------------------------------------------------------------------------------------
// Reference implementation, from the spec only (no kvq codec or float_codes function is used).
// ---------------------------------------------------------------------------------------------

// roundF16 with saturation: the nearest IEEE binary16 value (ties to even), as an f32, with
// results beyond ±65504 clamped to ±65504 (where IEEE would give ±inf). f16 has 11 significant
// bits and a smallest exponent of -14 (below it, subnormals with a fixed step of 2^-24); scaling
// by a power of two is exact, and std::nearbyint rounds ties to even in the default rounding mode.
float ReferenceRoundF16Saturated(float f) {
  if (f == 0.0f) return f;
  int e = 0;
  std::frexp(f, &e);                     // |f| = m · 2^e, m in [0.5, 1): floor(log2 |f|) = e - 1
  const int exponent = std::max(e - 1, -14);
  const float ulp = std::ldexp(1.0f, exponent - 10);
  const float rounded = std::nearbyint(f / ulp) * ulp;
  return std::clamp(rounded, -65504.0f, 65504.0f);
}

struct AsymParams {
  float s;
  float z;
};

AsymParams ReferenceParams(float lo, float hi, int bits) {
  const float raw_max = static_cast<float>((1 << bits) - 1);
  const float z = ReferenceRoundF16Saturated(lo);
  const float s = ReferenceRoundF16Saturated((hi - z) / raw_max);
  return {s, z};
}

// x -> raw -> x' for one number.
float ReferenceRoundTrip(float x, AsymParams p, int bits) {
  const float raw_max = static_cast<float>((1 << bits) - 1);
  float raw = 0.0f;
  if (p.s != 0.0f) raw = std::clamp(std::nearbyint((x - p.z) / p.s), 0.0f, raw_max);
  return raw * p.s + p.z;
}

// Float slack on top of the round-trip bound s/2 + |min - z|: a few f32 ulps of |x| + |z| + R·s
// (see RoundTripErrorIsBounded for where they come from).
float RoundTripSlack(float x, AsymParams p, int bits) {
  constexpr float kEps = 0x1p-24f;  // f32 unit roundoff
  const float raw_max = static_cast<float>((1 << bits) - 1);
  return 8 * kEps * (std::fabs(x) + std::fabs(p.z) + raw_max * p.s);
}

// Per-channel quantisation parameters of one key group: rows [G][n_kv_heads][head_dim] ->
// params [n_kv_heads][head_dim].
std::vector<AsymParams> ReferenceKeyParams(const std::vector<float>& rows, RowShape shape,
                                           int bits) {
  const int64_t elems = shape.elems();
  std::vector<AsymParams> params(elems);
  for (int64_t c = 0; c < elems; ++c) {  // c = head · head_dim + channel
    std::vector<float> column;
    for (int32_t r = 0; r < kG; ++r) column.push_back(rows[r * elems + c]);
    const auto [lo, hi] = std::minmax_element(column.begin(), column.end());
    params[c] = ReferenceParams(*lo, *hi, bits);
  }
  return params;
}

// Dequantised rows of one key group: rows [G][n_kv_heads][head_dim] -> same shape.
std::vector<float> ReferenceKiviKeys(const std::vector<float>& rows, RowShape shape, int bits) {
  const int64_t elems = shape.elems();
  const std::vector<AsymParams> params = ReferenceKeyParams(rows, shape, bits);
  std::vector<float> out(rows.size());
  for (int32_t r = 0; r < kG; ++r) {
    for (int64_t c = 0; c < elems; ++c) {
      out[r * elems + c] = ReferenceRoundTrip(rows[r * elems + c], params[c], bits);
    }
  }
  return out;
}

// Per-head-row parameters of one value row: row [n_kv_heads][head_dim] -> params [n_kv_heads].
std::vector<AsymParams> ReferenceValueParams(const float* row, RowShape shape, int bits) {
  std::vector<AsymParams> params;
  for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
    const float* x = row + static_cast<int64_t>(h) * shape.head_dim;
    const auto [lo, hi] = std::minmax_element(x, x + shape.head_dim);
    params.push_back(ReferenceParams(*lo, *hi, bits));
  }
  return params;
}

// Dequantised value row: [n_kv_heads][head_dim] -> same shape.
std::vector<float> ReferenceKiviValue(const float* row, RowShape shape, int bits) {
  const std::vector<AsymParams> params = ReferenceValueParams(row, shape, bits);
  std::vector<float> out(shape.elems());
  for (int64_t i = 0; i < shape.elems(); ++i) {
    out[i] = ReferenceRoundTrip(row[i], params[i / shape.head_dim], bits);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Test data and helpers.
// ---------------------------------------------------------------------------------------------

enum class Data {
  kGaussian,        // N(0, 1)
  kOutlierChannel,  // N(0, 1), one channel per head scaled by 50 (KIVI's outlier channels)
  kGrid,            // integers in [0, 30], with min 0 and max 30 in most channels and head
                    // rows, so (x - z) / s lands on exact halves (ties), and a constant channel
                    // and a constant row (s = 0)
  kBeyondF16,       // N(0, 1) · 2e5: z (and for int2 also s) saturate at ±65504
};

const char* DataName(Data d) {
  switch (d) {
    case Data::kGaussian: return "gaussian";
    case Data::kOutlierChannel: return "outlier-channel";
    case Data::kGrid: return "grid";
    case Data::kBeyondF16: return "beyond-f16";
  }
  return "?";
}

constexpr Data kAllData[] = {Data::kGaussian, Data::kOutlierChannel, Data::kGrid,
                             Data::kBeyondF16};

int32_t OutlierChannel(RowShape shape) { return shape.head_dim / 2 + 1; }

// n_rows rows [n_rows][n_kv_heads][head_dim].
std::vector<float> MakeRows(int64_t n_rows, RowShape shape, Data kind, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::uniform_int_distribution<int> grid(0, 30);
  const int64_t elems = shape.elems();
  std::vector<float> rows(n_rows * elems);
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t e = 0; e < elems; ++e) {
      const int32_t channel = static_cast<int32_t>(e % shape.head_dim);
      float& x = rows[r * elems + e];
      switch (kind) {
        case Data::kGaussian: x = gauss(rng); break;
        case Data::kOutlierChannel:
          x = gauss(rng) * (channel == OutlierChannel(shape) ? 50.0f : 1.0f);
          break;
        case Data::kGrid:
          x = static_cast<float>(grid(rng));
          if (r % kG == 0) x = 0.0f;  // the other channels of a group hold 0 and 30
          if (r % kG == 1) x = 30.0f;
          if (channel == 0) x = 0.0f;  // every head row holds 0 and 30
          if (channel == 1) x = 30.0f;
          if (channel == 2) x = 7.0f;    // a constant key channel: s = 0
          if (r % kG == kG - 1) x = 7.0f;  // a constant value row: s = 0
          break;
        case Data::kBeyondF16: x = gauss(rng) * 2e5f; break;
      }
    }
  }
  return rows;
}

// Bit-for-bit equality of two float arrays, reporting the first few mismatches.
void ExpectSameBits(const float* got, const float* want, int64_t n, const std::string& what) {
  int reported = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i])) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << want[i];
      if (++reported == 5) return;
    }
  }
}

struct FormatCase {
  const FormatDesc* format;
  int bits;
};

// Names the parameter in gtest's messages (instead of a byte dump).
void PrintTo(const FormatCase& c, std::ostream* os) { *os << c.format->name; }

std::vector<FormatCase> KiviFormats() {
  return {{&Int4KiviFormat(), 4}, {&Int2KiviFormat(), 2}};
}

constexpr RowShape kShapes[] = {{1, 8}, {4, 8}, {2, 16}, {8, 128}};

std::string ShapeName(RowShape s) {
  return std::to_string(s.n_kv_heads) + "x" + std::to_string(s.head_dim);
}

// Encodes G key rows into one block.
std::vector<uint8_t> EncodeKeyGroup(const Codec& codec, const std::vector<float>& rows,
                                    const CodecArgs& args) {
  std::vector<uint8_t> block(codec.block_bytes(args.shape));
  codec.encode_block(rows.data(), block.data(), args);
  return block;
}

class KiviTest : public testing::TestWithParam<FormatCase> {
 protected:
  const FormatDesc& format() const { return *GetParam().format; }
  int bits() const { return GetParam().bits; }
  float raw_max() const { return static_cast<float>((1 << bits()) - 1); }
};

// ---------------------------------------------------------------------------------------------
// Codec metadata.
// ---------------------------------------------------------------------------------------------

TEST_P(KiviTest, CodecsDescribeKeysPerGroupAndValuesPerRow) {
  EXPECT_EQ(format().key.element_bits, bits());
  EXPECT_EQ(format().value.element_bits, bits());
  EXPECT_EQ(format().key.rows_per_block, kG);
  EXPECT_EQ(format().value.rows_per_block, 1);
  EXPECT_FALSE(format().key.calibrated);
  EXPECT_FALSE(format().value.calibrated);
  for (RowShape shape : kShapes) {
    // Keys: per head, f16 s and z per channel plus 32 rows of b-bit codes. Values: per head,
    // one f16 s and z plus one row of codes.
    const int64_t d = shape.head_dim;
    EXPECT_EQ(format().key.block_bytes(shape), shape.n_kv_heads * (4 * d + kG * d * bits() / 8))
        << ShapeName(shape);
    EXPECT_EQ(format().value.block_bytes(shape), shape.n_kv_heads * (4 + d * bits() / 8))
        << ShapeName(shape);
  }
}

// ---------------------------------------------------------------------------------------------
// 1. Bit-exact agreement with the reference.
// ---------------------------------------------------------------------------------------------

TEST_P(KiviTest, KeyGroupDecodesExactlyAsReference) {
  const Codec& codec = format().key;
  uint32_t seed = 1;
  for (RowShape shape : kShapes) {
    for (Data data : kAllData) {
      const std::string where = ShapeName(shape) + " " + DataName(data);
      const CodecArgs args{.shape = shape};
      const std::vector<float> rows = MakeRows(kG, shape, data, seed++);
      const std::vector<uint8_t> block = EncodeKeyGroup(codec, rows, args);
      const std::vector<float> want = ReferenceKiviKeys(rows, shape, bits());
      std::vector<float> got(shape.elems());
      for (int32_t r = 0; r < kG; ++r) {
        codec.decode_row(block.data(), r, got.data(), args);
        ExpectSameBits(got.data(), want.data() + r * shape.elems(), shape.elems(),
                       where + " row " + std::to_string(r));
      }
    }
  }
}

TEST_P(KiviTest, ValueRowDecodesExactlyAsReference) {
  const Codec& codec = format().value;
  uint32_t seed = 100;
  for (RowShape shape : kShapes) {
    for (Data data : kAllData) {
      const std::string where = ShapeName(shape) + " " + DataName(data);
      const CodecArgs args{.shape = shape};
      const std::vector<float> rows = MakeRows(kG, shape, data, seed++);
      std::vector<uint8_t> block(codec.block_bytes(shape));
      std::vector<float> got(shape.elems());
      for (int32_t r = 0; r < kG; ++r) {
        const float* row = rows.data() + r * shape.elems();
        codec.encode_block(row, block.data(), args);
        codec.decode_row(block.data(), 0, got.data(), args);
        const std::vector<float> want = ReferenceKiviValue(row, shape, bits());
        ExpectSameBits(got.data(), want.data(), shape.elems(),
                       where + " row " + std::to_string(r));
      }
    }
  }
}

// Of equal numbers (+0 and −0) a channel's or a head's min and max keep the first, and a NaN gives
// way to the other number, on every target: z's sign bit is part of the page's bytes, which the
// WebAssembly module and the WGSL encoders must write as the native build does (std::fmin/fmax
// leave the tie to the C library and the compiler's operand order). The decoded values cannot
// show this (raw·s + ±0 is +0 either way): the bytes are read.
TEST_P(KiviTest, EqualZerosKeepTheFirstSoTheBytesAreTheSameOnEveryTarget) {
  const RowShape shape{1, 8};
  const CodecArgs args{.shape = shape};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Keys, channel by channel down the group's 32 rows: +0,−0,+0,… | −0,+0,… | 16 × −0 then
  // 16 × +0 | NaN then −0,+0,… (the NaN gives way: z is the first zero after it, −0).
  std::vector<float> rows(kG * shape.elems(), 1.0f);  // [kG][1][8]
  for (int32_t r = 0; r < kG; ++r) {
    float* row = rows.data() + r * shape.elems();
    row[0] = r % 2 == 0 ? 0.0f : -0.0f;
    row[1] = r % 2 == 0 ? -0.0f : 0.0f;
    row[2] = r < kG / 2 ? -0.0f : 0.0f;
    row[3] = r == 0 ? nan : r % 2 == 1 ? -0.0f : 0.0f;
  }
  const std::vector<uint8_t> keys = EncodeKeyGroup(format().key, rows, args);
  const auto z_of = [&](int32_t channel) {  // per head: [f16 s × d][f16 z × d][codes]
    return static_cast<uint16_t>(keys[2 * (shape.head_dim + channel)] | keys[2 * (shape.head_dim + channel) + 1] << 8);
  };
  EXPECT_EQ(z_of(0), 0x0000) << "+0 first";
  EXPECT_EQ(z_of(1), 0x8000) << "-0 first";
  EXPECT_EQ(z_of(2), 0x8000) << "16 x -0 first";
  EXPECT_EQ(z_of(3), 0x8000) << "a NaN, then -0 first";
  // Values, per head row: z is the row's first zero.
  for (const float first : {0.0f, -0.0f}) {
    const float row[8] = {first, -first, first, -first, 0.0f, -0.0f, 0.0f, -0.0f};
    std::vector<uint8_t> block(format().value.block_bytes(shape));  // [f16 s][f16 z][codes]
    format().value.encode_block(row, block.data(), args);
    EXPECT_EQ(block[2] | block[3] << 8, std::signbit(first) ? 0x8000 : 0x0000) << "value row from " << first;
  }
}

// The reference itself on hand-worked numbers, so the comparison above is against the spec.
TEST(KiviReferenceTest, MatchesHandWorkedExamples) {
  // f16 rounding: 0.1 -> 0.0999755859375 (nearest f16), ties to even, saturation.
  EXPECT_EQ(ReferenceRoundF16Saturated(0.1f), 0.0999755859375f);
  EXPECT_EQ(ReferenceRoundF16Saturated(1.0f + 0x1p-11f), 1.0f);            // tie -> even
  EXPECT_EQ(ReferenceRoundF16Saturated(1.0f + 3 * 0x1p-11f), 1.0f + 0x1p-9f);  // tie -> even
  EXPECT_EQ(ReferenceRoundF16Saturated(0x1p-25f), 0.0f);                   // tie -> even (0)
  EXPECT_EQ(ReferenceRoundF16Saturated(3 * 0x1p-25f), 0x1p-23f);           // subnormal tie
  EXPECT_EQ(ReferenceRoundF16Saturated(1e6f), 65504.0f);
  EXPECT_EQ(ReferenceRoundF16Saturated(-1e6f), -65504.0f);
  // 4-bit over [0, 30]: z = 0, s = 2; 1 -> 0.5 -> 0, 3 -> 1.5 -> 2 (ties to even), 31 clamps.
  const AsymParams p = ReferenceParams(0.0f, 30.0f, 4);
  EXPECT_EQ(p.z, 0.0f);
  EXPECT_EQ(p.s, 2.0f);
  EXPECT_EQ(ReferenceRoundTrip(1.0f, p, 4), 0.0f);
  EXPECT_EQ(ReferenceRoundTrip(3.0f, p, 4), 4.0f);
  EXPECT_EQ(ReferenceRoundTrip(31.0f, p, 4), 30.0f);
  // 2-bit over [-1, 2]: z = -1, s = 1; 0.4 -> 1.4 -> 1 -> 0.
  const AsymParams q = ReferenceParams(-1.0f, 2.0f, 2);
  EXPECT_EQ(ReferenceRoundTrip(0.4f, q, 2), 0.0f);
  // Constant numbers: s = 0, raw = 0, x' = z.
  EXPECT_EQ(ReferenceRoundTrip(7.0f, ReferenceParams(7.0f, 7.0f, 4), 4), 7.0f);
}

// ---------------------------------------------------------------------------------------------
// 2. RowSequence: the f32 residual and the group boundary.
// ---------------------------------------------------------------------------------------------

TEST_P(KiviTest, RowSequenceKeepsResidualExactUntilGroupCompletes) {
  const Codec& codec = format().key;
  for (RowShape shape : {RowShape{1, 8}, RowShape{2, 16}, RowShape{4, 8}}) {
    const std::string where = ShapeName(shape);
    const int64_t elems = shape.elems();
    const std::vector<float> rows = MakeRows(2 * kG, shape, Data::kOutlierChannel, 7);
    const std::vector<float> group0(rows.begin(), rows.begin() + kG * elems);
    const std::vector<float> group1(rows.begin() + kG * elems, rows.end());
    const std::vector<float> want0 = ReferenceKiviKeys(group0, shape, bits());
    const std::vector<float> want1 = ReferenceKiviKeys(group1, shape, bits());
    const int64_t block_bytes = codec.block_bytes(shape);

    RowSequence seq(codec, shape);
    std::vector<float> out(elems);
    for (int64_t n = 1; n <= 2 * kG; ++n) {
      seq.Append(rows.data() + (n - 1) * elems, 1);
      const std::string at = where + " after " + std::to_string(n) + " rows";
      ASSERT_EQ(seq.size(), n) << at;
      const int64_t complete = n / kG;
      ASSERT_EQ(seq.residual_rows(), n % kG) << at;
      ASSERT_EQ(seq.bytes(), complete * block_bytes + (n % kG) * elems * 4) << at;
      for (int64_t p = 0; p < n; ++p) {
        seq.DecodeRow(p, out.data());
        const std::string row = at + ", row " + std::to_string(p);
        if (p < complete * kG) {  // in a complete group: quantised, as the reference
          const std::vector<float>& want = p < kG ? want0 : want1;
          ExpectSameBits(out.data(), want.data() + (p % kG) * elems, elems, row);
        } else {  // residual: the input, bit for bit
          ExpectSameBits(out.data(), rows.data() + p * elems, elems, row);
        }
      }
    }

    // Quantisation really happened: most numbers of a completed group differ from the input.
    int64_t changed = 0;
    for (int64_t i = 0; i < kG * elems; ++i) changed += want0[i] != group0[i];
    EXPECT_GT(changed, kG * elems / 2) << where;
  }
}

TEST_P(KiviTest, RowSequenceStateAtGroupBoundaries) {
  const Codec& codec = format().key;
  const RowShape shape{2, 16};
  const int64_t elems = shape.elems();
  const std::vector<float> rows = MakeRows(kG + 1, shape, Data::kGaussian, 11);

  RowSequence seq(codec, shape);
  EXPECT_EQ(seq.residual_rows(), 0);
  EXPECT_EQ(seq.bytes(), 0);
  seq.Append(rows.data(), kG - 1);
  EXPECT_EQ(seq.residual_rows(), kG - 1);
  EXPECT_EQ(seq.bytes(), (kG - 1) * elems * 4);
  seq.Append(rows.data() + (kG - 1) * elems, 1);  // the 32nd row completes the group
  EXPECT_EQ(seq.residual_rows(), 0);
  EXPECT_EQ(seq.bytes(), codec.block_bytes(shape));
  seq.Append(rows.data() + kG * elems, 1);  // row 33 starts a new residual
  EXPECT_EQ(seq.residual_rows(), 1);
  EXPECT_EQ(seq.bytes(), codec.block_bytes(shape) + elems * 4);
}

TEST_P(KiviTest, RowSequenceAppendInOneCallEqualsOneAtATime) {
  for (const Codec* codec : {&format().key, &format().value}) {
    const RowShape shape{4, 8};
    const int64_t elems = shape.elems();
    for (int64_t n : {0, 1, 31, 32, 33, 63, 64, 65, 100}) {
      const std::string where = std::string(codec == &format().key ? "keys" : "values") +
                                ", " + std::to_string(n) + " rows";
      const std::vector<float> rows = MakeRows(n, shape, Data::kOutlierChannel, 13);
      RowSequence whole(*codec, shape);
      RowSequence single(*codec, shape);
      whole.Append(rows.data(), n);
      for (int64_t r = 0; r < n; ++r) single.Append(rows.data() + r * elems, 1);
      EXPECT_EQ(whole.size(), single.size()) << where;
      EXPECT_EQ(whole.residual_rows(), single.residual_rows()) << where;
      EXPECT_EQ(whole.bytes(), single.bytes()) << where;
      std::vector<float> a(elems), b(elems);
      for (int64_t p = 0; p < n; ++p) {
        whole.DecodeRow(p, a.data());
        single.DecodeRow(p, b.data());
        ExpectSameBits(a.data(), b.data(), elems, where + ", row " + std::to_string(p));
      }
    }
  }
}

TEST_P(KiviTest, RowSequenceBytesEqualBytesForRows) {
  for (RowShape shape : kShapes) {
    for (const Codec* codec : {&format().key, &format().value}) {
      const std::string where = ShapeName(shape) + (codec == &format().key ? " keys" : " values");
      const int64_t elems = shape.elems();
      const std::vector<float> rows = MakeRows(100, shape, Data::kGaussian, 17);
      RowSequence seq(*codec, shape);
      for (int64_t n = 0; n <= 100; ++n) {
        if (n > 0) seq.Append(rows.data() + (n - 1) * elems, 1);
        EXPECT_EQ(seq.bytes(), BytesForRows(*codec, shape, n)) << where << ", n=" << n;
      }
    }
    // And BytesForRows is what the layouts say: complete key groups plus f32 residual rows;
    // values one block per row.
    for (int64_t n = 0; n <= 100; ++n) {
      EXPECT_EQ(BytesForRows(format().key, shape, n),
                n / kG * format().key.block_bytes(shape) + n % kG * shape.elems() * 4)
          << ShapeName(shape) << ", n=" << n;
      EXPECT_EQ(BytesForRows(format().value, shape, n), n * format().value.block_bytes(shape))
          << ShapeName(shape) << ", n=" << n;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 3. Keys are scaled per channel.
// ---------------------------------------------------------------------------------------------

TEST_P(KiviTest, OutlierChannelDoesNotCostOtherChannelsPrecision) {
  const RowShape shape{1, 16};
  const int64_t elems = shape.elems();
  const int32_t outlier = 5;
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> small(-1.0f, 1.0f), big(100.0f, 101.0f);
  std::vector<float> rows(kG * elems);
  for (int64_t r = 0; r < kG; ++r) {
    for (int32_t c = 0; c < shape.head_dim; ++c) {
      rows[r * elems + c] = c == outlier ? big(rng) : small(rng);
    }
  }
  const CodecArgs args{.shape = shape};
  const std::vector<uint8_t> block = EncodeKeyGroup(format().key, rows, args);
  const std::vector<AsymParams> params = ReferenceKeyParams(rows, shape, bits());

  // Each channel's error stays within its own s/2 + |min - z| (see RoundTripErrorIsBounded).
  // For the [-1, 1] channels that is at most (2/R)/2 plus f16's half-ulp below 1 — whatever
  // the outlier channel does.
  const float small_bound = 1.0f / raw_max() + 0x1p-12f + 1e-6f;
  std::vector<float> out(elems), per_token(elems);
  std::vector<uint8_t> value_block(format().value.block_bytes(shape));
  float key_err_small = 0.0f, token_err_small = 0.0f;
  for (int32_t r = 0; r < kG; ++r) {
    const float* x = rows.data() + r * elems;
    format().key.decode_row(block.data(), r, out.data(), args);
    // The same row with one scale per token (the value codec), for contrast.
    format().value.encode_block(x, value_block.data(), args);
    format().value.decode_row(value_block.data(), 0, per_token.data(), args);
    for (int32_t c = 0; c < shape.head_dim; ++c) {
      float lo = rows[c], hi = rows[c];
      for (int32_t k = 1; k < kG; ++k) {
        lo = std::min(lo, rows[k * elems + c]);
        hi = std::max(hi, rows[k * elems + c]);
      }
      const float err = std::fabs(x[c] - out[c]);
      EXPECT_LE(err, params[c].s / 2 + std::fabs(lo - params[c].z) +
                         RoundTripSlack(x[c], params[c], bits()))
          << "row " << r << " channel " << c;
      if (c != outlier) {
        EXPECT_LE(params[c].s, 2.0f / raw_max() * (1 + 0x1p-10f)) << "channel " << c;
        key_err_small = std::max(key_err_small, err);
        token_err_small = std::max(token_err_small, std::fabs(x[c] - per_token[c]));
      }
    }
  }
  EXPECT_LE(key_err_small, small_bound);
  // A per-token scale spans [-1, 101]: s is about 102/R, and the small channels lose nearly
  // everything (errors of order 1, not 1/R).
  EXPECT_GT(token_err_small, 0.5f);
  EXPECT_GT(token_err_small, 4 * key_err_small);
}

// ---------------------------------------------------------------------------------------------
// 4. Round-trip error bound.
// ---------------------------------------------------------------------------------------------

// For x in [min, max] with z = roundF16(min) and s = roundF16((max - z)/R):
//   - if round((x - z)/s) >= 0, raw is within 1/2 of (x - z)/s, so |x - x'| <= s/2;
//   - if it is < 0 (only when z > min and x < z - s/2), raw clamps to 0, x' = z, and
//     |x - x'| = z - x <= z - min = |min - z|;
//   - the top clamp never fires: s is f16-rounded from (max - z)/R with relative error at most
//     2^-11 (s normal), so (x - z)/s <= R(1 + 2^-11) < R + 1/2.
// Hence |x - x'| <= s/2 + |min - z| in exact arithmetic. The slack covers f32 arithmetic: the
// f32 subtraction x - z and division by s (which can move (x - z)/s across a rounding tie by a
// few ulps, i.e. a few ulps of |x - z| in x'), and the f32 product raw·s and sum + z; all are a
// few ulps of |x| + |z| + R·s. Data is kept inside f16's range (no saturation) and s normal.
TEST_P(KiviTest, RoundTripErrorIsBounded) {
  auto slack = [&](float x, AsymParams p) { return RoundTripSlack(x, p, bits()); };
  std::mt19937 rng(29);
  std::uniform_real_distribution<float> log_sigma(std::log(0.05f), std::log(500.0f));
  std::uniform_real_distribution<float> mean_in_sigmas(-10.0f, 10.0f);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  int64_t checked = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const RowShape shape = kShapes[trial % 3];  // 1x8, 4x8, 2x16
    const int64_t elems = shape.elems();
    const float sigma = std::exp(log_sigma(rng));
    const float mean = mean_in_sigmas(rng) * sigma;
    const bool outlier = trial % 2 == 1;
    std::vector<float> rows(kG * elems);
    for (int64_t i = 0; i < kG * elems; ++i) {
      const bool is_outlier = outlier && i % shape.head_dim == OutlierChannel(shape);
      rows[i] = mean + gauss(rng) * sigma * (is_outlier ? 50.0f : 1.0f);
    }
    const CodecArgs args{.shape = shape};
    std::vector<float> out(elems);

    // Keys: per channel over the group.
    const std::vector<uint8_t> block = EncodeKeyGroup(format().key, rows, args);
    const std::vector<AsymParams> kp = ReferenceKeyParams(rows, shape, bits());
    for (int64_t c = 0; c < elems; ++c) ASSERT_GE(kp[c].s, 0x1p-14f) << "s must be normal";
    for (int32_t r = 0; r < kG; ++r) {
      format().key.decode_row(block.data(), r, out.data(), args);
      for (int64_t c = 0; c < elems; ++c) {
        float lo = rows[c];
        for (int32_t k = 1; k < kG; ++k) lo = std::min(lo, rows[k * elems + c]);
        const float x = rows[r * elems + c];
        ASSERT_LE(std::fabs(x - out[c]), kp[c].s / 2 + std::fabs(lo - kp[c].z) + slack(x, kp[c]))
            << "keys trial " << trial << " row " << r << " element " << c << ": x=" << x
            << " x'=" << out[c] << " s=" << kp[c].s << " z=" << kp[c].z;
        ++checked;
      }
    }

    // Values: per head row.
    std::vector<uint8_t> vblock(format().value.block_bytes(shape));
    for (int32_t r = 0; r < kG; ++r) {
      const float* x = rows.data() + r * elems;
      format().value.encode_block(x, vblock.data(), args);
      format().value.decode_row(vblock.data(), 0, out.data(), args);
      const std::vector<AsymParams> vp = ReferenceValueParams(x, shape, bits());
      for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
        const float* xh = x + static_cast<int64_t>(h) * shape.head_dim;
        const float lo = *std::min_element(xh, xh + shape.head_dim);
        ASSERT_GE(vp[h].s, 0x1p-14f) << "s must be normal";
        for (int32_t i = 0; i < shape.head_dim; ++i) {
          const int64_t e = static_cast<int64_t>(h) * shape.head_dim + i;
          ASSERT_LE(std::fabs(x[e] - out[e]),
                    vp[h].s / 2 + std::fabs(lo - vp[h].z) + slack(x[e], vp[h]))
              << "values trial " << trial << " row " << r << " element " << e;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 100000);
}

// ---------------------------------------------------------------------------------------------
// 5. Bits per number and the head_dim rule.
// ---------------------------------------------------------------------------------------------

TEST_P(KiviTest, BitsPerNumber) {
  const double b = bits();
  // Keys: b + 32/G (an f16 s and z per channel shared by G = 32 tokens), whatever head_dim.
  EXPECT_DOUBLE_EQ(BitsPerNumber(format().key, {1, 8}), b + 32.0 / kG);
  EXPECT_DOUBLE_EQ(BitsPerNumber(format().key, {8, 128}), b + 32.0 / kG);
  // Values: b + 32/head_dim (an f16 s and z per head row).
  EXPECT_DOUBLE_EQ(BitsPerNumber(format().value, {1, 8}), b + 32.0 / 8);
  EXPECT_DOUBLE_EQ(BitsPerNumber(format().value, {8, 128}), b + 32.0 / 128);
  if (bits() == 4) {
    EXPECT_DOUBLE_EQ(BitsPerNumber(format().key, {1, 8}), 5.0);
    EXPECT_DOUBLE_EQ(BitsPerNumber(format().value, {1, 8}), 8.0);
  }
}

TEST_P(KiviTest, HeadDimMustBeMultipleOfEight) {
  for (const Codec* codec : {&format().key, &format().value}) {
    EXPECT_NE(codec->check_shape({1, 12}), "");
    EXPECT_NE(codec->check_shape({2, 4}), "");
    EXPECT_EQ(codec->check_shape({1, 8}), "");
    EXPECT_EQ(codec->check_shape({2, 16}), "");
    EXPECT_EQ(codec->check_shape({8, 128}), "");
  }
  const Status bad = CheckShape(format(), {1, 12});
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("multiple of 8"), std::string::npos) << bad.message();
  EXPECT_NE(bad.message().find(format().name), std::string::npos) << bad.message();
  EXPECT_TRUE(CheckShape(format(), {8, 128}).ok());
}

// ---------------------------------------------------------------------------------------------
// 6. dot / axpy are decode-then-multiply, in order.
// ---------------------------------------------------------------------------------------------

// Σ q[i]·x[i] in f32, in order of i.
float DotInOrder(const float* q, const float* x, int32_t n) {
  float sum = 0.0f;
  for (int32_t i = 0; i < n; ++i) sum += q[i] * x[i];
  return sum;
}

TEST_P(KiviTest, DotAndAxpyEqualDecodeThenMultiply) {
  std::mt19937 rng(31);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  uint32_t seed = 300;
  for (RowShape shape : kShapes) {
    const int64_t elems = shape.elems();
    const int32_t d = shape.head_dim;
    const CodecArgs args{.shape = shape};
    const std::vector<float> rows = MakeRows(kG, shape, Data::kOutlierChannel, seed++);
    std::vector<float> q(d), acc(d), want_acc(d), x(elems);

    // Checks dot and axpy of every head of `row` of `block` against its decode.
    auto check = [&](const Codec& codec, const uint8_t* block, int32_t row,
                     const std::string& where) {
      codec.decode_row(block, row, x.data(), args);
      for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
        const float* xh = x.data() + static_cast<int64_t>(h) * d;
        for (float& v : q) v = gauss(rng);
        const float dot = codec.dot(q.data(), block, row, h, args);
        EXPECT_EQ(std::bit_cast<uint32_t>(dot), std::bit_cast<uint32_t>(DotInOrder(q.data(), xh, d)))
            << where << " head " << h;
        const float w = gauss(rng);
        for (int32_t i = 0; i < d; ++i) acc[i] = want_acc[i] = gauss(rng);
        codec.axpy(w, block, row, h, acc.data(), args);
        for (int32_t i = 0; i < d; ++i) want_acc[i] += w * xh[i];
        ExpectSameBits(acc.data(), want_acc.data(), d, where + " axpy head " + std::to_string(h));
      }
    };

    const std::vector<uint8_t> key_block = EncodeKeyGroup(format().key, rows, args);
    std::vector<uint8_t> value_block(format().value.block_bytes(shape));
    for (int32_t r = 0; r < kG; ++r) {
      const std::string where = ShapeName(shape) + " row " + std::to_string(r);
      check(format().key, key_block.data(), r, "keys " + where);
      format().value.encode_block(rows.data() + r * elems, value_block.data(), args);
      check(format().value, value_block.data(), 0, "values " + where);
    }
  }
}

// RowSequence's Dot / Axpy: the codec's for rows of complete groups, exact f32 for the residual;
// both equal decode-then-multiply.
TEST_P(KiviTest, RowSequenceDotAndAxpyEqualDecodeThenMultiply) {
  const RowShape shape{2, 16};
  const int64_t elems = shape.elems();
  const int32_t d = shape.head_dim;
  const std::vector<float> rows = MakeRows(kG + 10, shape, Data::kGaussian, 37);
  RowSequence seq(format().key, shape);
  seq.Append(rows.data(), kG + 10);
  ASSERT_EQ(seq.residual_rows(), 10);
  std::mt19937 rng(41);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::vector<float> q(d), x(elems), acc(d), want_acc(d);
  for (int64_t p = 0; p < seq.size(); ++p) {
    seq.DecodeRow(p, x.data());
    for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
      const float* xh = x.data() + static_cast<int64_t>(h) * d;
      for (float& v : q) v = gauss(rng);
      EXPECT_EQ(std::bit_cast<uint32_t>(seq.Dot(q.data(), p, h)),
                std::bit_cast<uint32_t>(DotInOrder(q.data(), xh, d)))
          << "row " << p << " head " << h;
      const float w = gauss(rng);
      for (int32_t i = 0; i < d; ++i) acc[i] = want_acc[i] = gauss(rng);
      seq.Axpy(w, p, h, acc.data());
      for (int32_t i = 0; i < d; ++i) want_acc[i] += w * xh[i];
      ExpectSameBits(acc.data(), want_acc.data(), d,
                     "axpy row " + std::to_string(p) + " head " + std::to_string(h));
    }
  }
}

// "int4-kivi" -> "int4_kivi" (test names allow only alphanumerics and underscores).
std::string FormatTestName(const testing::TestParamInfo<FormatCase>& param_info) {
  std::string name = param_info.param.format->name;
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

INSTANTIATE_TEST_SUITE_P(Formats, KiviTest, testing::ValuesIn(KiviFormats()), FormatTestName);

}  // namespace
}  // namespace kvq
