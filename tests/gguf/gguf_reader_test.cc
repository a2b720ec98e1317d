// GGUF reader and writer: exact round trips of every metadata type and tensor type kvq supports,
// the two real files (the stories260K model and a Llama SentencePiece vocabulary), and a refusal
// naming the file for every kind of damage: truncation anywhere, bad magic or version, absurd
// lengths (refused before anything is allocated), bad tensor layouts and types. Corrupt files are
// built by patching bytes of written files at offsets found from the GGUF layout.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"

#include "test_util/largest_allocation.h"
#include "test_util/file_bytes.h"
#include "test_util/bundled_paths.h"

using kvq_test::g_largest_allocation;
using kvq_test::g_track_allocations;

namespace kvq {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

const std::string kStories = test::BundledGgufPath();

// The vocabulary copied into the repository's test data (llama.cpp's models/, MIT).
std::string FindSharedVocab() {
  const std::string p = std::string(KVQ_SOURCE_DIR) + "/tests/testdata/vocab/ggml-vocab-llama-spm.gguf";
  return fs::exists(p) ? p : "";
}

void WriteAll(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
void Patch(Bytes* b, size_t at, T v) {
  ASSERT_LE(at + sizeof(T), b->size());
  std::memcpy(b->data() + at, &v, sizeof(T));
}

// Position of the first occurrence of `s` as a GGUF string (u64 length, then the bytes): the
// position of its length field.
size_t FindGgufString(const Bytes& b, std::string_view s) {
  Bytes needle(8);
  const uint64_t n = s.size();
  std::memcpy(needle.data(), &n, 8);
  needle.insert(needle.end(), s.begin(), s.end());
  auto it = std::search(b.begin(), b.end(), needle.begin(), needle.end());
  EXPECT_NE(it, b.end()) << "no GGUF string '" << s << "'";
  return static_cast<size_t>(it - b.begin());
}

// Field positions of a tensor info named `name` with `n_dims` dims.
struct InfoFields {
  size_t n_dims, dims, type, offset;
};
InfoFields TensorInfo(const Bytes& b, std::string_view name, int n_dims) {
  const size_t at = FindGgufString(b, name) + 8 + name.size();
  return {at, at + 4, at + 4 + 8 * n_dims, at + 4 + 8 * n_dims + 4};
}

Bytes Iota(size_t n, uint8_t start = 0) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(start + i * 7);
  return b;
}

class GgufTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("kvq_gguf_test_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes `bytes` and expects Open to fail with a message naming the file and holding `what`.
  void ExpectRefused(const Bytes& bytes, const std::string& what) {
    const std::string path = Path("bad.gguf");
    WriteAll(path, bytes);
    Result<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
    ASSERT_FALSE(f.ok()) << "opened a corrupt file; expected: " << what;
    EXPECT_NE(f.status().message().find(path), std::string::npos) << f.status().message();
    EXPECT_NE(f.status().message().find(what), std::string::npos)
        << "message: " << f.status().message() << "\nexpected to contain: " << what;
  }

  // A small valid file: one string key and two F32 tensors ("a" [8, 2], "b" [4]).
  Bytes SmallFile() {
    GgufWriter w;
    EXPECT_TRUE(w.SetString("general.name", "tiny").ok());
    EXPECT_TRUE(w.AddTensor("a", GgmlType::kF32, {8, 2}, Iota(64)).ok());
    EXPECT_TRUE(w.AddTensor("b", GgmlType::kF32, {4}, Iota(16, 3)).ok());
    return w.Serialize();
  }

  fs::path dir_;
};

// ---- round trips ----

TEST_F(GgufTest, RoundTripsEveryValueType) {
  GgufWriter w;
  ASSERT_TRUE(w.Set("u8", GgufEncode(uint8_t{200})).ok());
  ASSERT_TRUE(w.Set("i8", GgufEncode(int8_t{-5})).ok());
  ASSERT_TRUE(w.Set("u16", GgufEncode(uint16_t{60000})).ok());
  ASSERT_TRUE(w.Set("i16", GgufEncode(int16_t{-300})).ok());
  ASSERT_TRUE(w.SetU32("u32", 4000000000u).ok());
  ASSERT_TRUE(w.SetI32("i32", -7).ok());
  ASSERT_TRUE(w.SetF32("f32", 1.5f).ok());
  ASSERT_TRUE(w.SetBool("yes", true).ok());
  ASSERT_TRUE(w.SetBool("no", false).ok());
  ASSERT_TRUE(w.SetString("str", "hello").ok());
  ASSERT_TRUE(w.SetString("empty", "").ok());
  ASSERT_TRUE(w.SetU64("u64", uint64_t{1} << 40).ok());
  ASSERT_TRUE(w.Set("i64", GgufEncode(-(int64_t{1} << 40))).ok());
  ASSERT_TRUE(w.Set("f64", GgufEncode(2.25)).ok());
  ASSERT_TRUE(w.SetStringArray("strs", {"a", "", "ccc"}).ok());
  ASSERT_TRUE(w.SetF32Array("floats", {0.5f, -1.25f, 3e10f}).ok());
  ASSERT_TRUE(w.SetI32Array("ints", {1, -2, 2147483647}).ok());
  ASSERT_TRUE(w.SetI32Array("no_ints", {}).ok());
  ASSERT_TRUE(w.SetStringArray("no_strs", {}).ok());
  ASSERT_TRUE(w.Set("bools", GgufEncodeArray(GgufValueType::kBool,
                                             {GgufEncode(true), GgufEncode(false)})).ok());
  ASSERT_TRUE(w.Set("u8s", GgufEncodeArray(GgufValueType::kUint8, {GgufEncode(uint8_t{1}),
                                                                    GgufEncode(uint8_t{255})}))
                  .ok());
  const GgufEncoded nested = GgufEncodeArray(
      GgufValueType::kArray,
      {GgufEncodeArray(GgufValueType::kInt32, {GgufEncode(int32_t{1}), GgufEncode(int32_t{2})}),
       GgufEncodeArray(GgufValueType::kString, {GgufEncodeString("x"), GgufEncodeString("")}),
       GgufEncodeArray(GgufValueType::kFloat32, {})});
  ASSERT_TRUE(w.Set("nested", nested).ok());
  const std::string path = Path("values.gguf");
  ASSERT_TRUE(w.Write(path).ok());

  Result<std::unique_ptr<GgufFile>> opened = GgufFile::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  const GgufFile& f = **opened;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  ASSERT_EQ(f.metadata().size(), 22u);
  EXPECT_EQ(f.metadata()[0].key, "u8");
  EXPECT_EQ(f.metadata()[21].key, "nested");
  EXPECT_EQ(*f.GetU32("u8"), 200u);
  EXPECT_EQ(*f.GetI32("i8"), -5);
  EXPECT_EQ(*f.GetU32("u16"), 60000u);
  EXPECT_EQ(*f.GetI32("i16"), -300);
  EXPECT_EQ(*f.GetU32("u32"), 4000000000u);
  EXPECT_EQ(*f.GetI32("i32"), -7);
  EXPECT_EQ(*f.GetU64("u64"), uint64_t{1} << 40);
  EXPECT_EQ(*f.GetI64("i64"), -(int64_t{1} << 40));
  EXPECT_EQ(*f.GetF32("f32"), 1.5f);
  EXPECT_EQ(*f.GetF32("f64"), 2.25f);
  EXPECT_EQ(*f.GetF32("i32"), -7.0f);
  EXPECT_TRUE(*f.GetBool("yes"));
  EXPECT_FALSE(*f.GetBool("no"));
  EXPECT_EQ(*f.GetString("str"), "hello");
  EXPECT_EQ(*f.GetString("empty"), "");
  EXPECT_EQ(f.Find("u8")->type, GgufValueType::kUint8);
  EXPECT_EQ(f.Find("i16")->type, GgufValueType::kInt16);
  EXPECT_EQ(f.Find("f64")->type, GgufValueType::kFloat64);
  EXPECT_TRUE(f.Has("nested"));
  EXPECT_FALSE(f.Has("nope"));
  EXPECT_EQ(f.Find("nope"), nullptr);

  auto strs = f.GetStringArray("strs");
  ASSERT_TRUE(strs.ok());
  ASSERT_EQ(strs->size(), 3u);
  EXPECT_EQ((*strs)[0], "a");
  EXPECT_EQ((*strs)[1], "");
  EXPECT_EQ((*strs)[2], "ccc");
  EXPECT_EQ(*f.GetF32Array("floats"), (std::vector<float>{0.5f, -1.25f, 3e10f}));
  EXPECT_EQ(*f.GetI32Array("ints"), (std::vector<int32_t>{1, -2, 2147483647}));
  EXPECT_EQ(*f.GetI32Array("u8s"), (std::vector<int32_t>{1, 255}));
  EXPECT_TRUE(f.GetI32Array("no_ints")->empty());
  EXPECT_TRUE(f.GetStringArray("no_strs")->empty());
  const GgufArray* bools = *f.GetArray("bools");
  ASSERT_EQ(bools->element_type, GgufValueType::kBool);
  EXPECT_EQ(bools->NumberAt(0), 1.0);
  EXPECT_EQ(bools->NumberAt(1), 0.0);

  const GgufArray* n = *f.GetArray("nested");
  ASSERT_EQ(n->element_type, GgufValueType::kArray);
  ASSERT_EQ(n->size, 3);
  const auto& n0 = std::get<GgufArray>(n->arrays[0].data);
  const auto& n1 = std::get<GgufArray>(n->arrays[1].data);
  const auto& n2 = std::get<GgufArray>(n->arrays[2].data);
  EXPECT_EQ(n0.element_type, GgufValueType::kInt32);
  EXPECT_EQ(n0.NumberAt(1), 2.0);
  EXPECT_EQ(n1.strings, (std::vector<std::string_view>{"x", ""}));
  EXPECT_EQ(n2.element_type, GgufValueType::kFloat32);
  EXPECT_EQ(n2.size, 0);
  EXPECT_EQ(FormatGgufValue(*f.Find("nested")),
            "[ARRAY x 3: [INT32 x 2: 1, 2], [STRING x 2: \"x\", \"\"], [FLOAT32 x 0]]");
  EXPECT_EQ(FormatGgufValue(*f.Find("strs"), 2), "[STRING x 3: \"a\", \"\", ...]");
  EXPECT_EQ(FormatGgufValue(*f.Find("i8")), "-5");
  EXPECT_TRUE(f.tensors().empty());
}

TEST_F(GgufTest, GettersRefuseMismatchesNamingKeyFileAndTypes) {
  GgufWriter w;
  ASSERT_TRUE(w.SetString("s", "text").ok());
  ASSERT_TRUE(w.SetI32("neg", -1).ok());
  ASSERT_TRUE(w.SetU64("big", uint64_t{1} << 40).ok());
  ASSERT_TRUE(w.SetF32Array("fa", {1.0f}).ok());
  ASSERT_TRUE(w.Set("ua", GgufEncodeArray(GgufValueType::kUint32,
                                          {GgufEncode(uint32_t{3000000000u})})).ok());
  const std::string path = Path("types.gguf");
  ASSERT_TRUE(w.Write(path).ok());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  auto expect_error = [&](const Status& s, std::vector<std::string> parts) {
    ASSERT_FALSE(s.ok());
    parts.push_back(path);
    for (const std::string& p : parts) {
      EXPECT_NE(s.message().find(p), std::string::npos) << s.message() << " lacks " << p;
    }
  };
  expect_error((*f)->GetU32("s").status(), {"'s'", "STRING", "UINT32"});
  expect_error((*f)->GetString("neg").status(), {"'neg'", "INT32", "STRING"});
  expect_error((*f)->GetU32("neg").status(), {"'neg'", "-1", "does not fit UINT32"});
  expect_error((*f)->GetI32("big").status(), {"'big'", "does not fit INT32"});
  expect_error((*f)->GetBool("neg").status(), {"'neg'", "BOOL"});
  expect_error((*f)->GetF32("s").status(), {"'s'", "FLOAT32"});
  expect_error((*f)->GetStringArray("fa").status(), {"'fa'", "ARRAY of FLOAT32", "of STRING"});
  expect_error((*f)->GetF32Array("s").status(), {"'s'", "ARRAY"});
  expect_error((*f)->GetI32Array("ua").status(), {"'ua'", "3000000000", "INT32"});
  expect_error((*f)->GetString("missing").status(), {"no metadata key 'missing'"});
  expect_error((*f)->FindTensor("t").status(), {"no tensor 't'"});
  EXPECT_EQ(*(*f)->GetU64("big"), uint64_t{1} << 40);
  EXPECT_EQ(*(*f)->GetI64("neg"), -1);
}

TEST_F(GgufTest, RoundTripsTensorsWithAlignmentPadding) {
  GgufWriter w;
  const Bytes f32 = Iota(3 * 4);            // [3]: 12 bytes, padded to 32
  const Bytes f16 = Iota(5 * 2 * 2, 1);     // [5, 2]
  const Bytes bf16 = Iota(7 * 2, 2);        // [7]
  const Bytes q8 = Iota(2 * 3 * 34, 3);     // [64, 3]: 2 blocks per row
  const Bytes q4 = Iota(18, 4);             // [32]
  ASSERT_TRUE(w.SetString("general.architecture", "test").ok());
  ASSERT_TRUE(w.AddTensor("t.f32", GgmlType::kF32, {3}, f32).ok());
  ASSERT_TRUE(w.AddTensor("t.f16", GgmlType::kF16, {5, 2}, f16).ok());
  ASSERT_TRUE(w.AddTensor("t.bf16", GgmlType::kBF16, {7}, bf16).ok());
  ASSERT_TRUE(w.AddTensor("t.q8", GgmlType::kQ8_0, {64, 3}, q8).ok());
  ASSERT_TRUE(w.AddTensor("t.q4", GgmlType::kQ4_0, {32, 1, 1, 1}, q4).ok());
  const std::string path = Path("tensors.gguf");
  ASSERT_TRUE(w.Write(path).ok());
  const Bytes raw = test::ReadFileBytes(path);

  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  const GgufFile& file = **f;
  ASSERT_EQ(file.tensors().size(), 5u);
  EXPECT_EQ(file.data_offset() % 32, 0);
  EXPECT_EQ(file.file_bytes(), static_cast<int64_t>(raw.size()));
  struct Want {
    const char* name;
    GgmlType type;
    std::vector<int64_t> dims;
    const Bytes* bytes;
  };
  const Want wants[] = {{"t.f32", GgmlType::kF32, {3}, &f32},
                        {"t.f16", GgmlType::kF16, {5, 2}, &f16},
                        {"t.bf16", GgmlType::kBF16, {7}, &bf16},
                        {"t.q8", GgmlType::kQ8_0, {64, 3}, &q8},
                        {"t.q4", GgmlType::kQ4_0, {32, 1, 1, 1}, &q4}};
  uint64_t expected_offset = 0;
  for (const Want& want : wants) {
    SCOPED_TRACE(want.name);
    auto t = file.FindTensor(want.name);
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ((*t)->type, want.type);
    EXPECT_EQ((*t)->dims, want.dims);
    EXPECT_EQ((*t)->n_bytes, static_cast<int64_t>(want.bytes->size()));
    EXPECT_EQ((*t)->offset, expected_offset);  // each tensor starts on the next 32-byte boundary
    EXPECT_EQ(Bytes((*t)->data, (*t)->data + (*t)->n_bytes), *want.bytes);
    // The data pointer is where the layout says, in the file.
    const size_t at = file.data_offset() + (*t)->offset;
    EXPECT_EQ(Bytes(raw.begin() + at, raw.begin() + at + want.bytes->size()), *want.bytes);
    expected_offset += (want.bytes->size() + 31) / 32 * 32;
  }
  EXPECT_EQ(raw.size(), file.data_offset() + expected_offset);
  EXPECT_EQ(file.tensors()[3].n_elements, 192);
}

TEST_F(GgufTest, HonoursGeneralAlignment) {
  GgufWriter w;
  ASSERT_TRUE(w.SetU32("general.alignment", 64).ok());
  ASSERT_TRUE(w.AddTensor("a", GgmlType::kF32, {3}, Iota(12)).ok());
  ASSERT_TRUE(w.AddTensor("b", GgmlType::kF32, {5}, Iota(20)).ok());
  const std::string path = Path("align.gguf");
  ASSERT_TRUE(w.Write(path).ok());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ((*f)->alignment(), 64u);
  EXPECT_EQ((*f)->data_offset() % 64, 0);
  EXPECT_EQ((*f)->tensors()[1].offset, 64u);
  EXPECT_EQ(Bytes((*f)->tensors()[1].data, (*f)->tensors()[1].data + 20), Iota(20));
}

TEST_F(GgufTest, WriterRefusesInvalidInput) {
  GgufWriter w;
  ASSERT_TRUE(w.SetU32("k", 1).ok());
  EXPECT_FALSE(w.SetU32("k", 2).ok());
  EXPECT_FALSE(w.SetU32("general.alignment", 48).ok());
  EXPECT_FALSE(w.SetString("general.alignment", "32").ok());
  const GgufEncoded mixed =
      GgufEncodeArray(GgufValueType::kInt32, {GgufEncode(int32_t{1}), GgufEncode(1.0f)});
  EXPECT_FALSE(mixed.error.empty());
  EXPECT_FALSE(w.Set("mixed", mixed).ok());
  EXPECT_FALSE(w.AddTensor("t", GgmlType::kF32, {4}, Iota(15)).ok());           // wrong size
  EXPECT_FALSE(w.AddTensor("t", GgmlType::kQ8_0, {16}, Iota(17)).ok());         // half a block
  EXPECT_FALSE(w.AddTensor("t", GgmlType::kF32, {1, 1, 1, 1, 1}, Iota(4)).ok());  // 5 dims
  EXPECT_FALSE(w.AddTensor("t", GgmlType::kF32, {0}, {}).ok());
  EXPECT_FALSE(w.AddTensor("t", static_cast<GgmlType>(99), {1}, Iota(4)).ok());
  ASSERT_TRUE(w.AddTensor("t", GgmlType::kF32, {1}, Iota(4)).ok());
  EXPECT_FALSE(w.AddTensor("t", GgmlType::kF32, {1}, Iota(4)).ok());            // duplicate
}

TEST_F(GgufTest, TypeTable) {
  EXPECT_STREQ(GgmlTypeName(GgmlType::kQ4_K), "Q4_K");
  EXPECT_STREQ(GgmlTypeName(GgmlType::kBF16), "BF16");
  EXPECT_STREQ(GgmlTypeName(static_cast<GgmlType>(4)), "unknown");
  EXPECT_EQ(FindGgmlType(99), nullptr);
  EXPECT_EQ(FindGgmlType(4), nullptr);  // Q4_2, removed upstream
  EXPECT_EQ(FindGgmlType(39)->block_bytes, 17);
  EXPECT_EQ(FindGgmlType(static_cast<uint32_t>(GgmlType::kQ8_0))->block_elements, 32);
  EXPECT_EQ(*GgmlTypeBytes(GgmlType::kF32, 10), 40);
  EXPECT_EQ(*GgmlTypeBytes(GgmlType::kF16, 10), 20);
  EXPECT_EQ(*GgmlTypeBytes(GgmlType::kBF16, 10), 20);
  EXPECT_EQ(*GgmlTypeBytes(GgmlType::kQ8_0, 64), 68);
  EXPECT_EQ(*GgmlTypeBytes(GgmlType::kQ4_0, 96), 54);
  EXPECT_EQ(*GgmlTypeBytes(GgmlType::kQ4_K, 512), 288);
  EXPECT_FALSE(GgmlTypeBytes(GgmlType::kQ8_0, 33).ok());
  EXPECT_FALSE(GgmlTypeBytes(GgmlType::kF32, int64_t{1} << 62).ok());
  EXPECT_FALSE(GgmlTypeBytes(static_cast<GgmlType>(99), 1).ok());
  EXPECT_STREQ(FindGgmlType(static_cast<uint32_t>(GgmlType::kQ6_K))->name, "Q6_K");
}

// ---- the real files ----

TEST_F(GgufTest, ReadsStories260K) {
  auto f = GgufFile::Open(kStories);
  ASSERT_TRUE(f.ok()) << f.status().message();
  const GgufFile& file = **f;
  EXPECT_EQ(*file.GetString("general.architecture"), "llama");
  EXPECT_EQ(*file.GetU32("llama.block_count"), 5u);
  EXPECT_EQ(*file.GetU32("llama.context_length"), 512u);
  EXPECT_EQ(*file.GetU32("llama.embedding_length"), 64u);
  EXPECT_EQ(*file.GetU32("llama.attention.head_count_kv"), 4u);
  EXPECT_NEAR(*file.GetF32("llama.attention.layer_norm_rms_epsilon"), 1e-5f, 1e-9f);
  EXPECT_EQ(file.GetStringArray("tokenizer.ggml.tokens")->size(), 512u);
  EXPECT_EQ(file.GetF32Array("tokenizer.ggml.scores")->size(), 512u);
  EXPECT_EQ(file.metadata().size(), 19u);
  EXPECT_EQ(file.tensors().size(), 48u);  // 3 + 5 layers x 9
  auto embd = file.FindTensor("token_embd.weight");
  ASSERT_TRUE(embd.ok()) << embd.status().message();
  EXPECT_EQ((*embd)->type, GgmlType::kF32);
  EXPECT_EQ((*embd)->dims, (std::vector<int64_t>{64, 512}));
  EXPECT_EQ((*embd)->n_bytes, 64 * 512 * 4);
  float first[2];
  std::memcpy(first, (*embd)->data, sizeof(first));
  EXPECT_FLOAT_EQ(first[0], -0.29474878f);  // read independently from the file's bytes
  EXPECT_FLOAT_EQ(first[1], 0.56189561f);
  auto q = file.FindTensor("blk.0.attn_q.weight");
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_EQ((*q)->dims, (std::vector<int64_t>{64, 64}));
  for (const GgufTensor& t : file.tensors()) EXPECT_EQ(t.type, GgmlType::kF32) << t.name;
}

TEST_F(GgufTest, ReadsLlamaSpmVocabulary) {
  const std::string path = FindSharedVocab();
  ASSERT_FALSE(path.empty()) << "ggml-vocab-llama-spm.gguf not found in " KVQ_SOURCE_DIR
                                "/tests/testdata/vocab";
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(*(*f)->GetString("tokenizer.ggml.model"), "llama");
  auto tokens = (*f)->GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status().message();
  ASSERT_EQ(tokens->size(), 32000u);
  EXPECT_EQ((*tokens)[0], "<unk>");
  EXPECT_EQ((*tokens)[1], "<s>");
  EXPECT_EQ((*tokens)[2], "</s>");
  auto scores = (*f)->GetF32Array("tokenizer.ggml.scores");
  ASSERT_TRUE(scores.ok()) << scores.status().message();
  ASSERT_EQ(scores->size(), 32000u);
  EXPECT_LT(*std::min_element(scores->begin(), scores->end()), 0.0f);
  EXPECT_EQ((*f)->GetI32Array("tokenizer.ggml.token_type")->size(), 32000u);
  EXPECT_TRUE(*(*f)->GetBool("tokenizer.ggml.add_bos_token"));
  EXPECT_TRUE((*f)->tensors().empty());
}

// ---- damage ----

TEST_F(GgufTest, EveryTruncationOfStoriesIsRefused) {
  const Bytes full = test::ReadFileBytes(kStories);
  ASSERT_GT(full.size(), 1u << 20);
  std::vector<size_t> cuts;
  for (size_t n = 0; n < 4096; ++n) cuts.push_back(n);                  // header and metadata
  for (size_t n = 4096; n < 16384; n += 37) cuts.push_back(n);         // tensor infos
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200; ++i) cuts.push_back(16384 + rng() % (full.size() - 16384));  // data
  cuts.push_back(full.size() - 1);
  // Write once, then cut shorter and shorter: each Open maps the file at its new length.
  std::sort(cuts.rbegin(), cuts.rend());
  const std::string path = Path("cut.gguf");
  WriteAll(path, full);
  for (size_t n : cuts) {
    ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(n)), 0);
    Result<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
    ASSERT_FALSE(f.ok()) << "a copy cut to " << n << " bytes opened";
    ASSERT_NE(f.status().message().find(path), std::string::npos) << f.status().message();
  }
}

