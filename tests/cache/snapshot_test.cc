// Prefix snapshot files: exact round trips (transforms, seed, residual and sink rows of K and V
// included), atomic writes, and a refusal naming the file and the reason for every kind of damage
// or mismatch (bad magic, another version, another model, format, transforms or rotation seed,
// truncation anywhere, a flipped byte anywhere, absurd lengths or flags), never a crash, a huge
// allocation or a partial image. Offsets below follow the layout documented at the top of
// snapshot.cc.
#include "cache/snapshot.h"
#include "base/checksum.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <new>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "test_util/largest_allocation.h"

using kvq_test::g_largest_allocation;
using kvq_test::g_track_allocations;

namespace kvq {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

constexpr uint64_t kHeaderFixed = 52;  // magic .. rotation_seed
constexpr uint64_t kLayerEntry = 79;
constexpr int kSections = 6;
constexpr const char* kSectionName[kSections] = {
    "key", "value", "key residual", "value residual", "key sinks", "value sinks"};
constexpr uint64_t kRoundTripSeed = 0x0DDBA11C0FFEE123ULL;

struct LayerSpec {
  uint16_t key_format;
  uint16_t value_format;
  size_t key_bytes;
  size_t value_bytes;
  std::array<size_t, 2> residual_floats;  // K, V
  std::array<size_t, 2> sink_floats;      // K, V
  bool calibrated;
  std::array<KvTransforms, 2> transforms;  // K, V
};

// n normal f32 values, the first four (when there is room) ones that only a bit-exact round trip
// keeps: -0, a quiet NaN, the smallest denormal, a negative NaN with a payload.
std::vector<float> Floats(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> out(n);
  for (float& x : out) x = normal(rng);
  const float special[4] = {-0.0f, std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min(),
                            std::bit_cast<float>(0xFFC01234u)};
  std::copy_n(special, std::min<size_t>(n, 4), out.begin());
  return out;
}

SnapshotImage MakeImage(uint32_t seed, const std::vector<LayerSpec>& specs) {
  std::mt19937_64 rng(seed);
  SnapshotImage image;
  image.model = {static_cast<int64_t>(specs.size()), 4, 8, 0xA1B2C3D4E5F60718ULL};
  image.n_positions = 37;
  image.rotation_seed = kRoundTripSeed;
  for (int i = 0; i < 5; ++i) image.tokens.push_back(static_cast<int32_t>(rng() % 32000));
  for (const LayerSpec& spec : specs) {
    SnapshotLayer layer;
    layer.key_format = spec.key_format;
    layer.value_format = spec.value_format;
    layer.transforms = spec.transforms;
    layer.scales_calibrated = spec.calibrated;
    if (spec.calibrated) {
      layer.key_scale = 0.015625f + static_cast<float>(rng() % 1000) / 7.0f;
      layer.value_scale = 3.25f + static_cast<float>(rng() % 1000) / 3.0f;
    }
    for (size_t i = 0; i < spec.key_bytes; ++i) layer.key_bytes.push_back(rng() & 0xFF);
    for (size_t i = 0; i < spec.value_bytes; ++i) layer.value_bytes.push_back(rng() & 0xFF);
    for (int t = 0; t < 2; ++t) {
      layer.residual[t] = Floats(spec.residual_floats[t], rng);
      layer.sinks[t] = Floats(spec.sink_floats[t], rng);
    }
    image.layers.push_back(std::move(layer));
  }
  return image;
}

constexpr KvTransforms kNone{};
constexpr KvTransforms Rot() { return {.rotate = true}; }
constexpr KvTransforms Tr(bool rotate, int32_t sinks, int32_t residual) {
  return {.rotate = rotate, .sinks = sinks, .residual = residual};
}

// Three layers, different formats and transforms per layer, residual and sink rows of K and V
// (rows of 4 heads x 8 = 32 floats), calibrated scales in one.
SnapshotImage RoundTripImage() {
  SnapshotImage image = MakeImage(7, {{0, 0, 512, 512, {0, 0}, {0, 0}, false, {kNone, kNone}},
                       {6, 6, 256, 256, {0, 5 * 32}, {4 * 32, 0}, true,
                        {Tr(true, 4, 0), Tr(true, 0, 64)}},
                       {5, 2, 96, 160, {2 * 32, 3 * 32}, {1 * 32, 2 * 32}, false,
                        {Tr(false, 1, 16), Tr(true, 2, 8)}}});
  // A hybrid model's recurrent state: its bits, -0.0 and NaN included, come back.
  image.state = {1.5f, -0.0f, std::numeric_limits<float>::quiet_NaN(), -3.25e-7f, 65504.0f};
  return image;
}

// Small enough to damage at every byte; every section non-empty in layer 0.
SnapshotImage SmallImage() {
  SnapshotImage image =
      MakeImage(11, {{6, 6, 24, 16, {4, 3}, {2, 5}, true, {Tr(true, 1, 4), Tr(false, 2, 3)}},
                     {2, 2, 24, 9, {0, 0}, {0, 1}, false, {kNone, Tr(false, 1, 0)}}});
  image.state = {0.25f, -7.0f};  // so damage to the state section is tried at every byte too
  return image;
}

SnapshotImage LargeImage() {
  return MakeImage(13, {{1, 1, 100'003, 100'003, {0, 0}, {0, 0}, false, {kNone, kNone}},
                        {6, 6, 65'536, 65'536, {64 * 32, 64 * 32}, {4 * 32, 4 * 32}, true,
                         {Tr(true, 4, 64), Tr(true, 4, 64)}},
                        {5, 5, 40'000, 40'000, {4 * 4 * 8, 0}, {0, 0}, false, {kNone, kNone}}});
}

// Layers whose transforms differ in every way the refusal must print.
SnapshotImage TransformsImage() {
  return MakeImage(17, {{6, 6, 8, 8, {0, 0}, {0, 0}, false, {kNone, Tr(false, 0, 2)}},
                        {2, 7, 8, 8, {0, 0}, {0, 0}, false, {Rot(), kNone}},
                        {6, 6, 8, 8, {0, 0}, {0, 0}, false, {Tr(true, 4, 0), Tr(true, 0, 64)}}});
}

SnapshotExpectation ExpectationFor(const SnapshotImage& image) {
  SnapshotExpectation expect;
  expect.model = image.model;
  expect.rotation_seed = image.rotation_seed;
  for (const SnapshotLayer& layer : image.layers) {
    expect.key_formats.push_back(layer.key_format);
    expect.value_formats.push_back(layer.value_format);
    expect.transforms.push_back(layer.transforms);
  }
  expect.state_floats = static_cast<int64_t>(image.state.size());
  return expect;
}

// Where each section's data starts, and its length, in bytes; derived from the documented
// layout, independently of the writer.
struct Layout {
  uint64_t header_end = 0;  // header checksum included
  std::vector<std::array<uint64_t, kSections>> start;
  std::vector<std::array<uint64_t, kSections>> length;
  uint64_t tokens_start = 0;  // the u64 count, then the ids, then the checksum
  uint64_t tokens_length = 0;  // count + ids, without the checksum
  uint64_t state_start = 0;    // the u64 count, then the floats, then the checksum
  uint64_t state_length = 0;   // count + floats, without the checksum
  uint64_t file_size = 0;
};

Layout LayoutOf(const SnapshotImage& image) {
  Layout layout;
  layout.header_end = kHeaderFixed + kLayerEntry * image.layers.size() + 8;
  uint64_t at = layout.header_end;
  for (const SnapshotLayer& layer : image.layers) {
    const std::array<uint64_t, kSections> len = {
        layer.key_bytes.size(),       layer.value_bytes.size(),
        4 * layer.residual[0].size(), 4 * layer.residual[1].size(),
        4 * layer.sinks[0].size(),    4 * layer.sinks[1].size()};
    std::array<uint64_t, kSections> start{};
    for (int s = 0; s < kSections; ++s) {
      start[s] = at;
      at += len[s] + 8;
    }
    layout.start.push_back(start);
    layout.length.push_back(len);
  }
  layout.tokens_start = at;
  layout.tokens_length = 8 + 4 * image.tokens.size();
  at += layout.tokens_length + 8;
  layout.state_start = at;
  layout.state_length = 8 + 4 * image.state.size();
  at += layout.state_length + 8;
  layout.file_size = at;
  return layout;
}

// The u64 length of `section` in layer `layer`'s table entry.
uint64_t LengthFieldOffset(size_t layer, int section) {
  return kHeaderFixed + kLayerEntry * layer + 31 + 8 * section;
}

// Tensor t's (0 K, 1 V) u8 rotate flag; its u32 sinks and u32 residual follow at +1 and +5.
uint64_t TransformsOffset(size_t layer, int t) {
  return kHeaderFixed + kLayerEntry * layer + 13 + 9 * t;
}

template <typename V>
void Poke(Bytes* bytes, uint64_t offset, V value) {
  std::memcpy(bytes->data() + offset, &value, sizeof(V));
}

template <typename V>
V Peek(const Bytes& bytes, uint64_t offset) {
  V value;
  std::memcpy(&value, bytes.data() + offset, sizeof(V));
  return value;
}

// Recomputes the header checksum so a deliberate edit reaches the checks behind it.
void ResealHeader(Bytes* bytes, size_t n_layers) {
  const uint64_t covered = kHeaderFixed + kLayerEntry * n_layers;
  Poke<uint64_t>(bytes, covered, Checksum64(bytes->data(), covered));
}

Bytes ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  ASSERT_TRUE(out.good()) << path;
}

