// One conformance suite for every entry of the weight-type registry (weights/weight_type.h):
//   - the table: unique names, labels, enum values and GGUF ids; lookups by each; block sizes
//     that agree with the GGUF reader's ggml layout for the same id; the fields a
//     quantised-activation type needs;
//   - dequantize_block_ref on hand-built blocks, known bytes -> known values compared bit for bit
//     (negative-zero scales, largest and smallest codes, largest and subnormal scales); a type
//     without a known-answer case fails the suite (cases of the newer types live in
//     known_blocks/<name>.h, one file per type, listed in KnownBlocks below);
//   - exact_block_ref against the decoder (equal for one-scale types, within the decoder's own
//     rounding for two-term types);
//   - every SIMD target's row kernel, called directly, against the scalar reference within the
//     bounds of src/weights/matvec.h (test_util/matvec_bounds.h), and equal bit for bit to MatVec.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL  // as the weight kernels, so the target list below includes AVX3_DL
#endif
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "test_util/known_block.h"
#include "weights/known_blocks/q2_k.h"
#include "weights/known_blocks/q3_k.h"
#include "weights/known_blocks/q4_k.h"
#include "weights/known_blocks/q5_k.h"
#include "weights/known_blocks/q6_k.h"
#include "test_util/matvec_bounds.h"
#include "weights/known_blocks/q4_1.h"
#include "weights/known_blocks/q5_0.h"
#include "weights/known_blocks/q5_1.h"
#include "weights/known_blocks/q1_0.h"
#include "weights/known_blocks/q2_0.h"
#include "weights/matvec.h"
#include "weights/weight_type.h"