TEST_F(GgufTest, RandomByteDamageNeverCrashes) {
  // Flipped bytes in the header and metadata may or may not be detectable; either way Open must
  // return (ASan/UBSan check the way there), and a failure must name the file.
  const Bytes full = test::ReadFileBytes(kStories);
  const std::string path = Path("flip.gguf");
  std::mt19937_64 rng(11);
  for (int i = 0; i < 300; ++i) {
    Bytes b = full;
    for (int k = 0; k < 3; ++k) b[rng() % 14200] ^= static_cast<uint8_t>(1 + rng() % 255);
    WriteAll(path, b);
    Result<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
    if (!f.ok()) {
      ASSERT_NE(f.status().message().find(path), std::string::npos) << f.status().message();
    }
  }
}

TEST_F(GgufTest, RefusesBadMagicAndVersions) {
  Bytes b = SmallFile();
  WriteAll(Path("ok.gguf"), b);
  ASSERT_TRUE(GgufFile::Open(Path("ok.gguf")).ok());
  Bytes magic = b;
  magic[0] = 'X';
  ExpectRefused(magic, "is not a GGUF file");
  ExpectRefused({}, "is not a GGUF file");
  ExpectRefused({'G', 'G'}, "is not a GGUF file");
  for (uint32_t v : {0u, 1u, 4u, 1000u}) {
    Bytes bad = b;
    Patch<uint32_t>(&bad, 4, v);
    ExpectRefused(bad, fmt::format("GGUF version {} is not supported", v));
  }
  Bytes big_endian = b;
  Patch<uint32_t>(&big_endian, 4, 0x03000000u);
  ExpectRefused(big_endian, "big-endian");
  Bytes v2 = b;  // version 2 has version 3's layout
  Patch<uint32_t>(&v2, 4, 2);
  WriteAll(Path("v2.gguf"), v2);
  auto f = GgufFile::Open(Path("v2.gguf"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ((*f)->version(), 2u);
}

TEST_F(GgufTest, RefusesAbsurdLengthsBeforeAllocating) {
  GgufWriter w;
  ASSERT_TRUE(w.SetString("general.name", "x").ok());
  ASSERT_TRUE(w.SetStringArray("list", {"a", "b"}).ok());
  ASSERT_TRUE(w.AddTensor("t", GgmlType::kF32, {4}, Iota(16)).ok());
  const Bytes b = w.Serialize();
  const size_t value = FindGgufString(b, "general.name") + 8 + 12 + 4;  // the value's length
  const size_t list = FindGgufString(b, "list") + 8 + 4 + 4 + 4;  // the array's count
  struct Case {
    size_t at;
    uint64_t v;
    const char* what;
  };
  const Case cases[] = {
      {value, uint64_t{1} << 60, "truncated"},        // string length 2^60
      {value, ~uint64_t{0}, "truncated"},             // 2^64 - 1
      {list, uint64_t{1} << 60, "array of 1152921504606846976 STRING"},
      {list + 8, uint64_t{1} << 61, "truncated"},  // element 0's length
      {8, uint64_t{1} << 60, "claims 1152921504606846976 tensors"},
      {16, uint64_t{1} << 60, "claims 1152921504606846976 metadata pairs"},
      {FindGgufString(b, "t"), uint64_t{1} << 60, "truncated"},  // tensor name length
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Bytes bad = b;
    Patch(&bad, c.at, c.v);
    g_largest_allocation = 0;
    g_track_allocations = true;
    ExpectRefused(bad, c.what);
    g_track_allocations = false;
    EXPECT_LT(g_largest_allocation.load(), size_t{1} << 20);
  }
}

TEST_F(GgufTest, WrongCountThatFitsTheFileAllocatesOnlyWhatItParses) {
  // 100,000 strings fit in the 1 MiB that follows, so the count alone cannot be refused; memory
  // must follow the elements actually parsed (three, then a garbage length), not the claim.
  GgufWriter w;
  ASSERT_TRUE(w.SetStringArray("list", {"a", "b"}).ok());
  ASSERT_TRUE(w.AddTensor("t", GgmlType::kF32, {1 << 18}, Iota(1 << 20, 1)).ok());
  Bytes b = w.Serialize();
  Patch<uint64_t>(&b, FindGgufString(b, "list") + 8 + 4 + 4 + 4, 100000);
  g_largest_allocation = 0;
  g_track_allocations = true;
  ExpectRefused(b, "string element 3");
  g_track_allocations = false;
  EXPECT_LT(g_largest_allocation.load(), size_t{1} << 20);
}

TEST_F(GgufTest, RefusesBadMetadata) {
  GgufWriter w;
  ASSERT_TRUE(w.SetU32("key.a", 1).ok());
  ASSERT_TRUE(w.SetBool("key.b", true).ok());
  ASSERT_TRUE(w.Set("flags", GgufEncodeArray(GgufValueType::kBool, {GgufEncode(false)})).ok());
  const Bytes b = w.Serialize();
  const size_t b_key = FindGgufString(b, "key.b");
  Bytes dup = b;
  dup[b_key + 8 + 4] = 'a';
  ExpectRefused(dup, "metadata key 'key.a' appears twice");
  Bytes type = b;
  Patch<uint32_t>(&type, b_key + 8 + 5, 13);
  ExpectRefused(type, "unknown value type 13");
  Bytes boolean = b;
  boolean[b_key + 8 + 5 + 4] = 2;
  ExpectRefused(boolean, "BOOL value is 2");
  Bytes bool_elem = b;
  bool_elem[FindGgufString(b, "flags") + 8 + 5 + 4 + 4 + 8] = 7;
  ExpectRefused(bool_elem, "BOOL element 0 is 7");
  Bytes elem_type = b;
  Patch<uint32_t>(&elem_type, FindGgufString(b, "flags") + 8 + 5 + 4, 77);
  ExpectRefused(elem_type, "array element has unknown value type 77");
}

TEST_F(GgufTest, NestedArraysHaveADepthLimit) {
  auto nest = [](int levels) {
    GgufEncoded v = GgufEncodeArray(GgufValueType::kInt32, {GgufEncode(int32_t{5})});
    for (int i = 1; i < levels; ++i) v = GgufEncodeArray(GgufValueType::kArray, {v});
    return v;
  };
  GgufWriter ok;
  ASSERT_TRUE(ok.Set("deep", nest(8)).ok());
  WriteAll(Path("deep.gguf"), ok.Serialize());
  auto f = GgufFile::Open(Path("deep.gguf"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  GgufWriter bad;
  ASSERT_TRUE(bad.Set("deep", nest(9)).ok());
  ExpectRefused(bad.Serialize(), "nested more than 8 deep");
}

TEST_F(GgufTest, RefusesBadTensorInfos) {
  const Bytes b = SmallFile();
  const InfoFields a = TensorInfo(b, "a", 2);
  const InfoFields t_b = TensorInfo(b, "b", 1);
  struct Case {
    size_t at;
    uint64_t v;
    int width;
    std::string what;
  };
  const Case cases[] = {
      {a.n_dims, 5, 4, "tensor 'a': has 5 dimensions (kvq reads 1 to 4)"},
      {a.n_dims, 0, 4, "has 0 dimensions"},
      {a.dims, 0, 8, "dimension 0 is 0 (must be positive)"},
      {a.dims + 8, ~uint64_t{0}, 8, "dimension 1 is -1"},
      {a.type, 99, 4, "tensor 'a': has unknown ggml type id 99"},
      {a.type, 4, 4, "unknown ggml type id 4"},
      {a.type, static_cast<uint64_t>(GgmlType::kQ8_0), 4, "row length 8 is not a multiple"},
      {a.offset, 1 << 20, 8, "tensor 'a' (offset 1048576, 64 bytes) extends past the end of "
                             "the file"},
      {t_b.offset, ~uint64_t{0} - 31, 8, "extends past the end"},
      {a.offset, 4, 8, "tensor 'a' has offset 4, which is not a multiple of the alignment 32"},
      {t_b.offset, 32, 8, "tensors 'a' (offset 0, 64 bytes) and 'b' (offset 32) overlap"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Bytes bad = b;
    if (c.width == 4) {
      Patch(&bad, c.at, static_cast<uint32_t>(c.v));
    } else {
      Patch(&bad, c.at, c.v);
    }
    ExpectRefused(bad, c.what);
  }
  // Element count overflow: two dims of 2^32.
  Bytes overflow = b;
  Patch<uint64_t>(&overflow, a.dims, uint64_t{1} << 32);
  Patch<uint64_t>(&overflow, a.dims + 8, uint64_t{1} << 32);
  ExpectRefused(overflow, "element count overflows");
  // Bytes overflow: 2^61 F32 elements.
  Bytes bytes_overflow = b;
  Patch<uint64_t>(&bytes_overflow, a.dims, uint64_t{1} << 61);
  Patch<uint64_t>(&bytes_overflow, a.dims + 8, 1);
  ExpectRefused(bytes_overflow, "overflow");
  // Duplicate tensor names.
  Bytes dup = b;
  dup[FindGgufString(b, "b") + 8] = 'a';
  ExpectRefused(dup, "tensor 'a' appears twice");
}

TEST_F(GgufTest, RefusesBadAlignment) {
  GgufWriter w;
  ASSERT_TRUE(w.SetU32("general.alignment", 64).ok());
  ASSERT_TRUE(w.AddTensor("a", GgmlType::kF32, {4}, Iota(16)).ok());
  const Bytes b = w.Serialize();
  const size_t value = FindGgufString(b, "general.alignment") + 8 + 17 + 4;
  for (uint32_t v : {0u, 48u, 3u, 1u << 31}) {
    Bytes bad = b;
    Patch(&bad, value, v);
    ExpectRefused(bad, "general.alignment is UINT32");
  }
  Bytes type = b;  // the value read as a FLOAT32 is refused too
  Patch<uint32_t>(&type, value - 4, static_cast<uint32_t>(GgufValueType::kFloat32));
  ExpectRefused(type, "general.alignment is FLOAT32");
}

// The reader lays out a tensor of any ggml type; whether kvq computes with it is the model
// loader's question to the weight-type registry (tests/model/gguf_llama_test.cc refuses it there).
TEST_F(GgufTest, TensorOfATypeKvqDoesNotComputeWithOpensAndIsFound) {
  GgufWriter w;
  ASSERT_TRUE(w.AddTensor("blk.0.ffn_down.weight", GgmlType::kQ4_K, {256, 2}, Iota(288)).ok());
  ASSERT_TRUE(w.AddTensor("ok", GgmlType::kF32, {2}, Iota(8)).ok());
  const std::string path = Path("q4k.gguf");
  ASSERT_TRUE(w.Write(path).ok());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_EQ((*f)->tensors().size(), 2u);
  const GgufTensor& t = (*f)->tensors()[0];
  EXPECT_EQ(t.type, GgmlType::kQ4_K);
  EXPECT_EQ(t.n_bytes, 288);
  EXPECT_EQ((*f)->tensors()[1].offset, 288u);
  auto found = (*f)->FindTensor("blk.0.ffn_down.weight");
  ASSERT_TRUE(found.ok()) << found.status().message();
  EXPECT_EQ(*found, &t);
  EXPECT_TRUE((*f)->FindTensor("ok").ok());
}

TEST_F(GgufTest, MissingFileAndDirectoryAreRefused) {
  auto missing = GgufFile::Open(Path("nope.gguf"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(Path("nope.gguf")), std::string::npos);
  auto dir = GgufFile::Open(dir_.string());
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find(dir_.string()), std::string::npos);
}

}  // namespace
}  // namespace kvq