void WriteFile(const std::string& path, const Bytes& bytes) {
  WriteFile(path, bytes.data(), bytes.size());
}

void ExpectSameImage(const SnapshotImage& a, const SnapshotImage& b) {
  EXPECT_EQ(a.model, b.model);
  EXPECT_EQ(a.n_positions, b.n_positions);
  EXPECT_EQ(a.rotation_seed, b.rotation_seed);
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.state.size(), b.state.size());
  for (size_t j = 0; j < a.state.size(); ++j) {  // bits: NaN and -0.0 included
    EXPECT_EQ(std::bit_cast<uint32_t>(a.state[j]), std::bit_cast<uint32_t>(b.state[j])) << "state " << j;
  }
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t i = 0; i < a.layers.size(); ++i) {
    const SnapshotLayer& x = a.layers[i];
    const SnapshotLayer& y = b.layers[i];
    SCOPED_TRACE(testing::Message() << "layer " << i);
    EXPECT_EQ(x.key_format, y.key_format);
    EXPECT_EQ(x.value_format, y.value_format);
    EXPECT_EQ(std::bit_cast<uint32_t>(x.key_scale), std::bit_cast<uint32_t>(y.key_scale));
    EXPECT_EQ(std::bit_cast<uint32_t>(x.value_scale), std::bit_cast<uint32_t>(y.value_scale));
    EXPECT_EQ(x.scales_calibrated, y.scales_calibrated);
    EXPECT_EQ(x.key_bytes, y.key_bytes);
    EXPECT_EQ(x.value_bytes, y.value_bytes);
    for (int t = 0; t < 2; ++t) {
      SCOPED_TRACE(t == 0 ? "keys" : "values");
      EXPECT_EQ(x.transforms[t], y.transforms[t]);
      for (const auto member : {&SnapshotLayer::residual, &SnapshotLayer::sinks}) {
        const std::vector<float>& u = (x.*member)[t];
        const std::vector<float>& w = (y.*member)[t];
        ASSERT_EQ(u.size(), w.size());
        for (size_t j = 0; j < u.size(); ++j) {  // bits: NaN and -0.0 included
          EXPECT_EQ(std::bit_cast<uint32_t>(u[j]), std::bit_cast<uint32_t>(w[j]))
              << (member == &SnapshotLayer::residual ? "residual " : "sink ") << j;
        }
      }
    }
  }
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Asserts that reading `path` fails with a message naming the file and containing `reason`.
// Returns the message.
std::string ExpectRefused(const std::string& path, const SnapshotExpectation& expect,
                          const std::string& reason) {
  const Result<SnapshotImage> r = ReadSnapshot(path, expect);
  EXPECT_FALSE(r.ok()) << "accepted " << path << " (expected: " << reason << ")";
  if (r.ok()) return "";
  const std::string& message = r.status().message();
  EXPECT_TRUE(Contains(message, path)) << message;
  EXPECT_TRUE(Contains(message, reason)) << "wanted '" << reason << "' in: " << message;
  return message;
}

