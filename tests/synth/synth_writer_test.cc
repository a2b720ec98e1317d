// The pieces under synth (model/synth.h) and the GGUF writer's streaming path: the quantisers
// match ggml's reference rounding on hand-computed blocks; drawn rows are seeded and bounded;
// streamed tensors give the same bytes as ready-made ones in row-ordered chunks; and a failing
// source, a full disk or a missing folder leave no file behind, with errors naming the path.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "gguf/gguf_writer.h"
#include "synth/synth.h"
#include "weights/weight_type.h"
#include "test_util/file_bytes.h"
#include "test_util/bundled_paths.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

const std::string kStories = test::BundledGgufPath();

class SynthWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           fmt::format("kvq_synth_writer_{}_{}", ::getpid(), counter_++);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  // Names in the folder other than `keep`: leftovers such as temporary files.
  std::vector<std::string> Leftovers(const std::string& keep = "") const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) {
      if (e.path().filename() != keep) names.push_back(e.path().filename().string());
    }
    return names;
  }
  fs::path dir_;
  static inline int counter_ = 0;
};

// The tiny llama shape of synth_test.cc.
SynthSpec Tiny(GgmlType type) {
  return SynthSpec{.arch = SynthArch::kLlama, .dim = 64, .n_layers = 2, .n_heads = 4,
                   .n_kv_heads = 2, .hidden_dim = 128, .context = 256,
                   .type = FindWeightTypeByGgufId(static_cast<uint32_t>(type))->name, .seed = 7};
}

// ---- quantisers against hand-computed blocks (synth writes through the registry's) ----

void QuantizeRowQ8_0(const float* x, int64_t n, uint8_t* out) {
  QuantizeRowRef(*FindWeightType(WeightType::kQ8_0), x, n, out);
}
void QuantizeRowQ4_0(const float* x, int64_t n, uint8_t* out) {
  QuantizeRowRef(*FindWeightType(WeightType::kQ4_0), x, n, out);
}

TEST(SynthQuantize, Q8_0MatchesGgmlReferenceRounding) {
  // amax 127 makes d = 1 exactly, so each code is round-half-away-from-zero of the value.
  float x[32];
  const float head[] = {127.0f, 2.5f, -2.5f, 0.49999997f, -126.5f, 1.5f, -0.5f, 0.0f};
  for (int j = 0; j < 32; ++j) x[j] = j < 8 ? head[j] : static_cast<float>(j - 16);
  const int8_t want_head[] = {127, 3, -3, 0, -127, 2, -1, 0};
  uint8_t out[34];
  QuantizeRowQ8_0(x, 32, out);
  EXPECT_EQ(out[0], 0x00);  // f16 1.0 = 0x3C00, little-endian
  EXPECT_EQ(out[1], 0x3C);
  for (int j = 0; j < 32; ++j) {
    const int8_t want = j < 8 ? want_head[j] : static_cast<int8_t>(j - 16);
    EXPECT_EQ(static_cast<int8_t>(out[2 + j]), want) << j;
  }
  // An all-zero block: d = 0, codes 0 (ggml's id = 0 branch).
  float zeros[32] = {};
  QuantizeRowQ8_0(zeros, 32, out);
  for (uint8_t b : out) EXPECT_EQ(b, 0);
}

