// Synthetic models (model/synth.h): tiny files in F16, Q8_0 and Q4_0 load and run; tensors,
// metadata and the copied (and padded) vocabulary are as llama.cpp's conventions say; the bytes
// depend on the seed and never on the thread count; every truncation of a file is refused by
// name; the presets have the published shapes and parameter counts; qwen2 and rope-scaled llama
// files load and run; bad specs are refused naming the flag. The quantisers and the writer's
// streaming and failure paths are in synth_writer_test.cc.
#include "synth/synth.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "base/float_codes.h"
#include "kvq/format.h"
#include "gguf/gguf_writer.h"
#include "model/decoder.h"
#include "model/load_model.h"
#include "weights/matvec.h"
#include "weights/weight_type.h"
#include "test_util/file_bytes.h"
#include "test_util/bundled_paths.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

const std::string kStories = test::BundledGgufPath();
const std::string kLlamaSpm =
    std::string(KVQ_SOURCE_DIR) + "/tests/testdata/vocab/ggml-vocab-llama-spm.gguf";

void WriteAll(const std::string& path, const uint8_t* data, size_t n) {
  // A new file each time: ext4 flushes a file truncated over its old data when it is closed
  // (auto_da_alloc), which made rewriting one file thousands of times take half a minute.
  std::remove(path.c_str());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n));
}

class SynthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / fmt::format("kvq_synth_{}_{}", ::getpid(), counter_++);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
  static inline int counter_ = 0;
};

// The tiny llama shape of the brief: dim 64, 2 layers, 4 heads, 2 KV heads, ffn 128.
SynthSpec Tiny(GgmlType type) {
  return SynthSpec{.arch = SynthArch::kLlama, .dim = 64, .n_layers = 2, .n_heads = 4,
                   .n_kv_heads = 2, .hidden_dim = 128, .context = 256,
                   .type = FindWeightTypeByGgufId(static_cast<uint32_t>(type))->name, .seed = 7};
}

struct WantTensor {
  std::string name;
  GgmlType type;
  std::vector<int64_t> dims;
};

// The tensors llama.cpp's conventions name for a spec, written out independently of synth.cc.
std::vector<WantTensor> ExpectedTensors(const SynthSpec& s, int64_t vocab) {
  const int64_t d = s.dim, kv = s.dim / s.n_heads * s.kv_heads(), f = s.hidden_dim;
  const auto m = static_cast<GgmlType>((*FindWeightTypeByName(s.type))->gguf_type);  // every matrix
  std::vector<WantTensor> t;
  if (s.rope_scaling) t.push_back({"rope_freqs.weight", GgmlType::kF32, {d / s.n_heads / 2}});
  t.push_back({"token_embd.weight", m, {d, vocab}});
  for (int64_t l = 0; l < s.n_layers; ++l) {
    const std::string b = fmt::format("blk.{}.", l);
    t.push_back({b + "attn_norm.weight", GgmlType::kF32, {d}});
    t.push_back({b + "attn_q.weight", m, {d, d}});
    if (s.qkv_bias) t.push_back({b + "attn_q.bias", GgmlType::kF32, {d}});
    t.push_back({b + "attn_k.weight", m, {d, kv}});
    if (s.qkv_bias) t.push_back({b + "attn_k.bias", GgmlType::kF32, {kv}});
    t.push_back({b + "attn_v.weight", m, {d, kv}});
    if (s.qkv_bias) t.push_back({b + "attn_v.bias", GgmlType::kF32, {kv}});
    t.push_back({b + "attn_output.weight", m, {d, d}});
    t.push_back({b + "ffn_norm.weight", GgmlType::kF32, {d}});
    t.push_back({b + "ffn_gate.weight", m, {d, f}});
    t.push_back({b + "ffn_up.weight", m, {d, f}});
    t.push_back({b + "ffn_down.weight", m, {f, d}});
  }
  t.push_back({"output_norm.weight", GgmlType::kF32, {d}});
  if (s.embeddings == SynthEmbeddings::kSeparate) t.push_back({"output.weight", m, {d, vocab}});
  return t;
}

void ExpectTensors(const GgufFile& f, const std::vector<WantTensor>& want) {
  ASSERT_EQ(f.tensors().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const GgufTensor& t = f.tensors()[i];
    EXPECT_EQ(t.name, want[i].name);
    EXPECT_EQ(t.type, want[i].type) << t.name;
    EXPECT_EQ(t.dims, want[i].dims) << t.name;
  }
}