class SnapshotTest : public testing::Test {
 protected:
  void SetUp() override {
    const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
    const std::string unique =
        "kvq_snapshot_" + std::string(info->name()) + "_" + std::to_string(::getpid());
    dir_ = (fs::path(testing::TempDir()) / unique).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  std::set<std::string> Listing(const std::string& dir) const {
    std::set<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir)) {
      names.insert(entry.path().filename().string());
    }
    return names;
  }

  // Writes `image` and returns its bytes.
  Bytes Written(const SnapshotImage& image, const std::string& path) {
    const Status s = WriteSnapshot(path, image);
    EXPECT_TRUE(s.ok()) << s.message();
    return ReadFile(path);
  }

  std::string dir_;
};

TEST_F(SnapshotTest, RoundTripIsExact) {
  const SnapshotImage image = RoundTripImage();
  const std::string path = Path("prefix.kvqsnap");
  const Bytes bytes = Written(image, path);
  EXPECT_EQ(bytes.size(), LayoutOf(image).file_size);
  EXPECT_EQ(std::memcmp(bytes.data(), "KVQSNAP\0", 8), 0);

  const Result<SnapshotImage> back = ReadSnapshot(path, ExpectationFor(image));
  ASSERT_TRUE(back.ok()) << back.status().message();
  ExpectSameImage(*back, image);
}

TEST_F(SnapshotTest, HeaderFieldsSitWhereTheLayoutSays) {
  const SnapshotImage image = RoundTripImage();
  const Bytes bytes = Written(image, Path("prefix.kvqsnap"));
  EXPECT_EQ(Peek<uint32_t>(bytes, 8), 4u);
  EXPECT_EQ(Peek<int64_t>(bytes, 12), 3);
  EXPECT_EQ(Peek<int64_t>(bytes, 36), image.n_positions);
  EXPECT_EQ(Peek<uint64_t>(bytes, 44), kRoundTripSeed);
  for (size_t i = 0; i < image.layers.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "layer " << i);
    const SnapshotLayer& layer = image.layers[i];
    const uint64_t e = kHeaderFixed + kLayerEntry * i;
    EXPECT_EQ(Peek<uint16_t>(bytes, e), layer.key_format);
    EXPECT_EQ(Peek<uint16_t>(bytes, e + 2), layer.value_format);
    EXPECT_EQ(bytes[e + 12], layer.scales_calibrated ? 1 : 0);
    for (int t = 0; t < 2; ++t) {
      const uint64_t x = TransformsOffset(i, t);
      EXPECT_EQ(bytes[x], layer.transforms[t].rotate ? 1 : 0);
      EXPECT_EQ(Peek<uint32_t>(bytes, x + 1), static_cast<uint32_t>(layer.transforms[t].sinks));
      EXPECT_EQ(Peek<uint32_t>(bytes, x + 5), static_cast<uint32_t>(layer.transforms[t].residual));
    }
    const uint64_t counts[kSections] = {layer.key_bytes.size(),   layer.value_bytes.size(),
                                        layer.residual[0].size(), layer.residual[1].size(),
                                        layer.sinks[0].size(),    layer.sinks[1].size()};
    for (int s = 0; s < kSections; ++s) {
      EXPECT_EQ(Peek<uint64_t>(bytes, LengthFieldOffset(i, s)), counts[s]) << kSectionName[s];
    }
  }
  // Each section's checksum is seeded with its position: 6*i + s + 1, the tokens 6*L + 1.
  const Layout layout = LayoutOf(image);
  for (size_t i = 0; i < image.layers.size(); ++i) {
    for (int s = 0; s < kSections; ++s) {
      const uint64_t at = layout.start[i][s];
      const uint64_t n = layout.length[i][s];
      EXPECT_EQ(Peek<uint64_t>(bytes, at + n), Checksum64(bytes.data() + at, n, 6 * i + s + 1))
          << "layer " << i << " " << kSectionName[s];
    }
  }
  EXPECT_EQ(Peek<uint64_t>(bytes, layout.tokens_start + layout.tokens_length),
            Checksum64(bytes.data() + layout.tokens_start, layout.tokens_length, 6 * 3 + 1));
  // The state section last: its count, its floats, and its checksum seeded 6*L + 2.
  EXPECT_EQ(Peek<uint64_t>(bytes, layout.state_start), image.state.size());
  EXPECT_EQ(Peek<uint64_t>(bytes, layout.state_start + layout.state_length),
            Checksum64(bytes.data() + layout.state_start, layout.state_length, 6 * 3 + 2));
}

TEST_F(SnapshotTest, RoundTripOfAnEmptyCache) {
  SnapshotImage image = MakeImage(3, {{0, 0, 0, 0, 0, false}, {0, 0, 0, 0, 0, false}});
  image.n_positions = 0;
  const std::string path = Path("empty.kvqsnap");
  ASSERT_TRUE(WriteSnapshot(path, image).ok());
  const Result<SnapshotImage> back = ReadSnapshot(path, ExpectationFor(image));
  ASSERT_TRUE(back.ok()) << back.status().message();
  ExpectSameImage(*back, image);
}