TEST(SynthQuantize, Q4_0MatchesGgmlReferenceRounding) {
  // Block 0: the largest magnitude is −8 (first), d = −8 / −8 = 1, code = min(15, trunc(x + 8.5)).
  // Block 1: the largest magnitude is +8, d = −1, code = min(15, trunc(8.5 − x)).
  float x[64] = {};
  const float b0[] = {-8.0f, 7.0f, 7.6f, 0.0f, -0.5f, 0.5f, -3.2f, 2.49f};
  const int c0[] = {0, 15, 15, 8, 8, 9, 5, 10};
  for (int j = 0; j < 8; ++j) x[j] = b0[j];
  x[16] = 3.0f;  // code 11, the high nibble of byte 0
  x[32] = 8.0f;
  x[33] = -8.0f;  // ties in magnitude: the first (+8) sets the sign
  x[34] = 1.25f;
  uint8_t out[36];
  QuantizeRowQ4_0(x, 64, out);
  EXPECT_EQ(out[0], 0x00);  // d = 1.0: f16 0x3C00
  EXPECT_EQ(out[1], 0x3C);
  EXPECT_EQ(out[2], 0 | (11 << 4));
  for (int j = 1; j < 8; ++j) EXPECT_EQ(out[2 + j] & 0x0F, c0[j]) << j;
  EXPECT_EQ(out[2 + 8], 8 | (8 << 4));  // zeros: code 8 in both halves
  EXPECT_EQ(out[18], 0x00);             // d = −1.0: f16 0xBC00
  EXPECT_EQ(out[19], 0xBC);
  EXPECT_EQ(out[20] & 0x0F, 0);   // +8 → 0.5 → 0, decoded (0 − 8)·(−1) = 8
  EXPECT_EQ(out[21] & 0x0F, 15);  // −8 → 16.5 → 16, clamped to 15 (decoded −7)
  EXPECT_EQ(out[22] & 0x0F, 7);   // 1.25 → 7.25 → 7, decoded 1
}

TEST(SynthQuantize, DrawnRowsAreUniformSymmetricAndSeeded) {
  std::vector<float> a(1001), b(1001), c(1001);
  SynthDrawRow(SynthTensorSeed(1, "t"), 5, 0.5f, a.data(), 1001);
  SynthDrawRow(SynthTensorSeed(1, "t"), 5, 0.5f, b.data(), 1001);
  SynthDrawRow(SynthTensorSeed(1, "t"), 6, 0.5f, c.data(), 1001);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(SynthTensorSeed(1, "t"), SynthTensorSeed(2, "t"));
  EXPECT_NE(SynthTensorSeed(1, "t"), SynthTensorSeed(1, "u"));
  for (float v : a) {
    EXPECT_GT(v, -0.5f);
    EXPECT_LT(v, 0.5f);
  }
}

// ---- folders, full disks, failing sources ----

TEST_F(SynthWriterTest, MissingOrReadOnlyFolderIsRefusedBeforeWriting) {
  const std::string nowhere = Path("no/such/folder/m.gguf");
  const Status s = WriteSynthModel(Tiny(GgmlType::kQ4_0), kStories, nowhere);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(nowhere), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("does not exist"), std::string::npos) << s.message();
  if (::geteuid() != 0) {  // root writes anywhere: the permission check cannot fail for it
    const std::string ro = Path("ro");
    fs::create_directories(ro);
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    const Status r = WriteSynthModel(Tiny(GgmlType::kQ4_0), kStories, ro + "/m.gguf");
    fs::permissions(ro, fs::perms::owner_all);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.message().find("not writable"), std::string::npos) << r.message();
  }
}

// A file-size limit makes write() fail with EFBIG past it, as a full disk fails with ENOSPC: the
// same error path in the writer. SIGXFSZ is ignored so the process survives to see the error.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    ::getrlimit(RLIMIT_FSIZE, &old_);
    rlimit r = old_;
    r.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &r);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, old_handler_);
  }

 private:
  rlimit old_{};
  void (*old_handler_)(int) = nullptr;
};

TEST_F(SynthWriterTest, FullDiskLeavesNothingBehind) {
  const std::string path = Path("full.gguf");
  Status s;
  {
    FileSizeLimit limit(64 << 10);  // the tiny file is ~150 KiB
    s = WriteSynthModel(Tiny(GgmlType::kF16), kStories, path);
  }
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(std::strerror(EFBIG)), std::string::npos) << s.message();
  EXPECT_TRUE(Leftovers().empty()) << fmt::format("{}", fmt::join(Leftovers(), ", "));
}

// ---- the writer's streaming path ----

