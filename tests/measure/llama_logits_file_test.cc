// llama.cpp's "_logits_" file: a hand-built file reads as its bytes say and compares with hand-
// computed KL, Δp and top-1; the encoder gives the codes computed here by hand; a written file
// holds exactly the encoder's records; and bad files are refused with the file named.
#include "measure/llama_logits_file.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "measure/kl_divergence.h"

namespace kvq {
namespace {

std::string TempPath(const std::string& name) { return testing::TempDir() + "/llama_logits_" + name; }

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

template <typename T>
void Put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// A record written field by field: scale, min_log_prob, the codes, the pad for an odd vocabulary.
void PutRecord(std::string& s, float scale, float min_log_prob, std::vector<uint16_t> codes) {
  Put(s, scale);
  Put(s, min_log_prob);
  if (codes.size() % 2 != 0) codes.push_back(0xABCD);  // the pad: never read
  for (uint16_t q : codes) Put(s, q);
}

// n_ctx 4 (first = 2, one scored position a chunk: 2, predicting position 3), n_vocab 3, 2 chunks.
std::string HandBuilt() {
  std::string s = "_logits_";
  Put<int32_t>(s, 4);
  Put<int32_t>(s, 3);
  Put<int32_t>(s, 2);
  for (int32_t id : {1, 2, 0, 1, 2, 2, 1, 0}) Put(s, id);
  PutRecord(s, 0.5f, -3.0f, {0, 2, 6});     // log p = −3, −2, 0
  PutRecord(s, 0.5f, -20.0f, {0, 40, 36});  // log p = −20 (≤ −16: left out of KL), 0, −2
  return s;
}

TEST(LlamaLogitsFile, AHandBuiltFileReadsAsItsBytesSay) {
  const std::string path = TempPath("hand.bin");
  const std::string bytes = HandBuilt();
  ASSERT_EQ(bytes.size(), 20u + 8 * 4 + 2 * 16);  // header, 8 ids, 2 records of (4 + 4) uint16
  WriteBytes(path, bytes);
  Result<LlamaLogitsReader> r = LlamaLogitsReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->layout().n_ctx, 4);
  EXPECT_EQ(r->layout().n_vocab, 3);
  EXPECT_EQ(r->layout().n_chunk, 2);
  EXPECT_EQ(r->layout().first(), 2);
  EXPECT_EQ(r->layout().scored_per_chunk(), 1);
  EXPECT_EQ(r->layout().file_bytes(), static_cast<int64_t>(bytes.size()));
  EXPECT_EQ(std::vector<int32_t>(r->tokens().begin(), r->tokens().end()),
            (std::vector<int32_t>{1, 2, 0, 1, 2, 2, 1, 0}));
  Result<LlamaLogProbs> a = r->Record(0, 2), b = r->Record(1, 2);
  ASSERT_TRUE(a.ok() && b.ok());
  // 0.5·q + min is exact in double for these values: strict equality.
  EXPECT_EQ(a->scale(), 0.5f);
  EXPECT_EQ(a->LogProb(0), -3.0);
  EXPECT_EQ(a->LogProb(1), -2.0);
  EXPECT_EQ(a->LogProb(2), 0.0);
  EXPECT_EQ(b->LogProb(0), -20.0);
  EXPECT_EQ(b->LogProb(1), 0.0);
  EXPECT_EQ(b->LogProb(2), -2.0);
  // Only position 2 of each chunk has a record.
  EXPECT_FALSE(r->Record(0, 1).ok());
  EXPECT_FALSE(r->Record(0, 3).ok());
  EXPECT_FALSE(r->Record(2, 2).ok());
}

// KL, Δp, nll and top-1 of candidate logits against the hand-built records, computed here from
// the definitions. Both sides do about ten double operations on values of magnitude ≤ 25, so
// they agree to far better than 1e-12 (2^-53 relative per operation).
TEST(LlamaLogitsFile, ComparisonWithAHandBuiltRecordIsTheHandComputedOne) {
  const std::string path = TempPath("hand_kl.bin");
  WriteBytes(path, HandBuilt());
  Result<LlamaLogitsReader> r = LlamaLogitsReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const float logits[3] = {1.0f, 2.0f, 3.0f};
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  const double lp[3] = {1 - lse, 2 - lse, 3 - lse};

  // Chunk 0: target = tokens[3] = 1; base log p = −3, −2, 0; top-1: candidate 2, base 2.
  const KlPosition a = CompareWithBase(logits, 3, *r->Record(0, 2), r->tokens()[3]);
  const double kl_a = std::exp(-3.0) * (-3 - lp[0]) + std::exp(-2.0) * (-2 - lp[1]) + 1.0 * (0 - lp[2]);
  EXPECT_NEAR(a.kl, kl_a, 1e-12);
  EXPECT_NEAR(a.nll, -lp[1], 1e-12);
  EXPECT_EQ(a.nll_base, 2.0);
  EXPECT_NEAR(a.p_diff, std::exp(lp[1]) - std::exp(-2.0), 1e-12);
  EXPECT_TRUE(a.same_top);

  // Chunk 1: target = tokens[7] = 0; base log p = −20 (left out of KL), 0, −2; top-1: 2 vs 1.
  const KlPosition b = CompareWithBase(logits, 3, *r->Record(1, 2), r->tokens()[7]);
  const double kl_b = 1.0 * (0 - lp[1]) + std::exp(-2.0) * (-2 - lp[2]);
  EXPECT_NEAR(b.kl, kl_b, 1e-12);
  EXPECT_NEAR(b.nll, -lp[0], 1e-12);
  EXPECT_EQ(b.nll_base, 20.0);
  EXPECT_NEAR(b.p_diff, std::exp(lp[0]) - std::exp(-20.0), 1e-12);
  EXPECT_FALSE(b.same_top);

  // The summary of the two: mean KL, same top 1/2, medians of two values are their means.
  const std::vector<KlPosition> both = {a, b};
  const KlSummary s = Summarize(both);
  EXPECT_EQ(s.count, 2);
  EXPECT_NEAR(s.kl.value, (kl_a + kl_b) / 2, 1e-12);
  EXPECT_EQ(s.kl.error, 0.0);  // llama.cpp gives no uncertainty below 11 positions
  EXPECT_EQ(s.same_top_count, 1);
  EXPECT_EQ(s.same_top.value, 0.5);
  EXPECT_NEAR(s.ppl.value, std::exp((a.nll + b.nll) / 2), 1e-12);
  EXPECT_NEAR(s.ppl_base.value, std::exp(11.0), 1e-12 * std::exp(11.0));
  for (const Quantile& q : s.kl_quantiles) {
    if (q.name == "max") {
      EXPECT_EQ(q.value, std::max(a.kl, b.kl));
    }
    if (q.name == "min") {
      EXPECT_EQ(q.value, std::min(a.kl, b.kl));
    }
    if (q.name == "median") {
      EXPECT_EQ(q.value, 0.5 * (a.kl + b.kl));
    }
    if (q.name == "90.0%") {
      EXPECT_NEAR(q.value, std::min(a.kl, b.kl) + 0.9 * std::abs(a.kl - b.kl), 1e-12);
    }
  }
}

// The encoder on logits {0, 1, −20, 0.5, −14.9}: max 1, min clamped to 1 − 16 = −15, scale
// 16/65535, codes (l + 15)·65535/16 rounded to nearest: 61439.06 → 61439, 65535, 0 (below the
// clamp), 63487.03 → 63487, 409.59 → 410 (not 409: rounded, not cut);
// min_log_prob = −16 − log(e^−1 + 1 + e^−21 + e^−0.5 + e^−15.9). Odd vocabulary: a zero pad after.
TEST(LlamaLogitsFile, TheEncoderGivesTheHandComputedCodes) {
  const float logits[5] = {0.0f, 1.0f, -20.0f, 0.5f, -14.9f};
  std::vector<uint16_t> record(4 + 6, 0xFFFF);
  EncodeLlamaLogProbs(logits, 5, record.data());
  LlamaLogProbs view(record.data());
  EXPECT_EQ(view.scale(), 16.0f / 65535.0f);
  const double lse = std::log(std::exp(-1.0) + 1 + std::exp(-21.0) + std::exp(-0.5) + std::exp(-15.9));
  EXPECT_NEAR(view.min_log_prob(), -16 - lse, 4e-6);  // float: 2^-24 relative of ~17, a few ops
  EXPECT_EQ(view.code(0), 61439);
  EXPECT_EQ(view.code(1), 65535);
  EXPECT_EQ(view.code(2), 0);
  EXPECT_EQ(view.code(3), 63487);
  EXPECT_EQ(view.code(4), 410);
  EXPECT_EQ(record[9], 0);  // the pad
  // Equal logits: scale 0, every code 0, log p = −log n for all.
  const float flat[4] = {2.0f, 2.0f, 2.0f, 2.0f};
  std::vector<uint16_t> r2(8, 0xFFFF);
  EncodeLlamaLogProbs(flat, 4, r2.data());
  LlamaLogProbs v2(r2.data());
  EXPECT_EQ(v2.scale(), 0.0f);
  EXPECT_NEAR(v2.LogProb(3), -std::log(4.0), 1e-6);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(v2.code(i), 0);
}

// What the writer writes is the header, the ids and exactly EncodeLlamaLogProbs of each logits
// row, in order: the reader gives the same bytes back.
TEST(LlamaLogitsFile, AWrittenFileHoldsExactlyTheEncodedRecords) {
  const std::string path = TempPath("written.bin");
  const int32_t n_ctx = 6, n_vocab = 7;  // first 3, positions 3 and 4 scored; odd vocabulary
  const std::vector<int32_t> tokens = {0, 1, 2, 3, 4, 5, 6, 5, 4, 3, 2, 1};
  Result<std::unique_ptr<LlamaLogitsWriter>> w = LlamaLogitsWriter::Create(path, n_ctx, n_vocab, tokens);
  ASSERT_TRUE(w.ok()) << w.status().message();
  std::vector<std::vector<float>> rows;
  for (int k = 0; k < 4; ++k) {
    std::vector<float> row(n_vocab);
    for (int i = 0; i < n_vocab; ++i) row[i] = std::sin(1.7f * static_cast<float>(i * (k + 1))) * 9.0f - k;
    rows.push_back(row);
    ASSERT_TRUE((*w)->Append(row.data()).ok());
  }
  EXPECT_FALSE((*w)->Append(rows[0].data()).ok());  // a fifth record does not fit
  ASSERT_TRUE((*w)->Close().ok());

  Result<LlamaLogitsReader> r = LlamaLogitsReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(std::vector<int32_t>(r->tokens().begin(), r->tokens().end()), tokens);
  const std::string bytes = Slurp(path);
  for (int k = 0; k < 4; ++k) {
    std::vector<uint16_t> expected(r->layout().record_u16());
    EncodeLlamaLogProbs(rows[k].data(), n_vocab, expected.data());
    const size_t offset = static_cast<size_t>(r->layout().header_bytes()) + k * expected.size() * 2;
    EXPECT_EQ(std::memcmp(bytes.data() + offset, expected.data(), expected.size() * 2), 0) << "record " << k;
  }
}

TEST(LlamaLogitsFile, AnIncompleteWriteLeavesNoFile) {
  const std::string path = TempPath("incomplete.bin");
  const std::vector<int32_t> tokens = {0, 1, 2, 0};
  {
    Result<std::unique_ptr<LlamaLogitsWriter>> w = LlamaLogitsWriter::Create(path, 4, 3, tokens);
    ASSERT_TRUE(w.ok());
    const Status s = (*w)->Close();  // no record appended: one was due
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("0 of 1 records"), std::string::npos) << s.message();
  }
  EXPECT_FALSE(std::ifstream(path).good());
  EXPECT_FALSE(LlamaLogitsWriter::Create(path, 4, 3, std::vector<int32_t>{0, 1, 2}).ok());  // not whole chunks
  EXPECT_FALSE(LlamaLogitsWriter::Create(path, 4, 3, std::vector<int32_t>{0, 1, 3, 0}).ok());  // id 3 ≥ vocab
}