TEST_F(SnapshotTest, RewriteReplacesTheFileAndLeavesNoTemporary) {
  const std::string path = Path("prefix.kvqsnap");
  ASSERT_TRUE(WriteSnapshot(path, SmallImage()).ok());
  const SnapshotImage second = RoundTripImage();
  ASSERT_TRUE(WriteSnapshot(path, second).ok());
  EXPECT_EQ(Listing(dir_), std::set<std::string>{"prefix.kvqsnap"});
  const Result<SnapshotImage> back = ReadSnapshot(path, ExpectationFor(second));
  ASSERT_TRUE(back.ok()) << back.status().message();
  ExpectSameImage(*back, second);
}

TEST_F(SnapshotTest, WriteIntoMissingFolderFailsAndLeavesNothing) {
  const std::string path = Path("no/such/folder/prefix.kvqsnap");
  const Status s = WriteSnapshot(path, SmallImage());
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), path)) << s.message();
  EXPECT_TRUE(Contains(s.message(), std::strerror(ENOENT))) << s.message();
  EXPECT_TRUE(Listing(dir_).empty());
}

TEST_F(SnapshotTest, FailedRenameRemovesTheTemporaryAndKeepsWhatWasThere) {
  // A folder where the file should go: the temporary is written, then the rename fails.
  const std::string path = Path("occupied");
  fs::create_directories(path);
  WriteFile(Path("occupied/keep"), Bytes{1, 2, 3});
  const Status s = WriteSnapshot(path, SmallImage());
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), path)) << s.message();
  EXPECT_EQ(Listing(dir_), std::set<std::string>{"occupied"});
  EXPECT_EQ(Listing(path), std::set<std::string>{"keep"});
  EXPECT_EQ(ReadFile(Path("occupied/keep")), (Bytes{1, 2, 3}));
}

TEST_F(SnapshotTest, WriteRefusesAnImageWhoseLayerCountDisagreesWithItsModel) {
  SnapshotImage image = SmallImage();
  image.model.n_layers = 3;
  const std::string path = Path("prefix.kvqsnap");
  const Status s = WriteSnapshot(path, image);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), path)) << s.message();
  EXPECT_TRUE(Listing(dir_).empty());
}

TEST_F(SnapshotTest, RefusesAMissingFileOrAFolder) {
  const SnapshotExpectation expect = ExpectationFor(SmallImage());
  ExpectRefused(Path("absent.kvqsnap"), expect, "cannot open");
  ExpectRefused(dir_, expect, "cannot open");
}

TEST_F(SnapshotTest, RefusesWrongMagic) {
  const SnapshotImage image = SmallImage();
  const SnapshotExpectation expect = ExpectationFor(image);
  const std::string path = Path("prefix.kvqsnap");
  Bytes bytes = Written(image, path);
  bytes[3] = 'X';
  WriteFile(path, bytes);
  ExpectRefused(path, expect, "is not a kvq snapshot (bad magic)");

  const std::string text = "{\"this\": \"is json\"}\n";
  WriteFile(path, reinterpret_cast<const uint8_t*>(text.data()), text.size());
  ExpectRefused(path, expect, "is not a kvq snapshot (bad magic)");
  WriteFile(path, reinterpret_cast<const uint8_t*>("KVX"), 3);  // short, and already wrong
  ExpectRefused(path, expect, "is not a kvq snapshot (bad magic)");
}

TEST_F(SnapshotTest, RefusesANewerVersion) {
  const SnapshotImage image = SmallImage();
  const std::string path = Path("prefix.kvqsnap");
  Bytes bytes = Written(image, path);
  Poke<uint32_t>(&bytes, 8, kSnapshotVersion + 1);
  WriteFile(path, bytes);
  ExpectRefused(path, ExpectationFor(image),
                "was written by a newer kvq (version 5; this kvq reads up to 4)");
  Poke<uint32_t>(&bytes, 8, 0xFFFFFFFFu);
  WriteFile(path, bytes);
  ExpectRefused(path, ExpectationFor(image), "(version 4294967295; this kvq reads up to 4)");
}

TEST_F(SnapshotTest, RefusesOlderVersions) {
  // A version 2 file, laid out as version 2 was (44-byte fixed header, 37-byte layer entries,
  // three sections per layer): refused by its version, before any of its layout is read.
  const SnapshotImage image = SmallImage();
  Bytes v2(44 + 37 * image.layers.size() + 8, 0);
  std::memcpy(v2.data(), "KVQSNAP\0", 8);
  Poke<uint32_t>(&v2, 8, 2);
  Poke<int64_t>(&v2, 12, static_cast<int64_t>(image.layers.size()));
  Poke<uint64_t>(&v2, 44 + 37 * image.layers.size(), Checksum64(v2.data(), v2.size() - 8));
  const std::string path = Path("old.kvqsnap");
  WriteFile(path, v2);
  ExpectRefused(path, ExpectationFor(image),
                "has version 2, which this kvq does not read (it reads 3 and 4)");
  // A current file relabelled is refused the same way, not misread.
  Bytes bytes = Written(image, path);
  for (uint32_t version : {2u, 1u, 0u}) {
    Poke<uint32_t>(&bytes, 8, version);
    WriteFile(path, bytes);
    ExpectRefused(path, ExpectationFor(image),
                  "has version " + std::to_string(version) +
                      ", which this kvq does not read (it reads 3 and 4)");
  }
}