TEST_F(SynthWriterTest, StreamedTensorsEqualReadyMadeOnes) {
  // 16 MiB of F32 rows: the writer asks for it in more than one chunk.
  const int64_t cols = 1024, rows = 4096;
  auto row_bytes = [&](int64_t r, uint8_t* out) {
    for (int64_t c = 0; c < cols; ++c) {
      const float v = static_cast<float>(r * 7 + c);
      std::memcpy(out + 4 * c, &v, 4);
    }
  };
  Bytes whole(static_cast<size_t>(cols * rows * 4));
  for (int64_t r = 0; r < rows; ++r) row_bytes(r, whole.data() + r * cols * 4);
  std::vector<std::pair<int64_t, int64_t>> calls;
  GgufWriter streamed, ready;
  for (GgufWriter* w : {&streamed, &ready}) {
    ASSERT_TRUE(w->SetString("general.name", "s").ok());
    ASSERT_TRUE(w->AddTensor("small", GgmlType::kF32, {3}, Bytes(12, 1)).ok());  // padding after
  }
  ASSERT_TRUE(streamed
                  .AddStreamedTensor("big", GgmlType::kF32, {cols, rows},
                                     [&](int64_t first, int64_t n, uint8_t* out) {
                                       calls.emplace_back(first, n);
                                       for (int64_t r = 0; r < n; ++r) {
                                         row_bytes(first + r, out + r * cols * 4);
                                       }
                                       return Status::Ok();
                                     })
                  .ok());
  ASSERT_TRUE(ready.AddTensor("big", GgmlType::kF32, {cols, rows}, whole).ok());
  const Bytes want = ready.Serialize();
  EXPECT_EQ(streamed.FileBytes(), static_cast<int64_t>(want.size()));
  EXPECT_EQ(ready.FileBytes(), static_cast<int64_t>(want.size()));
  std::vector<std::pair<size_t, int64_t>> progress;
  ASSERT_TRUE(streamed
                  .Write(Path("s.gguf"),
                         [&](size_t tensor, int64_t written, int64_t total) {
                           progress.emplace_back(tensor, written);
                           EXPECT_EQ(total, static_cast<int64_t>(want.size()));
                         })
                  .ok());
  EXPECT_TRUE(test::ReadFileBytes(Path("s.gguf")) == want);
  // Row chunks in order, covering every row once, more than one of them.
  ASSERT_GT(calls.size(), 1u);
  int64_t next = 0;
  for (auto [first, n] : calls) {
    EXPECT_EQ(first, next);
    next += n;
  }
  EXPECT_EQ(next, rows);
  ASSERT_EQ(progress.size(), 2u);
  EXPECT_EQ(progress[0].first, 0u);
  EXPECT_EQ(progress[1].second, static_cast<int64_t>(want.size()));
  EXPECT_LT(progress[0].second, progress[1].second);
  // Serialize streams the same bytes.
  EXPECT_TRUE(streamed.Serialize() == want);
  EXPECT_TRUE(Leftovers("s.gguf").empty());
}

TEST_F(SynthWriterTest, FailingSourceOrFullDiskRemovesTheTemporaryFile) {
  GgufWriter w;
  ASSERT_TRUE(w.AddStreamedTensor("bad", GgmlType::kF32, {8, 4},
                                  [](int64_t, int64_t, uint8_t*) {
                                    return Status::Error("the source broke");
                                  })
                  .ok());
  const Status s = w.Write(Path("bad.gguf"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(Path("bad.gguf")), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'bad'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("the source broke"), std::string::npos) << s.message();
  EXPECT_TRUE(w.Serialize().empty());
  EXPECT_TRUE(Leftovers().empty());

  GgufWriter big;
  ASSERT_TRUE(big.AddTensor("t", GgmlType::kF32, {1 << 16}, Bytes(1 << 18, 0)).ok());
  Status full;
  {
    FileSizeLimit limit(1 << 16);
    full = big.Write(Path("big.gguf"));
  }
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.message().find(Path("big.gguf")), std::string::npos) << full.message();
  EXPECT_TRUE(Leftovers().empty());
  EXPECT_FALSE(big.AddStreamedTensor("u", GgmlType::kF32, {4}, nullptr).ok());  // no source
}

}  // namespace
}  // namespace kvq