namespace kvq {
namespace {

using test::PlainTolerance;
using test::QuantTolerance;
using test::TargetScope;

constexpr float kInf = std::numeric_limits<float>::infinity();

bool SameBits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// ---- 1. The table ----

TEST(WeightTypeTable, NamesIdsAndLookupsAreConsistent) {
  std::set<std::string> names, labels;
  std::set<int> types;
  std::set<uint32_t> gguf_ids;
  ASSERT_FALSE(WeightTypes().empty());
  for (const WeightTypeDesc& d : WeightTypes()) {
    SCOPED_TRACE(d.label);
    EXPECT_TRUE(names.insert(d.name).second) << "duplicate name " << d.name;
    EXPECT_TRUE(labels.insert(d.label).second) << "duplicate label " << d.label;
    EXPECT_TRUE(types.insert(static_cast<int>(d.type)).second) << "duplicate WeightType";
    EXPECT_TRUE(gguf_ids.insert(d.gguf_type).second) << "duplicate GGUF id " << d.gguf_type;
    // The CLI name is the label in lower case.
    std::string lower = d.label;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    EXPECT_EQ(lower, d.name);
    EXPECT_EQ(FindWeightType(d.type), &d);
    EXPECT_EQ(FindWeightTypeByGgufId(d.gguf_type), &d);
    EXPECT_EQ(*FindWeightTypeByName(d.name), &d);
    EXPECT_EQ(*FindWeightTypeByName(d.label), &d);
    EXPECT_STREQ(WeightTypeName(d.type), d.label);
    EXPECT_NE(WeightTypeLabelList().find(d.label), std::string::npos);
    EXPECT_NE(WeightTypeNameList().find(d.name), std::string::npos);
  }
  const Result<const WeightTypeDesc*> unknown = FindWeightTypeByName("iq1_s");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find(WeightTypeNameList()), std::string::npos) << unknown.status().message();
  EXPECT_EQ(FindWeightTypeByGgufId(19), nullptr);  // IQ1_S: a ggml type not registered
}

TEST(WeightTypeTable, BlockLayoutsAgreeWithGgmlAndTheRowSizes) {
  for (const WeightTypeDesc& d : WeightTypes()) {
    SCOPED_TRACE(d.label);
    ASSERT_GE(d.block_elems, 1);
    ASSERT_LE(d.block_elems, kMaxWeightBlockElems);
    ASSERT_GE(d.block_bytes, 1);
    ASSERT_NE(d.dequantize_block_ref, nullptr);
    ASSERT_NE(d.quantize_block_ref, nullptr);
    ASSERT_NE(d.kernels, nullptr);
    // The same id in the GGUF reader's table of ggml types: same name and block layout, so a
    // tensor's extent (reader) and its rows (MatrixRowBytes) agree.
    const GgmlTypeInfo* g = FindGgmlType(d.gguf_type);
    ASSERT_NE(g, nullptr) << "GGUF id " << d.gguf_type;
    EXPECT_STREQ(g->name, d.label);
    EXPECT_EQ(g->block_elements, d.block_elems);
    EXPECT_EQ(g->block_bytes, d.block_bytes);
    EXPECT_EQ(MatrixRowBytes(d.type, 4 * d.block_elems), 4 * d.block_bytes);
    EXPECT_EQ(*GgmlTypeBytes(static_cast<GgmlType>(d.gguf_type), 4 * d.block_elems), 4 * d.block_bytes);
    EXPECT_TRUE(CheckMatrix(Matrix{.type = d.type, .rows = 2, .cols = d.block_elems}).ok());
    if (d.block_elems > 1) {
      EXPECT_FALSE(CheckMatrix(Matrix{.type = d.type, .rows = 2, .cols = d.block_elems + 1}).ok());
    }
    EXPECT_EQ(d.code_ref == nullptr, d.scale_ref == nullptr);
    if (d.quantized_activation) {
      // matvec.h: whole activation blocks of 32 per weight block; one-scale types with a code_ref
      // have blocks of exactly 32.
      EXPECT_EQ(d.block_elems % kActivationBlockElems, 0);
      ASSERT_NE(d.exact_block_ref, nullptr);
      if (d.code_ref != nullptr) {
        EXPECT_EQ(d.block_elems, kActivationBlockElems);
      }
      EXPECT_GE(d.matvec_roundings, 0);
      EXPECT_LE(d.matvec_roundings, 8);
    } else {
      EXPECT_EQ(d.exact_block_ref, nullptr);
      EXPECT_EQ(d.code_ref, nullptr);
      EXPECT_EQ(d.scale_ref, nullptr);
    }
  }
}

// Quantised-activation types: the decoder is scale·code, bit for bit, on random blocks (every
// byte value in the codes, scales of both signs).
TEST(WeightTypeTable, QuantizedActivationDecodeIsScaleTimesCode) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> byte(0, 255);
  for (const WeightTypeDesc& d : WeightTypes()) {
    if (d.code_ref == nullptr) continue;
    SCOPED_TRACE(d.label);
    std::vector<uint8_t> block(d.block_bytes);
    std::vector<float> out(d.block_elems);
    for (int trial = 0; trial < 200; ++trial) {
      for (uint8_t& b : block) b = static_cast<uint8_t>(byte(rng));
      block[1] &= 0x7B;  // a finite f16 scale: sign cleared, exponent below all-ones
      if (trial % 2 == 1) block[1] |= 0x80;
      d.dequantize_block_ref(block.data(), out.data());
      for (int64_t i = 0; i < d.block_elems; ++i) {
        ASSERT_TRUE(SameBits(out[i], d.scale_ref(block.data()) * static_cast<float>(d.code_ref(block.data(), i))))
            << "element " << i;
      }
    }
  }
}

// exact_block_ref is the decoder's value before rounding: on blocks quantised from random data
// (and on the hand-built blocks below), |decoded − exact| ≤ γ_3·abs per weight — a two-term
// weight fl(fl(d·sc)·code − fl(m·sc')) takes at most 3 roundings, each relative to a term of
// magnitude ≤ abs — and equal where the type has one term (code_ref: d·code is exact in f32).
TEST(WeightTypeTable, ExactBlockIsTheDecodedValueBeforeRounding) {
  std::mt19937 rng(12);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const WeightTypeDesc& d : WeightTypes()) {
    if (!d.quantized_activation) continue;
    SCOPED_TRACE(d.label);
    std::vector<float> x(d.block_elems), out(d.block_elems);
    std::vector<double> w(d.block_elems), abs(d.block_elems);
    std::vector<uint8_t> block(d.block_bytes);
    for (int trial = 0; trial < 200; ++trial) {
      const float scale = trial % 3 == 0 ? 1e-3f : trial % 3 == 1 ? 1.0f : 300.0f;
      for (float& v : x) v = scale * normal(rng) + (trial % 5 == 0 ? scale : 0.0f);
      d.quantize_block_ref(x.data(), block.data());
      d.dequantize_block_ref(block.data(), out.data());
      d.exact_block_ref(block.data(), w.data(), abs.data());
      for (int64_t i = 0; i < d.block_elems; ++i) {
        ASSERT_GE(abs[i], std::fabs(w[i])) << "element " << i;
        if (d.code_ref != nullptr) {
          ASSERT_EQ(static_cast<double>(out[i]), w[i]) << "element " << i;
        } else {
          ASSERT_LE(std::fabs(out[i] - w[i]), test::Gamma(3) * abs[i]) << "element " << i;
        }
      }
    }
  }
}