// Version 3 (before hybrid models) is version 4 without the state section: such a file reads as
// holding no state, so a model without one still loads the prompt caches it saved; a cache that
// carries a state refuses it (restoring the KV without the state would continue from a wrong one).
TEST_F(SnapshotTest, ReadsVersion3AsHoldingNoState) {
  SnapshotImage image = SmallImage();
  image.state.clear();
  const std::string path = Path("v3.kvqsnap");
  Bytes bytes = Written(image, path);
  const Layout layout = LayoutOf(image);
  bytes.resize(layout.state_start);  // drop the (empty) state section
  Poke<uint32_t>(&bytes, 8, 3);
  // The header checksum covers the version.
  const uint64_t table_end = layout.header_end - 8;
  Poke<uint64_t>(&bytes, table_end, Checksum64(bytes.data(), table_end));
  WriteFile(path, bytes);
  const Result<SnapshotImage> back = ReadSnapshot(path, ExpectationFor(image));
  ASSERT_TRUE(back.ok()) << back.status().message();
  ExpectSameImage(*back, image);
  SnapshotExpectation hybrid = ExpectationFor(image);
  hybrid.state_floats = 12;
  ExpectRefused(path, hybrid, "holds 0 floats of recurrent state; this model's sessions carry 12 (a version 3 file "
                              "holds none)");
  // The same bytes labelled version 4 lack the state section: truncated.
  Poke<uint32_t>(&bytes, 8, 4);
  Poke<uint64_t>(&bytes, table_end, Checksum64(bytes.data(), table_end));
  WriteFile(path, bytes);
  ExpectRefused(path, ExpectationFor(image), "is truncated");
}

TEST_F(SnapshotTest, RefusesAStateOfAnotherLengthOrDamaged) {
  const SnapshotImage image = SmallImage();
  const std::string path = Path("prefix.kvqsnap");
  Bytes bytes = Written(image, path);
  SnapshotExpectation expect = ExpectationFor(image);
  expect.state_floats = 3;
  ExpectRefused(path, expect, "holds 2 floats of recurrent state; this model's sessions carry 3");
  expect.state_floats = 0;
  ExpectRefused(path, expect, "holds 2 floats of recurrent state; this model's sessions carry 0");
  const Layout layout = LayoutOf(image);
  bytes[layout.state_start + 8] ^= 0x10;  // a bit of the first float
  WriteFile(path, bytes);
  ExpectRefused(path, ExpectationFor(image), "state section is corrupt (checksum mismatch)");
}

TEST_F(SnapshotTest, RefusesAnotherModelShape) {
  const SnapshotImage image = SmallImage();
  const std::string path = Path("prefix.kvqsnap");
  Written(image, path);
  SnapshotExpectation expect = ExpectationFor(image);
  expect.model.head_dim = 16;
  const std::string message = ExpectRefused(path, expect, "was saved for another model");
  EXPECT_TRUE(Contains(message, "2 layers x 4 KV heads x head_dim 8")) << message;
  EXPECT_TRUE(Contains(message, "this model: 2 layers x 4 KV heads x head_dim 16")) << message;
}

TEST_F(SnapshotTest, RefusesAnotherModelWeights) {
  const SnapshotImage image = SmallImage();
  const std::string path = Path("prefix.kvqsnap");
  Written(image, path);
  SnapshotExpectation expect = ExpectationFor(image);
  expect.model.weights_hash = 0x0123456789ABCDEFULL;
  const std::string message = ExpectRefused(path, expect, "was saved for another model");
  EXPECT_TRUE(Contains(message, "a1b2c3d4e5f60718")) << message;
  EXPECT_TRUE(Contains(message, "0123456789abcdef")) << message;
  const size_t mine = message.find("this model:");
  ASSERT_NE(mine, std::string::npos) << message;
  EXPECT_LT(message.find("a1b2c3d4e5f60718"), mine) << message;
  EXPECT_GT(message.find("0123456789abcdef"), mine) << message;
}

TEST_F(SnapshotTest, RefusesAnotherFormat) {
  const SnapshotImage image = SmallImage();
  const std::string path = Path("prefix.kvqsnap");
  Written(image, path);
  SnapshotExpectation expect = ExpectationFor(image);
  expect.key_formats[0] = 2;
  ExpectRefused(path, expect,
                "layer 0 was saved with K format int4 and V format int4; the cache uses f16 and int4");
  expect = ExpectationFor(image);
  expect.value_formats[1] = 7;
  ExpectRefused(path, expect,
                "layer 1 was saved with K format f16 and V format f16; the cache uses f16 and int2");
  expect = ExpectationFor(image);
  expect.key_formats.pop_back();
  ExpectRefused(path, expect, "has 2 layers");
}

TEST_F(SnapshotTest, RefusesTrailingBytes) {
  const SnapshotImage image = SmallImage();
  const std::string path = Path("prefix.kvqsnap");
  Bytes bytes = Written(image, path);
  bytes.push_back(0);
  WriteFile(path, bytes);
  ExpectRefused(path, ExpectationFor(image), "has 1 trailing byte after the last section");
  bytes.insert(bytes.end(), {'K', 'V', 'Q'});
  WriteFile(path, bytes);
  ExpectRefused(path, ExpectationFor(image), "has 4 trailing bytes after the last section");
}

TEST_F(SnapshotTest, RefusesTruncationAtEveryByteOfASmallFile) {
  const SnapshotImage image = SmallImage();
  const SnapshotExpectation expect = ExpectationFor(image);
  const std::string path = Path("prefix.kvqsnap");
  const Bytes bytes = Written(image, path);
  ASSERT_EQ(bytes.size(), LayoutOf(image).file_size);
  for (size_t size = 0; size < bytes.size(); ++size) {
    SCOPED_TRACE(testing::Message() << "truncated to " << size << " bytes");
    WriteFile(path, bytes.data(), size);
    const std::string message = ExpectRefused(path, expect, "is truncated: expected ");
    EXPECT_TRUE(Contains(message, " more bytes at offset " + std::to_string(size) + " ("))
        << message;
  }
}