// Every tokenizer.* key of `src`, in order, stored with the same bytes in `out` (and no other
// tokenizer key), except the keys in `padded`.
void ExpectVocabularyCopied(const GgufFile& src, const GgufFile& out,
                            const std::vector<std::string>& padded = {}) {
  std::vector<std::string> src_keys, out_keys;
  for (const GgufKeyValue& kv : src.metadata()) {
    if (kv.key.starts_with("tokenizer.")) src_keys.push_back(kv.key);
  }
  for (const GgufKeyValue& kv : out.metadata()) {
    if (kv.key.starts_with("tokenizer.")) out_keys.push_back(kv.key);
  }
  EXPECT_EQ(out_keys, src_keys);
  for (const std::string& key : src_keys) {
    if (std::find(padded.begin(), padded.end(), key) != padded.end()) continue;
    ASSERT_TRUE(out.Find(key) != nullptr) << key;
    EXPECT_EQ(GgufEncodeValue(*out.Find(key)).bytes, GgufEncodeValue(*src.Find(key)).bytes) << key;
    EXPECT_EQ(out.Find(key)->type, src.Find(key)->type) << key;
  }
}

// Runs a few tokens through the model; returns the last logits.
std::vector<float> RunTokens(LoadedModel loaded, int n_tokens) {
  const DecoderConfig c = loaded.weights.config;
  const FormatDesc* f32 = *FindFormat("f32");
  auto cache = KvCache::Create({.n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads,
                                .head_dim = c.head_dim(), .layers = {{f32, f32}},
                                .max_positions = 64, .page_positions = 32});
  EXPECT_TRUE(cache.ok());
  DecoderModel model(std::move(loaded.weights), 1);
  std::vector<float> logits(c.vocab_size);
  const std::vector<int32_t> ids = loaded.tokenizer.Encode("Once upon a time", true);
  for (int pos = 0; pos < n_tokens; ++pos) {
    const int32_t token = ids[pos % ids.size()];
    EXPECT_TRUE(model.Forward(token, pos, **cache, logits.data()).ok());
  }
  return logits;
}

double Rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s / static_cast<double>(v.size()));
}

// ---- tiny models ----