// ---- 2. The reference decoder on hand-built blocks ----

using test::KnownBlock;
using test::U16;
using test::U32;

// Q8_0: f16 scale, then 32 int8 codes; codes[i] → scale·codes[i] written out per case.
KnownBlock Q8Block(uint16_t scale_bits, const std::vector<int8_t>& codes, const std::vector<float>& values) {
  KnownBlock k{U16(scale_bits), values};
  for (int8_t c : codes) k.bytes.push_back(static_cast<uint8_t>(c));
  return k;
}

// Q4_0: f16 scale, then 16 bytes; byte j holds element j (low nibble) and j+16 (high nibble).
KnownBlock Q4Block(uint16_t scale_bits, const std::vector<uint8_t>& qs, const std::vector<float>& values) {
  KnownBlock k{U16(scale_bits), values};
  k.bytes.insert(k.bytes.end(), qs.begin(), qs.end());
  return k;
}

std::map<std::string, std::vector<KnownBlock>> KnownBlocks() {
  std::map<std::string, std::vector<KnownBlock>> m;
  m["f32"] = {{U32(0x3FC00000), {1.5f}},   {U32(0x80000000), {-0.0f}},  {U32(0x7F800000), {kInf}},
              {U32(0x00000001), {0x1p-149f}}, {U32(0xC0490FDB), {-3.14159274f}}};
  m["f16"] = {{U16(0x3C00), {1.0f}},     {U16(0x8000), {-0.0f}},       {U16(0x7BFF), {65504.0f}},
              {U16(0x0001), {0x1p-24f}}, {U16(0xFC00), {-kInf}},       {U16(0x3555), {0.333251953125f}}};
  m["bf16"] = {{U16(0x3F80), {1.0f}},      {U16(0x8000), {-0.0f}},  {U16(0x7F7F), {0x1.FEp127f}},
               {U16(0x0001), {0x1p-133f}}, {U16(0xFF80), {-kInf}},  {U16(0xC040), {-3.0f}}};

  // Q8_0. (a) d = 0.5, the extreme codes 127 and −128 first, then 1, −1, 0 and i − 16.
  std::vector<int8_t> codes(32);
  std::vector<float> values(32);
  for (int i = 0; i < 32; ++i) codes[i] = static_cast<int8_t>(i - 16);
  codes[0] = 127, codes[1] = -128, codes[2] = 1, codes[3] = -1, codes[4] = 0;
  for (int i = 0; i < 32; ++i) values[i] = 0.5f * static_cast<float>(codes[i]);
  EXPECT_EQ(values[0], 63.5f);  // spot checks, by hand
  EXPECT_EQ(values[1], -64.0f);
  EXPECT_EQ(values[31], 7.5f);
  m["q8_0"].push_back(Q8Block(0x3800, codes, values));
  // (b) d = −0 (0x8000): −0·c is −0 for c ≥ 0 and +0 for c < 0.
  std::vector<float> signed_zeros(32);
  for (int i = 0; i < 32; ++i) signed_zeros[i] = codes[i] >= 0 ? -0.0f : 0.0f;
  m["q8_0"].push_back(Q8Block(0x8000, codes, signed_zeros));
  // (c) the largest f16 scale 65504 with the extreme codes: ±8319008 and −8384512, exact.
  std::vector<int8_t> extremes(32, 0);
  extremes[0] = 127, extremes[31] = -128;
  std::vector<float> big(32, 0.0f);
  big[0] = 8319008.0f, big[31] = -8384512.0f;
  m["q8_0"].push_back(Q8Block(0x7BFF, extremes, big));
  // (d) the smallest subnormal scale 2^-24: 127·2^-24 and −128·2^-24 = −2^-17.
  std::vector<float> tiny(32, 0.0f);
  tiny[0] = 127.0f * 0x1p-24f, tiny[31] = -0x1p-17f;
  m["q8_0"].push_back(Q8Block(0x0001, extremes, tiny));

  // Q4_0. (a) d = 1: byte j = j | (15 − j) << 4, so element j = j − 8 (nibble 0 -> −8 first) and
  // element j + 16 = 7 − j (nibble 15 -> 7 first).
  std::vector<uint8_t> ramp(16);
  std::vector<float> ramp_values(32);
  for (int j = 0; j < 16; ++j) {
    ramp[j] = static_cast<uint8_t>(j | (15 - j) << 4);
    ramp_values[j] = static_cast<float>(j - 8);
    ramp_values[16 + j] = static_cast<float>(7 - j);
  }
  EXPECT_EQ(ramp_values[0], -8.0f);
  EXPECT_EQ(ramp_values[16], 7.0f);
  m["q4_0"].push_back(Q4Block(0x3C00, ramp, ramp_values));
  // (b) d = −0 with every byte 0x80: low nibble 0 (code −8) -> −0·−8 = +0; high nibble 8 (code 0)
  // -> −0·0 = −0.
  std::vector<float> q4_zeros(32);
  for (int i = 0; i < 32; ++i) q4_zeros[i] = i < 16 ? 0.0f : -0.0f;
  m["q4_0"].push_back(Q4Block(0x8000, std::vector<uint8_t>(16, 0x80), q4_zeros));
  // (c) d = 65504 with byte 0 = 0xF0 (element 0 code −8, element 16 code 7), the rest 0x88 (0).
  std::vector<uint8_t> ends(16, 0x88);
  ends[0] = 0xF0;
  std::vector<float> q4_big(32, 0.0f);
  q4_big[0] = -524032.0f, q4_big[16] = 458528.0f;
  m["q4_0"].push_back(Q4Block(0x7BFF, ends, q4_big));
  // (d) d = −2^-24: element 0 = 2^-21, element 16 = −7·2^-24.
  std::vector<float> q4_tiny(32, -0.0f);
  q4_tiny[0] = 0x1p-21f, q4_tiny[16] = -7.0f * 0x1p-24f;
  m["q4_0"].push_back(Q4Block(0x8001, ends, q4_tiny));
  // The newer types, one file each (known_blocks/<name>.h): m["<name>"] = test::<Name>KnownBlocks();
  m["q4_1"] = test::Q4_1KnownBlocks();
  m["q5_0"] = test::Q5_0KnownBlocks();
  m["q5_1"] = test::Q5_1KnownBlocks();
  m["q1_0"] = test::Q1_0KnownBlocks();
  m["q2_0"] = test::Q2_0KnownBlocks();
  m["q4_k"] = test::Q4_KKnownBlocks();
  m["q6_k"] = test::Q6_KKnownBlocks();
  m["q5_k"] = test::Q5_KKnownBlocks();
  m["q3_k"] = test::Q3_KKnownBlocks();
  m["q2_k"] = test::Q2_KKnownBlocks();
  return m;
}