TEST_F(SnapshotTest, RefusesTruncationAtSampledOffsetsOfALargerFile) {
  const SnapshotImage image = LargeImage();
  const SnapshotExpectation expect = ExpectationFor(image);
  const Layout layout = LayoutOf(image);
  const std::string path = Path("prefix.kvqsnap");
  const Bytes bytes = Written(image, path);
  ASSERT_EQ(bytes.size(), layout.file_size);

  std::set<uint64_t> sizes;
  for (size_t i = 0; i < layout.start.size(); ++i) {  // around every section boundary
    for (int s = 0; s < kSections; ++s) {
      const uint64_t data_end = layout.start[i][s] + layout.length[i][s];
      for (uint64_t edge : {layout.start[i][s], data_end, data_end + 8}) {
        for (uint64_t d : {0, 1, 7, 8, 9}) {
          if (edge >= d) sizes.insert(edge - d);
          sizes.insert(edge + d);
        }
      }
    }
  }
  std::mt19937_64 rng(99);
  while (sizes.size() < 200) sizes.insert(rng() % bytes.size());
  for (uint64_t size : sizes) {
    if (size >= bytes.size()) continue;
    SCOPED_TRACE(testing::Message() << "truncated to " << size << " bytes");
    WriteFile(path, bytes.data(), size);
    const std::string message = ExpectRefused(path, expect, "is truncated: expected ");
    EXPECT_TRUE(Contains(message, " more bytes at offset " + std::to_string(size) + " ("))
        << message;
  }
}

TEST_F(SnapshotTest, RefusesAFlippedByteInTheHeader) {
  const SnapshotImage image = SmallImage();
  const SnapshotExpectation expect = ExpectationFor(image);
  const Layout layout = LayoutOf(image);
  const std::string path = Path("prefix.kvqsnap");
  const Bytes good = Written(image, path);
  for (uint64_t at = 0; at < layout.header_end; ++at) {
    SCOPED_TRACE(testing::Message() << "byte " << at << " flipped");
    Bytes bytes = good;
    bytes[at] ^= 0xFF;
    WriteFile(path, bytes);
    if (at < 8) {
      ExpectRefused(path, expect, "bad magic");
    } else if (at < 12) {
      ExpectRefused(path, expect, "newer kvq");
    } else if (at < 20) {
      ExpectRefused(path, expect, "");  // the layer count: corrupt or truncated, either way refused
    } else {
      ExpectRefused(path, expect, "header is corrupt");  // the checksum field itself included
    }
  }
}

TEST_F(SnapshotTest, RefusesAFlippedByteInEverySectionAndChecksum) {
  const SnapshotImage image = SmallImage();
  const SnapshotExpectation expect = ExpectationFor(image);
  const Layout layout = LayoutOf(image);
  const std::string path = Path("prefix.kvqsnap");
  const Bytes good = Written(image, path);
  int checked = 0;
  for (size_t layer = 0; layer < image.layers.size(); ++layer) {
    for (int s = 0; s < kSections; ++s) {
      const uint64_t begin = layout.start[layer][s];
      const uint64_t end = begin + layout.length[layer][s] + 8;  // data, then its checksum
      for (uint64_t at = begin; at < end; ++at) {
        SCOPED_TRACE(testing::Message() << "byte " << at << " flipped");
        Bytes bytes = good;
        bytes[at] ^= 0xFF;
        WriteFile(path, bytes);
        ExpectRefused(path, expect,
                      "layer " + std::to_string(layer) + " " + kSectionName[s] +
                          " section is corrupt (checksum mismatch)");
        ++checked;
      }
    }
  }
  // The tokens and state sections: their numbers and checksums fail the checksum; a count (also
  // covered by the checksum) may instead announce more than the file holds.
  for (uint64_t at = layout.tokens_start; at < layout.file_size; ++at) {
    SCOPED_TRACE(testing::Message() << "tokens or state byte " << at << " flipped");
    Bytes bytes = good;
    bytes[at] ^= 0xFF;
    WriteFile(path, bytes);
    const bool state = at >= layout.state_start;
    const uint64_t count_end = (state ? layout.state_start : layout.tokens_start) + 8;
    ExpectRefused(path, expect, at < count_end ? "" : state ? "state section is corrupt" : "tokens section is corrupt");
    ++checked;
  }
  EXPECT_EQ(static_cast<uint64_t>(checked), good.size() - layout.header_end);
}

TEST_F(SnapshotTest, RefusesSectionsSwappedWithTheirChecksums) {
  const SnapshotImage image = SmallImage();  // both layers have 24 key bytes
  ASSERT_EQ(image.layers[0].key_bytes.size(), image.layers[1].key_bytes.size());
  const Layout layout = LayoutOf(image);
  const std::string path = Path("prefix.kvqsnap");
  Bytes bytes = Written(image, path);
  const uint64_t n = layout.length[0][0] + 8;
  std::swap_ranges(bytes.begin() + layout.start[0][0], bytes.begin() + layout.start[0][0] + n,
                   bytes.begin() + layout.start[1][0]);
  WriteFile(path, bytes);
  ExpectRefused(path, ExpectationFor(image), "layer 0 key section is corrupt");
}