// Expects Open(path of `bytes`) to fail with a message naming the file and holding `what`.
void ExpectRefused(const std::string& name, const std::string& bytes, const std::string& what) {
  const std::string path = TempPath(name);
  WriteBytes(path, bytes);
  Result<LlamaLogitsReader> r = LlamaLogitsReader::Open(path);
  ASSERT_FALSE(r.ok()) << name;
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().message();
}

TEST(LlamaLogitsFile, BadFilesAreRefusedNamingTheFileAndWhatWasExpected) {
  const std::string good = HandBuilt();
  ExpectRefused("short_header.bin", good.substr(0, 10), "truncated: 10 bytes, but a llama.cpp logits file's header");
  ExpectRefused("cut_record.bin", good.substr(0, good.size() - 1), "truncated: 83 bytes, expected 84");
  ExpectRefused("cut_tokens.bin", good.substr(0, 30), "truncated: 30 bytes, expected 84");
  ExpectRefused("trailing.bin", good + "x", "1 bytes follow the last record");
  std::string magic = good;
  magic[1] = 'L';
  ExpectRefused("magic.bin", magic, "starts with \"_Logits_\", expected \"_logits_\"");
  ExpectRefused("gguf.bin", "GGUF" + good.substr(4), "not a llama.cpp logits file");
  std::string small_ctx = good;
  const int32_t two = 2;
  std::memcpy(small_ctx.data() + 8, &two, 4);
  ExpectRefused("n_ctx.bin", small_ctx, "n_ctx is 2; expected at least 3");
  std::string no_chunks = good;
  const int32_t zero = 0;
  std::memcpy(no_chunks.data() + 16, &zero, 4);
  ExpectRefused("n_chunk.bin", no_chunks, "n_chunk is 0");
  std::string bad_id = good;
  const int32_t id = 3;  // n_vocab is 3
  std::memcpy(bad_id.data() + 20 + 4 * 5, &id, 4);
  ExpectRefused("bad_id.bin", bad_id, "token 5 (chunk 1, position 1) is 3; expected an id in 0..2");
  std::string bad_scale = good;
  const float nan = std::nanf("");
  std::memcpy(bad_scale.data() + 20 + 32, &nan, 4);
  WriteBytes(TempPath("bad_scale.bin"), bad_scale);
  Result<LlamaLogitsReader> r = LlamaLogitsReader::Open(TempPath("bad_scale.bin"));
  ASSERT_TRUE(r.ok());
  const Result<LlamaLogProbs> rec = r->Record(0, 2);
  ASSERT_FALSE(rec.ok());
  EXPECT_NE(rec.status().message().find("chunk 0 position 2 has scale nan"), std::string::npos)
      << rec.status().message();
  const Result<LlamaLogitsReader> missing = LlamaLogitsReader::Open(TempPath("no_such_file.bin"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no_such_file.bin"), std::string::npos);
}

// The model-side checks: vocabulary, context, and the ids against kvq's own tokenization.
TEST(LlamaLogitsFile, AFileForAnotherModelOrTextIsRefused) {
  const std::string path = TempPath("hand_match.bin");
  WriteBytes(path, HandBuilt());
  Result<LlamaLogitsReader> r = LlamaLogitsReader::Open(path);
  ASSERT_TRUE(r.ok());
  const std::vector<int32_t> text = {1, 2, 0, 1, 2, 2, 1, 0, 2};  // one id more than the file: fine
  EXPECT_TRUE(CheckBaseMatches(*r, 3, 512, text).ok());
  auto refused = [&](int32_t vocab, int64_t seq_len, const std::vector<int32_t>& ids, const std::string& what) {
    const Status s = CheckBaseMatches(*r, vocab, seq_len, ids);
    ASSERT_FALSE(s.ok()) << what;
    EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
  };
  refused(512, 512, text, "a vocabulary of 3 tokens, but this model's has 512");
  refused(3, 3, text, "n_ctx 4 tokens, more than this model's context of 3 positions");
  refused(3, 512, {1, 2, 0, 1, 2, 2, 0, 0}, "token 6 (chunk 1, position 2) is 1, but kvq's tokenization of the "
                                            "text gives 0 there");
  refused(3, 512, {1, 2, 0, 1, 2}, "holds 2 chunks of 4 tokens (8 ids), but the text gives only 5 tokens");
}

}  // namespace
}  // namespace kvq