TEST(WeightTypeReference, HandBuiltBlocksDecodeToKnownValues) {
  const std::map<std::string, std::vector<KnownBlock>> known = KnownBlocks();
  for (const WeightTypeDesc& d : WeightTypes()) {
    SCOPED_TRACE(d.label);
    const auto it = known.find(d.name);
    ASSERT_NE(it, known.end()) << "no known-answer blocks for " << d.name << ": add them above";
    for (size_t c = 0; c < it->second.size(); ++c) {
      const KnownBlock& k = it->second[c];
      ASSERT_EQ(static_cast<int64_t>(k.bytes.size()), d.block_bytes) << "case " << c;
      ASSERT_EQ(static_cast<int64_t>(k.values.size()), d.block_elems) << "case " << c;
      std::vector<float> out(d.block_elems, NAN);
      d.dequantize_block_ref(k.bytes.data(), out.data());
      for (int64_t i = 0; i < d.block_elems; ++i) {
        EXPECT_TRUE(SameBits(out[i], k.values[i])) << "case " << c << " element " << i << ": " << out[i]
                                                   << ", want " << k.values[i];
      }
      // DecodeWeight reads the same block through the Matrix view.
      const Matrix m{.type = d.type, .data = k.bytes.data(), .rows = 1, .cols = d.block_elems};
      for (int64_t i = 0; i < d.block_elems; ++i) EXPECT_TRUE(SameBits(DecodeWeight(m, 0, i), k.values[i]));
    }
  }
}

// ---- 3. Every target's kernels against the reference ----

struct Stored {
  std::vector<uint8_t> bytes;
  Matrix m;
};