TEST_F(SnapshotTest, RefusesAbsurdLengthsWithoutAllocatingThem) {
  const SnapshotImage image = SmallImage();
  const SnapshotExpectation expect = ExpectationFor(image);
  const std::string path = Path("prefix.kvqsnap");
  const Bytes good = Written(image, path);
  constexpr uint64_t kHuge = uint64_t{1} << 62;
  struct Edit {
    uint64_t offset;
    uint64_t value;
    const char* reason;
  };
  const std::vector<Edit> edits = {
      {LengthFieldOffset(1, 0), kHuge, "is truncated"},
      {LengthFieldOffset(0, 1), ~uint64_t{0}, "is truncated"},
      {LengthFieldOffset(0, 2), kHuge, "is truncated"},  // 2^62 floats: 2^64 bytes wraps to 0
      {LengthFieldOffset(1, 2), ~uint64_t{0} / 4 + 1, "is truncated"},
      {LengthFieldOffset(0, 3), kHuge, "is truncated"},
      {LengthFieldOffset(1, 3), ~uint64_t{0}, "is truncated"},
      {LengthFieldOffset(0, 4), ~uint64_t{0} / 4 + 1, "is truncated"},
      {LengthFieldOffset(1, 5), kHuge, "is truncated"},
      {LengthFieldOffset(0, 5), good.size() / 4, "is truncated"},  // more than the file holds
      {LengthFieldOffset(0, 0), good.size(), "is truncated"},
      {12, kHuge, "is truncated"},                    // the layer count
      {12, ~uint64_t{0}, "header is corrupt"},        // a negative layer count
  };
  for (const Edit& edit : edits) {
    SCOPED_TRACE(testing::Message() << "offset " << edit.offset << " set to " << edit.value);
    Bytes bytes = good;
    Poke<uint64_t>(&bytes, edit.offset, edit.value);
    ResealHeader(&bytes, image.layers.size());
    WriteFile(path, bytes);
    g_largest_allocation = 0;
    g_track_allocations = true;
    ExpectRefused(path, expect, edit.reason);
    g_track_allocations = false;
    EXPECT_LT(g_largest_allocation.load(), size_t{1} << 20);
  }
}

TEST_F(SnapshotTest, ReadingAllocatesAboutOneCopyOfTheData) {
  const SnapshotImage image = LargeImage();
  const std::string path = Path("prefix.kvqsnap");
  const Bytes bytes = Written(image, path);
  g_largest_allocation = 0;
  g_track_allocations = true;
  const Result<SnapshotImage> back = ReadSnapshot(path, ExpectationFor(image));
  g_track_allocations = false;
  ASSERT_TRUE(back.ok()) << back.status().message();
  // No buffer the size of the whole file: sections go straight into the image.
  EXPECT_LE(g_largest_allocation.load(), size_t{100'003});
  ExpectSameImage(*back, image);
}

TEST_F(SnapshotTest, RefusesOtherTransformsNamingLayerAndTensor) {
  const SnapshotImage image = TransformsImage();
  const std::string path = Path("prefix.kvqsnap");
  Written(image, path);
  struct Case {
    size_t layer;
    int tensor;
    KvTransforms cache;
    const char* reason;
  };
  const std::vector<Case> cases = {
      {2, 0, Rot(), "layer 2 keys were saved as int4+rot+sink4; the cache uses int4+rot"},
      {0, 1, kNone, "layer 0 values were saved as int4+res2; the cache uses int4"},
      {0, 0, Tr(false, 0, 2), "layer 0 keys were saved as int4; the cache uses int4+res2"},
      {1, 0, kNone, "layer 1 keys were saved as f16+rot; the cache uses f16"},
      {1, 1, Tr(true, 3, 5),
       "layer 1 values were saved as int2; the cache uses int2+rot+sink3+res5"},
      {2, 1, Tr(true, 1, 64),
       "layer 2 values were saved as int4+rot+res64; the cache uses int4+rot+sink1+res64"},
      {2, 1, Tr(true, 0, 65),
       "layer 2 values were saved as int4+rot+res64; the cache uses int4+rot+res65"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.reason);
    SnapshotExpectation expect = ExpectationFor(image);
    expect.transforms[c.layer][c.tensor] = c.cache;
    ExpectRefused(path, expect, c.reason);
  }
  SnapshotExpectation expect = ExpectationFor(image);
  expect.transforms.pop_back();
  ExpectRefused(path, expect,
                "has 3 layers; the cache describes 3 key formats, 3 value formats and 2 layers of "
                "transforms");
  // An unknown format id still prints.
  Bytes bytes = ReadFile(path);
  Poke<uint16_t>(&bytes, kHeaderFixed + kLayerEntry * 2, 999);
  ResealHeader(&bytes, image.layers.size());
  WriteFile(path, bytes);
  expect = ExpectationFor(image);
  expect.key_formats[2] = 999;
  expect.transforms[2][0] = kNone;
  ExpectRefused(path, expect, "layer 2 keys were saved as #999+rot+sink4; the cache uses #999");
}

TEST_F(SnapshotTest, RefusesAnotherRotationSeedWhenSomeTensorRotates) {
  const SnapshotImage image = TransformsImage();  // layer 0 does not rotate, layer 1's keys do
  const std::string path = Path("prefix.kvqsnap");
  Written(image, path);
  SnapshotExpectation expect = ExpectationFor(image);
  expect.rotation_seed = kDefaultRotationSeed;
  ExpectRefused(
      path, expect,
      "was saved with rotation seed 0ddba11c0ffee123; the cache uses 6b76712d726f7431 (layer 1 "
      "keys are rotated");
  // The same seed loads.
  expect.rotation_seed = kRoundTripSeed;
  const Result<SnapshotImage> back = ReadSnapshot(path, expect);
  ASSERT_TRUE(back.ok()) << back.status().message();
  ExpectSameImage(*back, image);
}

TEST_F(SnapshotTest, AcceptsAnotherRotationSeedWhenNothingRotates) {
  SnapshotImage image = RoundTripImage();
  for (SnapshotLayer& layer : image.layers) {
    for (KvTransforms& t : layer.transforms) t.rotate = false;
  }
  const std::string path = Path("prefix.kvqsnap");
  Written(image, path);
  SnapshotExpectation expect = ExpectationFor(image);
  expect.rotation_seed = kDefaultRotationSeed;
  const Result<SnapshotImage> back = ReadSnapshot(path, expect);
  ASSERT_TRUE(back.ok()) << back.status().message();
  ExpectSameImage(*back, image);  // the file's seed, as it was saved
  // One rotated tensor anywhere makes the seed matter.
  image.layers[2].transforms[1].rotate = true;
  Written(image, path);
  expect = ExpectationFor(image);
  expect.rotation_seed = kDefaultRotationSeed;
  ExpectRefused(path, expect, "(layer 2 values are rotated");
}

TEST_F(SnapshotTest, RefusesACorruptRotateFlag) {
  const SnapshotImage image = SmallImage();
  const std::string path = Path("prefix.kvqsnap");
  const Bytes good = Written(image, path);
  struct Edit {
    size_t layer;
    int tensor;
    uint8_t flag;
    const char* reason;
  };
  for (const Edit& edit : {Edit{1, 1, 2, "header is corrupt (layer 1 values rotate flag 2)"},
                           Edit{0, 0, 0xFF, "header is corrupt (layer 0 keys rotate flag 255)"}}) {
    Bytes bytes = good;
    bytes[TransformsOffset(edit.layer, edit.tensor)] = edit.flag;
    ResealHeader(&bytes, image.layers.size());
    WriteFile(path, bytes);
    ExpectRefused(path, ExpectationFor(image), edit.reason);
  }
}

TEST_F(SnapshotTest, RefusesTransformRowsOverTheLimit) {
  const SnapshotImage image = SmallImage();
  const std::string path = Path("prefix.kvqsnap");
  const Bytes good = Written(image, path);
  struct Edit {
    uint64_t offset;
    uint32_t value;
    const char* reason;
  };
  const std::vector<Edit> edits = {
      {TransformsOffset(0, 0) + 1, kMaxTransformRows + 1,
       "header is corrupt (layer 0 keys sinks 65537; the most is 65536)"},
      {TransformsOffset(1, 1) + 5, 0xFFFFFFFFu,
       "header is corrupt (layer 1 values residual 4294967295; the most is 65536)"},
      {TransformsOffset(0, 1) + 5, 0x80000000u,  // negative as an i32
       "header is corrupt (layer 0 values residual 2147483648; the most is 65536)"},
  };
  for (const Edit& edit : edits) {
    Bytes bytes = good;
    Poke<uint32_t>(&bytes, edit.offset, edit.value);
    ResealHeader(&bytes, image.layers.size());
    WriteFile(path, bytes);
    ExpectRefused(path, ExpectationFor(image), edit.reason);
  }
  // The limit itself is a valid count.
  Bytes bytes = good;
  Poke<uint32_t>(&bytes, TransformsOffset(1, 0) + 1, kMaxTransformRows);
  ResealHeader(&bytes, image.layers.size());
  WriteFile(path, bytes);
  SnapshotExpectation expect = ExpectationFor(image);
  expect.transforms[1][0].sinks = kMaxTransformRows;
  const Result<SnapshotImage> back = ReadSnapshot(path, expect);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->layers[1].transforms[0].sinks, kMaxTransformRows);
}

TEST_F(SnapshotTest, WriteRefusesTransformRowsOutOfRange) {
  for (const KvTransforms bad : {Tr(false, kMaxTransformRows + 1, 0), Tr(true, 0, -1)}) {
    SnapshotImage image = SmallImage();
    image.layers[1].transforms[1] = bad;
    const std::string path = Path("prefix.kvqsnap");
    const Status s = WriteSnapshot(path, image);
    ASSERT_FALSE(s.ok());
    EXPECT_TRUE(Contains(s.message(), path)) << s.message();
    EXPECT_TRUE(Contains(s.message(), "layer 1 values have sinks")) << s.message();
    EXPECT_TRUE(Listing(dir_).empty());
  }
}

std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> out(n);
  for (uint8_t& b : out) b = rng() & 0xFF;
  return out;
}