TEST_F(SynthTest, TinyModelsLoadRunAndHaveTheConventionalLayout) {
  for (GgmlType type : {GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    SCOPED_TRACE(GgmlTypeName(type));
    const SynthSpec spec = Tiny(type);
    const std::string path = Path(fmt::format("tiny_{}.gguf", GgmlTypeName(type)));
    ASSERT_TRUE(WriteSynthModel(spec, kStories, path).ok());
    auto f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status().message();
    ExpectTensors(**f, ExpectedTensors(spec, 512));
    EXPECT_EQ(*(*f)->GetString("general.architecture"), "llama");
    // llama_ftype: MOSTLY_F16 1, MOSTLY_Q4_0 2, MOSTLY_Q8_0 7.
    EXPECT_EQ(*(*f)->GetU32("general.file_type"),
              type == GgmlType::kF16 ? 1u : type == GgmlType::kQ4_0 ? 2u : 7u);
    const std::pair<const char*, uint32_t> keys[] = {
        {"llama.context_length", 256},     {"llama.embedding_length", 64},
        {"llama.block_count", 2},          {"llama.feed_forward_length", 128},
        {"llama.attention.head_count", 4}, {"llama.attention.head_count_kv", 2},
        {"llama.rope.dimension_count", 16}, {"llama.vocab_size", 512}};
    for (const auto& [key, value] : keys) {
      ASSERT_TRUE((*f)->GetU32(key).ok()) << key;
      EXPECT_EQ(*(*f)->GetU32(key), value) << key;
    }
    EXPECT_EQ(*(*f)->GetF32("llama.rope.freq_base"), 10000.0f);
    EXPECT_EQ(*(*f)->GetF32("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
    EXPECT_EQ((*f)->Find("general.name")->type, GgufValueType::kString);
    auto src = GgufFile::Open(kStories);
    ASSERT_TRUE(src.ok());
    ExpectVocabularyCopied(**src, **f);
    // Norms are exactly 1.
    const GgufTensor* norm = *(*f)->FindTensor("blk.1.ffn_norm.weight");
    for (int64_t i = 0; i < 64; ++i) {
      float v;
      std::memcpy(&v, norm->data + 4 * i, 4);
      EXPECT_EQ(v, 1.0f);
    }

    Result<LoadedModel> loaded = LoadModel(path, "");
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    EXPECT_EQ(loaded->weights.config.vocab_size, 512);
    EXPECT_EQ(loaded->weights.config.n_kv_heads, 2);
    const std::vector<float> logits = RunTokens(std::move(loaded).value(), 6);
    for (float x : logits) ASSERT_TRUE(std::isfinite(x));
    // Classifier rows have variance 1/dim and the final norm gives x unit RMS, so a logit has
    // variance ≈ 1: its RMS over 512 logits lies in [0.8, 1.25] with room to spare; [0.3, 3]
    // catches a wrong scale (variance 1 per weight would give RMS 8) without being fragile.
    EXPECT_GT(Rms(logits), 0.3);
    EXPECT_LT(Rms(logits), 3.0);
  }
}

TEST_F(SynthTest, ActivationsStaySaneThroughManyLayers) {
  SynthSpec spec = Tiny(GgmlType::kQ4_0);
  spec.n_layers = 48;
  const std::string path = Path("deep.gguf");
  ASSERT_TRUE(WriteSynthModel(spec, kStories, path).ok());
  Result<LoadedModel> loaded = LoadModel(path, "");
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  const std::vector<float> logits = RunTokens(std::move(loaded).value(), 12);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  EXPECT_GT(Rms(logits), 0.3);  // the same bounds as for 2 layers (see above)
  EXPECT_LT(Rms(logits), 3.0);
}

TEST_F(SynthTest, WeightsHaveTheDocumentedVariance) {
  // Uniform on (−a, a), a = sqrt(3/cols): variance 1/cols. token_embd has 512 × 64 = 32,768
  // weights, so the sample variance is within ±3% of its mean with overwhelming probability
  // (relative sd sqrt(0.8 / n) ≈ 0.5%); quantisation adds at most d²/12 per weight (Q4_0:
  // d = a/8, +0.5%). A 10% band holds every type and fails for any other scale.
  for (GgmlType type : {GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    SCOPED_TRACE(GgmlTypeName(type));
    const std::string path = Path("var.gguf");
    ASSERT_TRUE(WriteSynthModel(Tiny(type), kStories, path).ok());
    Result<LoadedModel> m = LoadModel(path, "");
    ASSERT_TRUE(m.ok());
    const Matrix& e = m->weights.token_embedding;
    double sum = 0, sum2 = 0;
    std::vector<float> row(e.cols);
    for (int64_t r = 0; r < e.rows; ++r) {
      DecodeWeightRow(e, r, row.data());
      for (float x : row) {
        sum += x;
        sum2 += static_cast<double>(x) * x;
      }
    }
    const double n = static_cast<double>(e.rows * e.cols);
    EXPECT_NEAR(sum / n, 0.0, 0.004);  // mean: sd of the mean is 0.125/181 ≈ 0.0007, 6 sd
    EXPECT_NEAR(sum2 / n * 64.0, 1.0, 0.10);
  }
}

// ---- determinism ----

TEST_F(SynthTest, SeedDecidesTheBytesAndThreadsDoNot) {
  for (GgmlType type : {GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    SCOPED_TRACE(GgmlTypeName(type));
    SynthSpec a = Tiny(type);
    a.threads = 1;
    SynthSpec b = a, c = a, other = a;
    b.threads = 3;
    c.threads = 1;
    other.seed = 8;
    ASSERT_TRUE(WriteSynthModel(a, kStories, Path("a.gguf")).ok());
    ASSERT_TRUE(WriteSynthModel(b, kStories, Path("b.gguf")).ok());
    ASSERT_TRUE(WriteSynthModel(c, kStories, Path("c.gguf")).ok());
    ASSERT_TRUE(WriteSynthModel(other, kStories, Path("other.gguf")).ok());
    const Bytes ba = test::ReadFileBytes(Path("a.gguf"));
    ASSERT_GT(ba.size(), 50000u);
    EXPECT_TRUE(ba == test::ReadFileBytes(Path("b.gguf")));  // 3 threads: the same bytes
    EXPECT_TRUE(ba == test::ReadFileBytes(Path("c.gguf")));  // a second run: the same bytes
    // Another seed: every random tensor's data differs (not just the description naming it).
    auto fa = GgufFile::Open(Path("a.gguf"));
    auto fo = GgufFile::Open(Path("other.gguf"));
    ASSERT_TRUE(fa.ok() && fo.ok());
    for (size_t i = 0; i < (*fa)->tensors().size(); ++i) {
      const GgufTensor& x = (*fa)->tensors()[i];
      const GgufTensor& y = (*fo)->tensors()[i];
      if (x.name.find("norm") != std::string::npos) continue;  // constant 1
      EXPECT_NE(std::memcmp(x.data, y.data, static_cast<size_t>(x.n_bytes)), 0) << x.name;
    }
  }
}

// ---- vocabulary ----

TEST_F(SynthTest, LargerVocabSizePadsWithControlTokens) {
  SynthSpec spec = Tiny(GgmlType::kQ8_0);
  spec.vocab_size = 600;
  const std::string path = Path("padded.gguf");
  ASSERT_TRUE(WriteSynthModel(spec, kStories, path).ok());
  auto f = GgufFile::Open(path);
  auto src = GgufFile::Open(kStories);
  ASSERT_TRUE(f.ok() && src.ok());
  ExpectTensors(**f, ExpectedTensors(spec, 600));
  const std::vector<std::string> padded = {"tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                                           "tokenizer.ggml.token_type"};
  ExpectVocabularyCopied(**src, **f, padded);
  auto tokens = (*f)->GetStringArray("tokenizer.ggml.tokens");
  auto src_tokens = (*src)->GetStringArray("tokenizer.ggml.tokens");
  auto scores = (*f)->GetF32Array("tokenizer.ggml.scores");
  auto src_scores = (*src)->GetF32Array("tokenizer.ggml.scores");
  auto types = (*f)->GetI32Array("tokenizer.ggml.token_type");
  auto src_types = (*src)->GetI32Array("tokenizer.ggml.token_type");
  ASSERT_TRUE(tokens.ok() && scores.ok() && types.ok());
  ASSERT_EQ(tokens->size(), 600u);
  ASSERT_EQ(scores->size(), 600u);
  ASSERT_EQ(types->size(), 600u);
  for (size_t i = 0; i < 512; ++i) {
    EXPECT_EQ((*tokens)[i], (*src_tokens)[i]);
    EXPECT_EQ((*scores)[i], (*src_scores)[i]);
    EXPECT_EQ((*types)[i], (*src_types)[i]);
  }
  for (size_t i = 512; i < 600; ++i) {
    EXPECT_EQ((*tokens)[i], fmt::format("<|synth_pad_{}|>", i));
    EXPECT_EQ((*scores)[i], 0.0f);
    EXPECT_EQ((*types)[i], 3);  // control
  }
  // It loads, and text tokenizes with the real pieces only.
  Result<LoadedModel> m = LoadModel(path, "");
  ASSERT_TRUE(m.ok()) << m.status().message();
  Result<LoadedModel> stories = LoadModel(kStories, "");
  ASSERT_TRUE(stories.ok());
  const std::string text = "Once upon a time, a little girl named Lily found a ball.";
  EXPECT_EQ(m->tokenizer.Encode(text, true), stories->tokenizer.Encode(text, true));
  const std::vector<float> logits = RunTokens(std::move(m).value(), 3);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

TEST_F(SynthTest, OtherArraysAndEveryValueTypeAreCopiedAsTheyAre) {
  // A vocabulary file of our own: merges (a STRING array), token types as UINT8, scores as
  // FLOAT64, nested arrays and scalars of several types; non-tokenizer keys stay behind.
  GgufWriter v;
  std::vector<GgufEncoded> pairs = {
      GgufEncodeArray(GgufValueType::kInt16, {GgufEncode(int16_t{-3}), GgufEncode(int16_t{7})}),
      GgufEncodeArray(GgufValueType::kString, {GgufEncodeString("x")})};
  std::vector<GgufEncoded> types, scores;
  std::vector<std::string> tokens;
  for (int i = 0; i < 40; ++i) {
    tokens.push_back(fmt::format("tok{}", i));
    types.push_back(GgufEncode(uint8_t{1}));
    scores.push_back(GgufEncode(-0.5 * i));
  }
  ASSERT_TRUE(v.SetString("general.name", "not copied").ok());
  ASSERT_TRUE(v.SetString("tokenizer.ggml.model", "llama").ok());
  ASSERT_TRUE(v.SetStringArray("tokenizer.ggml.tokens", tokens).ok());
  ASSERT_TRUE(v.Set("tokenizer.ggml.scores", GgufEncodeArray(GgufValueType::kFloat64, scores)).ok());
  ASSERT_TRUE(v.Set("tokenizer.ggml.token_type", GgufEncodeArray(GgufValueType::kUint8, types)).ok());
  ASSERT_TRUE(v.SetStringArray("tokenizer.ggml.merges", {"t o", "to k", "tok 1"}).ok());
  ASSERT_TRUE(v.Set("tokenizer.kvq.nested", GgufEncodeArray(GgufValueType::kArray, pairs)).ok());
  ASSERT_TRUE(v.Set("tokenizer.kvq.u16", GgufEncode(uint16_t{65535})).ok());
  ASSERT_TRUE(v.Set("tokenizer.kvq.i64", GgufEncode(int64_t{-5})).ok());
  ASSERT_TRUE(v.SetBool("tokenizer.ggml.add_bos_token", false).ok());
  ASSERT_TRUE(v.SetF32("tokenizer.kvq.f32", 0.1f).ok());
  const std::string vocab = Path("vocab.gguf");
  ASSERT_TRUE(v.Write(vocab).ok());
  auto src = GgufFile::Open(vocab);
  ASSERT_TRUE(src.ok());

  SynthSpec spec = Tiny(GgmlType::kF16);
  for (int64_t size : {int64_t{0}, int64_t{64}}) {
    spec.vocab_size = size;
    const std::string path = Path(fmt::format("v{}.gguf", size));
    ASSERT_TRUE(WriteSynthModel(spec, vocab, path).ok());
    auto f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(*(*f)->GetString("general.name"), "synth-llama-64x2");
    if (size == 0) {
      ExpectVocabularyCopied(**src, **f);
      ExpectTensors(**f, ExpectedTensors(spec, 40));
      continue;
    }
    ExpectVocabularyCopied(**src, **f, {"tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                                        "tokenizer.ggml.token_type"});
    ExpectTensors(**f, ExpectedTensors(spec, 64));
    // The padded arrays keep their element types.
    auto pscores = (*f)->GetArray("tokenizer.ggml.scores");
    auto ttypes = (*f)->GetArray("tokenizer.ggml.token_type");
    ASSERT_TRUE(pscores.ok() && ttypes.ok());
    EXPECT_EQ((*pscores)->element_type, GgufValueType::kFloat64);
    EXPECT_EQ((*ttypes)->element_type, GgufValueType::kUint8);
    ASSERT_EQ((*pscores)->size, 64);
    EXPECT_EQ((*pscores)->NumberAt(39), -19.5);
    EXPECT_EQ((*pscores)->NumberAt(40), 0.0);
    EXPECT_EQ((*ttypes)->NumberAt(39), 1.0);
    EXPECT_EQ((*ttypes)->NumberAt(63), 3.0);
  }
}

TEST_F(SynthTest, VocabularyErrorsNameTheFlagAndFile) {
  SynthSpec spec = Tiny(GgmlType::kQ8_0);
  spec.vocab_size = 500;  // the bundled vocabulary has 512
  Result<SynthSummary> small = SummarizeSynthModel(spec, kStories);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("--vocab-size 500"), std::string::npos);
  EXPECT_NE(small.status().message().find(kStories), std::string::npos);
  const Status missing = WriteSynthModel(Tiny(GgmlType::kQ8_0), Path("none.gguf"), Path("o.gguf"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("--vocab"), std::string::npos);
  EXPECT_NE(missing.message().find(Path("none.gguf")), std::string::npos);
  // A GGUF file without a vocabulary.
  GgufWriter w;
  ASSERT_TRUE(w.SetString("general.name", "x").ok());
  ASSERT_TRUE(w.Write(Path("novocab.gguf")).ok());
  const Status none = WriteSynthModel(Tiny(GgmlType::kQ8_0), Path("novocab.gguf"), Path("o.gguf"));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.message().find("tokenizer.ggml.tokens"), std::string::npos);
  EXPECT_FALSE(fs::exists(Path("o.gguf")));
}

// ---- damaged files ----

TEST_F(SynthTest, EveryTruncationIsRefusedNamingTheFile) {
  const std::string path = Path("full.gguf");
  ASSERT_TRUE(WriteSynthModel(Tiny(GgmlType::kQ4_0), kStories, path).ok());
  const Bytes full = test::ReadFileBytes(path);
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok());
  const int64_t header = (*f)->data_offset();
  const GgufTensor& last = (*f)->tensors().back();
  // The last tensor ends at the end of the file (no trailing padding), so end − 1 cuts data.
  ASSERT_EQ(static_cast<int64_t>(full.size()), header + static_cast<int64_t>(last.offset) + last.n_bytes);
  std::vector<int64_t> cuts;
  for (int64_t n = 0; n < header; ++n) cuts.push_back(n);
  const int64_t data = static_cast<int64_t>(full.size()) - header;
  for (int64_t k = 0; k < 300; ++k) cuts.push_back(header + data * k / 300);
  cuts.push_back(static_cast<int64_t>(full.size()) - 1);
  const std::string cut_path = Path("cut.gguf");
  for (int64_t n : cuts) {
    WriteAll(cut_path, full.data(), static_cast<size_t>(n));
    Result<LoadedModel> m = LoadModel(cut_path, "");
    ASSERT_FALSE(m.ok()) << "truncated at " << n << " of " << full.size();
    ASSERT_NE(m.status().message().find(cut_path), std::string::npos)
        << "truncated at " << n << ": " << m.status().message();
  }
}

// ---- presets ----

struct PublishedShape {
  const char* preset;
  SynthArch arch;
  int64_t dim, layers, heads, kv_heads, ffn, vocab, context;
  float theta, eps;
  SynthEmbeddings embeddings;
  bool bias, scaled;
  int64_t published_parameters;  // the model card's exact count
};

// Parameters from the shape, written out here independently of synth.cc.
int64_t CountParameters(const PublishedShape& p) {
  const int64_t kv = p.dim / p.heads * p.kv_heads;
  const int64_t layer = 2 * p.dim + 2 * p.dim * p.dim + 2 * p.dim * kv + 3 * p.dim * p.ffn +
                        (p.bias ? p.dim + 2 * kv : 0);
  const int64_t embed = p.vocab * p.dim * (p.embeddings == SynthEmbeddings::kTied ? 1 : 2);
  return embed + p.layers * layer + p.dim;
}

TEST(SynthPresets, PublishedShapesAndParameterCounts) {
  const PublishedShape shapes[] = {
      {"llama-3.2-1b", SynthArch::kLlama, 2048, 16, 32, 8, 8192, 128256, 131072, 500000.0f, 1e-5f,
       SynthEmbeddings::kTied, false, true, 1235814400},
      {"qwen2.5-0.5b", SynthArch::kQwen2, 896, 24, 14, 2, 4864, 151936, 32768, 1000000.0f, 1e-6f,
       SynthEmbeddings::kTied, true, false, 494032768},
      {"llama-2-7b", SynthArch::kLlama, 4096, 32, 32, 32, 11008, 32000, 4096, 10000.0f, 1e-5f,
       SynthEmbeddings::kSeparate, false, false, 6738415616},
  };
  // The three qwen3-architecture presets are checked in synth_qwen3_test.cc, the four hybrids
  // (qwen3.5-35b-a3b and the tiny ones) in synth_hybrid_test.cc.
  EXPECT_EQ(SynthPresetNames().size(), std::size(shapes) + 3 + 4);
  for (const PublishedShape& p : shapes) {
    SCOPED_TRACE(p.preset);
    Result<SynthSpec> s = SynthPreset(p.preset);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->arch, p.arch);
    EXPECT_EQ(s->dim, p.dim);
    EXPECT_EQ(s->n_layers, p.layers);
    EXPECT_EQ(s->n_heads, p.heads);
    EXPECT_EQ(s->kv_heads(), p.kv_heads);
    EXPECT_EQ(s->head_dim(), p.dim / p.heads);
    EXPECT_EQ(s->hidden_dim, p.ffn);
    EXPECT_EQ(s->vocab_size, p.vocab);
    EXPECT_EQ(s->context, p.context);
    EXPECT_EQ(s->rope_theta, p.theta);
    EXPECT_EQ(s->norm_eps, p.eps);
    EXPECT_EQ(s->embeddings, p.embeddings);
    EXPECT_EQ(s->qkv_bias, p.bias);
    ASSERT_EQ(s->rope_scaling.has_value(), p.scaled);
    if (p.scaled) {
      EXPECT_EQ(s->rope_scaling->factor, 32.0f);
      EXPECT_EQ(s->rope_scaling->low_freq_factor, 1.0f);
      EXPECT_EQ(s->rope_scaling->high_freq_factor, 4.0f);
      EXPECT_EQ(s->rope_scaling->original_context, 8192);
    }
    EXPECT_TRUE(ValidateSynthSpec(*s).ok());
    EXPECT_EQ(CountParameters(p), p.published_parameters);
    // What synth reports, from the spec and a vocabulary (nothing is written).
    Result<SynthSummary> sum = SummarizeSynthModel(*s, kStories);
    ASSERT_TRUE(sum.ok()) << sum.status().message();
    EXPECT_EQ(sum->parameters, p.published_parameters);
    EXPECT_EQ(sum->vocabulary_tokens, 512);
    EXPECT_EQ(sum->spec.vocab_size, p.vocab);
    // The file: Q4_0 matrices (18 bytes per 32 weights) and F32 vectors, plus a header and
    // padding of at most a few MiB (the padded vocabulary's strings).
    const int64_t vectors = (2 * p.layers + 1) * p.dim + (p.bias ? p.layers * (p.dim + 2 * p.dim / p.heads * p.kv_heads) : 0);
    const int64_t matrices = p.published_parameters - vectors;
    const int64_t data = matrices / 32 * 18 + vectors * 4 + (p.scaled ? p.dim / p.heads / 2 * 4 : 0);
    EXPECT_GE(sum->file_bytes, data);
    EXPECT_LT(sum->file_bytes, data + (8 << 20));
  }
  Result<SynthSpec> unknown = SynthPreset("llama-9");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("llama-9"), std::string::npos);
  EXPECT_NE(unknown.status().message().find("llama-3.2-1b"), std::string::npos);
}

TEST(SynthPresets, Llama2VocabularyFitsWithoutPadding) {
  Result<SynthSpec> s = SynthPreset("llama-2-7b");
  ASSERT_TRUE(s.ok());
  Result<SynthSummary> sum = SummarizeSynthModel(*s, kLlamaSpm);
  ASSERT_TRUE(sum.ok()) << sum.status().message();
  EXPECT_EQ(sum->vocabulary_tokens, 32000);
  EXPECT_EQ(sum->spec.vocab_size, 32000);
}

// ---- qwen2 and rope-scaled llama: tensors, metadata, and kvq loads and runs them ----

TEST_F(SynthTest, Qwen2AndRopeScaledLlamaFilesHaveTheirTensorsKeysAndRun) {
  for (const char* preset : {"qwen2.5-0.5b", "llama-3.2-1b"}) {
    SCOPED_TRACE(preset);
    SynthSpec s = *SynthPreset(preset);
    s.dim = 64;  // the preset's conventions at the tiny shape
    s.n_layers = 2;
    s.n_heads = 4;
    s.n_kv_heads = 2;
    s.hidden_dim = 128;
    s.vocab_size = 0;
    s.type = "q8_0";
    const std::string path = Path("arch.gguf");
    ASSERT_TRUE(WriteSynthModel(s, kStories, path).ok());
    auto f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok());
    ExpectTensors(**f, ExpectedTensors(s, 512));
    const std::string a = s.arch == SynthArch::kQwen2 ? "qwen2" : "llama";
    EXPECT_EQ(*(*f)->GetString("general.architecture"), a);
    EXPECT_EQ(*(*f)->GetU32(a + ".embedding_length"), 64u);
    EXPECT_EQ(*(*f)->GetU32(a + ".rope.dimension_count"), 16u);
    EXPECT_EQ(*(*f)->GetF32(a + ".rope.freq_base"), s.rope_theta);
    EXPECT_EQ(*(*f)->GetF32(a + ".attention.layer_norm_rms_epsilon"), s.norm_eps);
    EXPECT_FALSE((*f)->Has(a + ".rope.scaling.type"));  // llama.cpp's converter stores only the tensor
    if (s.rope_scaling) {
      const GgufTensor* r = *(*f)->FindTensor("rope_freqs.weight");
      const std::vector<float> want = Llama3RopeFreqFactors(16, 500000.0f, *s.rope_scaling);
      ASSERT_EQ(r->n_elements, 8);
      for (int i = 0; i < 8; ++i) {
        float v;
        std::memcpy(&v, r->data + 4 * i, 4);
        EXPECT_EQ(v, want[i]) << i;
      }
    } else {
      // Biases: small (sd 0.02, so |b| < 0.02·sqrt(3)) and not all zero.
      const GgufTensor* b = *(*f)->FindTensor("blk.1.attn_k.bias");
      float max = 0;
      for (int i = 0; i < 32; ++i) {
        float v;
        std::memcpy(&v, b->data + 4 * i, 4);
        max = std::max(max, std::fabs(v));
      }
      EXPECT_GT(max, 0.0f);
      EXPECT_LT(max, 0.035f);
    }
    // kvq's loader reads both: qwen2's biases and halves pairing, llama's frequency factors.
    Result<LoadedModel> m = LoadModel(path, "");
    ASSERT_TRUE(m.ok()) << m.status().message();
    const DecoderConfig& c = m->weights.config;
    EXPECT_EQ(c.arch, a);
    EXPECT_EQ(c.qkv_bias, s.qkv_bias);
    EXPECT_EQ(c.rope_pairing, s.arch == SynthArch::kQwen2 ? RopePairing::kHalves : RopePairing::kAdjacent);
    EXPECT_EQ(c.rope_freq_factors,
              s.rope_scaling ? Llama3RopeFreqFactors(16, s.rope_theta, *s.rope_scaling) : std::vector<float>{});
    EXPECT_EQ(c.norm_eps, s.norm_eps);
    const std::vector<float> logits = RunTokens(std::move(m).value(), 6);
    for (float x : logits) ASSERT_TRUE(std::isfinite(x));
    EXPECT_GT(Rms(logits), 0.3);  // the bounds of the llama test (see there)
    EXPECT_LT(Rms(logits), 3.0);
  }
}

// ---- validation ----

TEST(SynthValidate, ErrorsNameTheFlag) {
  const struct {
    void (*edit)(SynthSpec&);
    const char* flag;
  } cases[] = {
      {[](SynthSpec& s) { s.n_heads = 5; }, "--heads 5 does not divide --dim 64"},
      {[](SynthSpec& s) { s.n_kv_heads = 3; }, "--kv-heads 3"},
      {[](SynthSpec& s) { s.dim = 48; }, "--dim 48 is not a multiple of 32"},
      {[](SynthSpec& s) { s.hidden_dim = 100; }, "--ffn 100"},
      {[](SynthSpec& s) { s.dim = 96; s.n_heads = 32; }, "is odd"},
      {[](SynthSpec& s) { s.dim = 4096; s.n_heads = 2; }, "larger than kvq's limit"},
      {[](SynthSpec& s) { s.n_layers = 0; }, "--layers"},
      {[](SynthSpec& s) { s.dim = 1 << 20; }, "--dim"},
      {[](SynthSpec& s) { s.context = 0; }, "--context"},
      {[](SynthSpec& s) { s.vocab_size = -1; }, "--vocab-size"},
      {[](SynthSpec& s) { s.threads = 0; }, "--threads"},
      {[](SynthSpec& s) { s.rope_theta = std::nanf(""); }, "--rope-theta"},
      {[](SynthSpec& s) { s.type = "iq2_xxs"; }, "--type iq2_xxs: weight type iq2_xxs is not registered"},
  };
  for (const auto& c : cases) {
    SynthSpec s = Tiny(GgmlType::kQ8_0);
    c.edit(s);
    const Status st = ValidateSynthSpec(s);
    ASSERT_FALSE(st.ok()) << c.flag;
    EXPECT_NE(st.message().find(c.flag), std::string::npos) << st.message();
  }
  // F16 rows need no whole blocks: ffn 100 is fine there.
  SynthSpec f16 = Tiny(GgmlType::kF16);
  f16.hidden_dim = 100;
  EXPECT_TRUE(ValidateSynthSpec(f16).ok());
  EXPECT_FALSE(ParseSynthType("iq2_xxs").ok());
  EXPECT_EQ(*ParseSynthType("Q4_0"), "q4_0");
  EXPECT_EQ(*ParseSynthType("Q4_K_M"), "q4_k_m");
  EXPECT_FALSE(ParseSynthArch("gemma").ok());
  EXPECT_EQ(*ParseSynthArch("mistral"), SynthArch::kMistral);
  EXPECT_STREQ(SynthGgufArch(SynthArch::kMistral), "llama");  // as llama.cpp's converter writes it
}

}  // namespace
}  // namespace kvq