// N(0, 1) rows encoded by the type's reference quantiser.
Stored RandomMatrix(const WeightTypeDesc& d, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Stored s;
  const int64_t row_bytes = MatrixRowBytes(d.type, cols);
  s.bytes.resize(rows * row_bytes);
  std::vector<float> row(cols);  // [cols]
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = normal(rng);
    QuantizeRowRef(d, row.data(), cols, s.bytes.data() + r * row_bytes);
  }
  s.m = Matrix{.type = d.type, .data = s.bytes.data(), .rows = rows, .cols = cols};
  return s;
}

std::vector<int64_t> ColsFor(const WeightTypeDesc& d) {
  std::vector<int64_t> out;
  for (int64_t c : {1, 7, 32, 33, 64, 96, 100, 256, 1024, 4096}) {
    if (c % d.block_elems == 0) out.push_back(c);
  }
  return out;
}

// Rows [r0, r1) of y = W x by the type's kernels on the current target; other rows keep `fill`.
std::vector<float> KernelRows(const WeightTypeDesc& d, const Matrix& w, const std::vector<float>& x, int64_t r0,
                              int64_t r1, float fill) {
  const WeightKernels& k = d.kernels();
  std::vector<float> y(w.rows, fill);
  if (!d.quantized_activation) {
    k.rows(w.data, x.data(), y.data(), w.cols, r0, r1);
    return y;
  }
  QuantizedActivation qa;
  QuantizeActivationFor(k, x.data(), w.cols, 1, &qa);
  k.quant_rows(w.data, qa.Token(0), y.data(), w.cols, r0, r1);
  return y;
}

TEST(WeightTypeKernels, EveryTargetMatchesTheReferenceWithinTheMatVecBounds) {
  uint32_t seed = 1;
  for (const WeightTypeDesc& d : WeightTypes()) {
    double worst_ratio = 0.0;  // max |kernel − reference| / tolerance
    for (int64_t rows : {1, 3, 4, 5, 17, 33}) {
      for (int64_t cols : ColsFor(d)) {
        SCOPED_TRACE(::testing::Message() << d.label << " " << rows << "x" << cols);
        const Stored w = RandomMatrix(d, rows, cols, seed++);
        ASSERT_TRUE(CheckMatrix(w.m).ok()) << CheckMatrix(w.m).message();
        std::vector<float> x(cols);
        std::mt19937 rng(seed++);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        for (float& v : x) v = normal(rng);
        // The reference value and the tolerance per row.
        std::vector<double> want(rows), tol(rows);
        if (d.quantized_activation) {
          std::vector<QuantizedProductReference> ref(rows);
          MatVecQuantizedReference(w.m, x.data(), ref.data());
          for (int64_t r = 0; r < rows; ++r) {
            want[r] = ref[r].y, tol[r] = QuantTolerance(cols, ref[r].abs_sum, d.matvec_roundings);
          }
        } else {
          std::vector<float> ref(rows), row(cols);
          MatVecReference(w.m, x.data(), ref.data());
          for (int64_t r = 0; r < rows; ++r) {
            DecodeWeightRow(w.m, r, row.data());
            double abs_sum = 0.0;
            for (int64_t c = 0; c < cols; ++c) abs_sum += std::fabs(static_cast<double>(row[c]) * x[c]);
            want[r] = ref[r], tol[r] = PlainTolerance(cols, abs_sum);
          }
        }
        for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
          TargetScope scope(target);
          SCOPED_TRACE(hwy::TargetName(target));
          const WeightKernels& k = d.kernels();
          ASSERT_STREQ(k.target, hwy::TargetName(target));
          ASSERT_EQ(k.rows == nullptr, d.quantized_activation);
          ASSERT_EQ(k.quant_rows == nullptr, !d.quantized_activation);
          ASSERT_EQ(k.activation_offsets == nullptr, !d.quantized_activation);
          const std::vector<float> y = KernelRows(d, w.m, x, 0, rows, NAN);
          for (int64_t r = 0; r < rows; ++r) {
            const double err = std::fabs(static_cast<double>(y[r]) - want[r]);
            ASSERT_LE(err, tol[r]) << "row " << r << ": kernel " << y[r] << " reference " << want[r];
            if (tol[r] > 0) worst_ratio = std::max(worst_ratio, err / tol[r]);
          }
          // MatVec runs these kernels: the same bits.
          std::vector<float> via_matvec(rows, NAN);
          MatVec(w.m, x.data(), via_matvec.data(), ThreadPool::Shared(1));
          ASSERT_EQ(std::memcmp(via_matvec.data(), y.data(), 4 * rows), 0);
          // A sub-range writes exactly its rows, with the same bits.
          if (rows >= 3) {
            const std::vector<float> part = KernelRows(d, w.m, x, 1, rows - 1, -7.0f);
            EXPECT_EQ(part[0], -7.0f);
            EXPECT_EQ(part[rows - 1], -7.0f);
            EXPECT_EQ(std::memcmp(part.data() + 1, y.data() + 1, 4 * (rows - 2)), 0);
          }
        }
      }
    }
    std::printf("%-5s worst |kernel - ref| / tolerance = %.3g\n", d.label, worst_ratio);
  }
}