TEST(Checksum64, EverySingleBitFlipOfAKibibyteChangesIt) {
  std::vector<uint8_t> buf = RandomBytes(1024, 1);
  const uint64_t base = Checksum64(buf.data(), buf.size());
  for (size_t bit = 0; bit < buf.size() * 8; ++bit) {
    buf[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    ASSERT_NE(Checksum64(buf.data(), buf.size()), base) << "bit " << bit;
    buf[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
  EXPECT_EQ(Checksum64(buf.data(), buf.size()), base);
}

TEST(Checksum64, EverySingleBitFlipOfShortBuffersChangesIt) {
  // Every length up to two stripes, so the tail paths (words, then bytes) are covered.
  for (size_t n = 1; n <= 72; ++n) {
    std::vector<uint8_t> buf = RandomBytes(n, n);
    const uint64_t base = Checksum64(buf.data(), n, 5);
    for (size_t bit = 0; bit < n * 8; ++bit) {
      buf[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      ASSERT_NE(Checksum64(buf.data(), n, 5), base) << "length " << n << " bit " << bit;
      buf[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    }
  }
}

TEST(Checksum64, DependsOnLengthAndSeed) {
  const std::vector<uint8_t> zeros(64, 0);
  std::set<uint64_t> seen;
  for (size_t n = 0; n <= 64; ++n) seen.insert(Checksum64(zeros.data(), n));
  EXPECT_EQ(seen.size(), 65u);  // trailing zero bytes are not invisible
  const std::vector<uint8_t> buf = RandomBytes(100, 2);
  EXPECT_NE(Checksum64(buf.data(), buf.size(), 0), Checksum64(buf.data(), buf.size(), 1));
}

TEST(Checksum64, IsStableAcrossBuilds) {
  // Snapshot files on disk depend on these exact values: changing the function breaks them.
  EXPECT_EQ(Checksum64(nullptr, 0), 0xef46db3751d8e999ULL);  // also xxHash64's empty input
  const std::string text = "kvq prefix snapshot";
  EXPECT_EQ(Checksum64(text.data(), text.size()), 0x7a02a7805f8c35f2ULL);
  std::vector<uint8_t> ramp(100);
  for (size_t i = 0; i < ramp.size(); ++i) ramp[i] = static_cast<uint8_t>(i * 7);
  EXPECT_EQ(Checksum64(ramp.data(), ramp.size(), 42), 0x9a9f882eacf8eca9ULL);
}

}  // namespace
}  // namespace kvq
