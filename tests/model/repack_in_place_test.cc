// RepackWeightsInPlace (model/decoder_weights.h), the WebAssembly loader's repack: every matrix
// repacked over its own bytes, a slice of rows at a time, gives exactly RepackMatrix's bytes of the
// whole matrix (tail rows and more than one slice included), and a tied embedding then views those
// same bytes (held once) while its rows still decode to the file's numbers, bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <hwy/targets.h>

#include "model/decoder_weights.h"
#include "test_util/target_scope.h"
#include "weights/matvec.h"
#include "weights/kquant_repack.h"
#include "weights/q6_k/q6_k.h"
#include "weights/repack.h"
#include "weights/weight_type.h"

namespace kvq {
namespace {

// [rows][row bytes] of `type`: rows of N(0, 1) numbers by the type's quantiser.
std::vector<uint8_t> QuantizedRows(WeightType type, int64_t rows, int64_t cols, uint32_t seed) {
  const WeightTypeDesc& d = *FindWeightType(type);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t row_bytes = MatrixRowBytes(type, cols);
  std::vector<uint8_t> bytes(rows * row_bytes);
  std::vector<float> row(cols);  // [cols]
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = normal(rng);
    QuantizeRowRef(d, row.data(), cols, bytes.data() + r * row_bytes);
  }
  return bytes;
}

// What RepackMatrix writes for the whole of `m` (row-major), copied out.
std::vector<uint8_t> WholeRepack(const Matrix& m) {
  std::vector<uint8_t> out(MatrixDataBytes(m));
  RepackMatrix(m, out.data());
  return out;
}

// [cols] floats of row r, decoded.
std::vector<float> Row(const Matrix& m, int64_t r) {
  std::vector<float> out(m.cols);
  DecodeWeightRow(m, r, out.data());
  return out;
}

// 16 · 70 + 5 rows: more than one slice (1,024 rows) and a tail of 5 row-major rows.
constexpr int64_t kRows = 16 * 70 + 5;

TEST(RepackInPlace, TiedClassifierIsHeldOnceAndTheEmbeddingDecodesTheFileNumbers) {
  for (const WeightType type : {WeightType::kQ4_0, WeightType::kQ8_0}) {
    SCOPED_TRACE(WeightTypeName(type));
    const int64_t cols = 64;
    std::vector<uint8_t> file = QuantizedRows(type, kRows, cols, 7);
    const std::vector<uint8_t> original = file;
    const Matrix plain{.type = type, .data = original.data(), .rows = kRows, .cols = cols};
    DecoderWeights w;
    w.token_embedding = Matrix{.type = type, .data = file.data(), .rows = kRows, .cols = cols};
    w.classifier = w.token_embedding;  // tied
    EXPECT_EQ(RepackWeightsInPlace(&w), static_cast<int64_t>(file.size()));
    EXPECT_EQ(w.repacked, nullptr) << "no copy is made";
    EXPECT_EQ(w.classifier.data, file.data());
    EXPECT_EQ(w.token_embedding.data, file.data());
    EXPECT_EQ(w.classifier.layout, MatrixLayout::kInterleaved16);
    EXPECT_EQ(w.token_embedding.layout, MatrixLayout::kInterleaved16);
    EXPECT_TRUE(file == WholeRepack(plain)) << "the bytes are RepackMatrix's of the whole matrix";
    for (const int64_t r : {int64_t{0}, int64_t{15}, int64_t{16}, int64_t{1023}, int64_t{1024}, kRows - 6, kRows - 1}) {
      const std::vector<float> got = Row(w.token_embedding, r), want = Row(plain, r);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), 4 * cols), 0) << "embedding row " << r;
    }
  }
}

TEST(RepackInPlace, ProjectionsAndAnUntiedClassifierAreRepackMatrixBytes) {
  // A K-quant projection (its own group layout), a Q8_0 one, and a separate Q4_0 classifier.
  std::vector<uint8_t> wq = QuantizedRows(WeightType::kQ4_K, kRows, 256, 1);
  std::vector<uint8_t> w1 = QuantizedRows(WeightType::kQ8_0, 48, 96, 2);
  std::vector<uint8_t> embedding = QuantizedRows(WeightType::kQ4_0, kRows, 32, 3);
  std::vector<uint8_t> classifier = QuantizedRows(WeightType::kQ4_0, kRows, 32, 4);
  const std::vector<uint8_t> embedding_before = embedding;
  DecoderWeights w;
  w.layers.resize(1);
  w.layers[0].wq = Matrix{.type = WeightType::kQ4_K, .data = wq.data(), .rows = kRows, .cols = 256};
  w.layers[0].w1 = Matrix{.type = WeightType::kQ8_0, .data = w1.data(), .rows = 48, .cols = 96};
  w.token_embedding = Matrix{.type = WeightType::kQ4_0, .data = embedding.data(), .rows = kRows, .cols = 32};
  w.classifier = Matrix{.type = WeightType::kQ4_0, .data = classifier.data(), .rows = kRows, .cols = 32};
  const std::vector<uint8_t> want_wq = WholeRepack(w.layers[0].wq), want_w1 = WholeRepack(w.layers[0].w1),
                             want_classifier = WholeRepack(w.classifier);
  RepackWeightsInPlace(&w);
  EXPECT_TRUE(wq == want_wq);
  EXPECT_TRUE(w1 == want_w1);
  EXPECT_TRUE(classifier == want_classifier);
  EXPECT_EQ(w.layers[0].wq.layout, MatrixLayout::kInterleaved16);
  EXPECT_TRUE(embedding == embedding_before) << "an untied embedding stays row-major";
  EXPECT_EQ(w.token_embedding.layout, MatrixLayout::kRowMajor);
}

TEST(RepackInPlace, AK_QuantClassifierIsRepackedOnlyWhereItPays) {
  // A tied Q6_K classifier (llama.cpp's K-quant mixes): repacked where the interleaved kernels read
  // faster than the rows (x86), kept row-major elsewhere (the WebAssembly module), as every
  // K-quant matrix is.
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    test::TargetScope scope(target);
    SCOPED_TRACE(hwy::TargetName(target));
    std::vector<uint8_t> file = QuantizedRows(WeightType::kQ6_K, kRows, 256, 6);
    const std::vector<uint8_t> before = file;
    DecoderWeights w;
    w.token_embedding = Matrix{.type = WeightType::kQ6_K, .data = file.data(), .rows = kRows, .cols = 256};
    w.classifier = w.token_embedding;
    const std::vector<uint8_t> want = WholeRepack(w.classifier);
    RepackWeightsInPlace(&w);
    if (KQuantRepackPays()) {
      EXPECT_EQ(w.classifier.layout, MatrixLayout::kInterleaved16);
      EXPECT_TRUE(file == want);
    } else {
      EXPECT_EQ(w.classifier.layout, MatrixLayout::kRowMajor);
      EXPECT_TRUE(file == before);
    }
    const std::string name = weights_q6_k::Kernels().target;
    EXPECT_EQ(KQuantRepackPays(), name.rfind("AVX", 0) == 0) << "x86 byte dots: AVX2 or better";
    for (const WeightTypeDesc& type : WeightTypes()) {
      if (!IsInterleavedKQuant(type.type)) continue;
      EXPECT_EQ(CanRepack(Matrix{.type = type.type, .data = file.data(), .rows = kRows, .cols = 256}), KQuantRepackPays())
          << type.label;
    }
  }
}

}  // namespace
}  // namespace kvq