// Every quantised-activation type, on blocks from its own quantiser: thread count changes no bit;
// MatMul is MatVec per token bit for bit; the result is within x_error_bound + the rounding bound
// of the unquantised product Σ w·x (w the decoded weights); a non-finite activation gives NaN and
// a zero activation 0.
TEST(WeightTypeKernels, QuantizedTypesThreadsMatMulUnquantisedBoundAndSpecialValues) {
  uint32_t seed = 7000;
  for (const WeightTypeDesc& d : WeightTypes()) {
    if (!d.quantized_activation) continue;
    SCOPED_TRACE(d.label);
    const int64_t cols = 1024 / d.block_elems * d.block_elems, rows = 37, n_tokens = 3;
    const Stored w = RandomMatrix(d, rows, cols, seed++);
    std::mt19937 rng(seed++);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(n_tokens * cols);  // [n_tokens][cols]
    for (float& v : x) v = normal(rng);
    for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
      TargetScope scope(target);
      SCOPED_TRACE(hwy::TargetName(target));
      std::vector<float> y1(rows), yt(rows), mm(n_tokens * rows);
      MatMul(w.m, x.data(), n_tokens, mm.data(), ThreadPool::Shared(3));
      for (int64_t t = 0; t < n_tokens; ++t) {
        MatVec(w.m, x.data() + t * cols, y1.data(), ThreadPool::Shared(1));
        MatVec(w.m, x.data() + t * cols, yt.data(), ThreadPool::Shared(4));
        ASSERT_EQ(std::memcmp(y1.data(), yt.data(), 4 * rows), 0);
        ASSERT_EQ(std::memcmp(y1.data(), mm.data() + t * rows, 4 * rows), 0) << "token " << t;
        std::vector<QuantizedProductReference> ref(rows);
        MatVecQuantizedReference(w.m, x.data() + t * cols, ref.data());
        std::vector<float> row(cols);
        for (int64_t r = 0; r < rows; ++r) {
          DecodeWeightRow(w.m, r, row.data());
          double exact = 0.0, abs = 0.0;  // Σ w·x in double
          for (int64_t c = 0; c < cols; ++c) {
            exact += static_cast<double>(row[c]) * x[t * cols + c];
            abs += std::fabs(static_cast<double>(row[c]) * x[t * cols + c]);
          }
          // The decoded f32 weight is within γ_3·abs of the exact one (ExactBlockIs... above);
          // bounded here by the same share of the reference's term magnitudes.
          const double bound = ref[r].x_error_bound + QuantTolerance(cols, ref[r].abs_sum, d.matvec_roundings) +
                               test::Gamma(cols, test::kUd) * abs + test::Gamma(3) * 127.5 * ref[r].abs_sum;
          ASSERT_LE(std::fabs(y1[r] - exact), bound) << "row " << r;
        }
      }
      std::vector<float> bad(x.begin(), x.begin() + cols), y(rows, 0.0f);
      bad[cols / 2] = std::numeric_limits<float>::quiet_NaN();
      MatVec(w.m, bad.data(), y.data(), ThreadPool::Shared(1));
      for (float v : y) ASSERT_TRUE(std::isnan(v));
      bad[cols / 2] = kInf;
      MatVec(w.m, bad.data(), y.data(), ThreadPool::Shared(1));
      for (float v : y) ASSERT_TRUE(std::isnan(v));
      std::vector<float> zero(cols, 0.0f);
      std::fill(y.begin(), y.end(), 1.0f);
      MatVec(w.m, zero.data(), y.data(), ThreadPool::Shared(1));
      for (float v : y) ASSERT_EQ(v, 0.0f);
    }
  }
}

}  // namespace
}  // namespace kvq
