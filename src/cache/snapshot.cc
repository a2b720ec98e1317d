// Prefix snapshot files: the byte layout, the atomic writer and the validating reader.
// Every length read from a file is checked against the file's real size before anything is
// allocated, and nothing is returned until every checksum has matched, so a damaged file costs
// an error message, never a crash, a huge allocation or a half-loaded cache.
#include "cache/snapshot.h"
#include "base/checksum.h"

#include "kvq/format.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string_view>

// File layout, version 4. Version 3 is read as version 4 without the state section (it has none:
// it predates hybrid models); version 2 (no transforms, sinks, value residual or rotation seed) and
// version 1 (no tokens section) are refused, not converted. Little-endian, no padding.
// L = n_layers.
//
//   offset      size   field
//   0           8      magic "KVQSNAP\0"
//   8           4      u32 version (kSnapshotVersion)
//   12          8      i64 n_layers        -+
//   20          4      i32 n_kv_heads       |  model fingerprint
//   24          4      i32 head_dim         |
//   28          8      u64 weights_hash    -+
//   36          8      i64 n_positions
//   44          8      u64 rotation_seed
//   52          79*L   layer table; layer i at 52 + 79*i:
//                        +0  u16 key_format          +2  u16 value_format
//                        +4  f32 key_scale           +8  f32 value_scale
//                        +12 u8  scales_calibrated (0 or 1)
//                        +13 u8  key rotate (0..3)     +14 u32 key sinks   +18 u32 key residual
//                        +22 u8  value rotate (0 or 1) +23 u32 value sinks +27 u32 value residual
//                            (the rotate flag: bit 0 "rot"; for keys bit 1 "prerope", keys stored
//                            before RoPE — a file without it reads as before)
//                            (sinks and residual at most kMaxTransformRows)
//                        +31 u64 key_bytes           +39 u64 value_bytes
//                        +47 u64 key residual count  +55 u64 value residual count
//                        +63 u64 key sinks count     +71 u64 value sinks count
//                            (the four counts in floats, not bytes)
//   52 + 79*L   8      u64 header checksum = Checksum64(bytes [0, 52 + 79*L), seed 0)
//
// Then for each layer i in order, six sections s = 0..5 in the order of the lengths above (key
// bytes, value bytes, key residual, value residual, key sinks, value sinks), each its raw bytes
// (4*count bytes of f32 for s >= 2) followed by a u64 Checksum64(those bytes, seed 6*i + s + 1).
// Then the tokens section: u64 n_tokens, n_tokens × i32 token ids, and a u64
// Checksum64(those 8 + 4·n_tokens bytes, seed 6*L + 1). Then the state section (version 4): u64
// n_state, n_state × f32 (a hybrid model's recurrent state after the n_positions tokens; 0 for a
// model without one), and a u64 Checksum64(those 8 + 4·n_state bytes, seed 6*L + 2). The file ends
// there; trailing bytes are an error.
//
// Seeding each section's checksum with its position makes a section (with its checksum) copied
// or swapped into the wrong place fail, although its bytes are intact.

namespace kvq {
namespace {

static_assert(std::endian::native == std::endian::little,
              "snapshot files are little-endian and are read and written with memcpy");

constexpr char kMagic[8] = {'K', 'V', 'Q', 'S', 'N', 'A', 'P', '\0'};
constexpr uint64_t kFixedHeaderBytes = 52;  // magic .. rotation_seed
constexpr uint64_t kLayerEntryBytes = 79;
constexpr uint64_t kTransformsAt = 13;   // in a layer entry; 9 bytes per tensor
constexpr uint64_t kTransformBytes = 9;  // u8 rotate flag, u32 sinks, u32 residual
constexpr uint8_t kRotateBit = 1, kPreRopeBit = 2;  // in the rotate flag (prerope: keys only)
constexpr uint64_t kLengthsAt = 31;      // in a layer entry; one u64 per section
constexpr uint64_t kChecksumBytes = 8;
constexpr uint64_t kMaxU64 = std::numeric_limits<uint64_t>::max();
constexpr int kSections = 6;
constexpr const char* kSectionNames[kSections] = {
    "key", "value", "key residual", "value residual", "key sinks", "value sinks"};
constexpr const char* kTensorNames[2] = {"keys", "values"};

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Stores `v` at `*p` and advances it; the caller sized the buffer.
template <typename T>
void Store(uint8_t** p, T v) {
  std::memcpy(*p, &v, sizeof(T));
  *p += sizeof(T);
}

uint64_t SectionSeed(uint64_t layer, int section) { return kSections * layer + section + 1; }
uint64_t TokensSeed(uint64_t n_layers) { return kSections * n_layers + 1; }
uint64_t StateSeed(uint64_t n_layers) { return kSections * n_layers + 2; }
constexpr uint32_t kFirstVersionWithState = 4;

// Section s >= 2 of a layer: the f32 residual (K, V), then the sinks (K, V).
template <typename Layer>
auto& FloatSection(Layer& layer, int s) {
  return s < 4 ? layer.residual[s - 2] : layer.sinks[s - 4];
}

// Section s's data and its length in bytes.
const void* SectionData(const SnapshotLayer& layer, int s) {
  if (s == 0) return layer.key_bytes.data();
  if (s == 1) return layer.value_bytes.data();
  return FloatSection(layer, s).data();
}
uint64_t SectionBytes(const SnapshotLayer& layer, int s) {
  if (s == 0) return layer.key_bytes.size();
  if (s == 1) return layer.value_bytes.size();
  return FloatSection(layer, s).size() * sizeof(float);
}
// What the layer table stores for section s: bytes, or floats for the f32 sections.
uint64_t SectionCount(const SnapshotLayer& layer, int s) {
  return s < 2 ? SectionBytes(layer, s) : FloatSection(layer, s).size();
}

std::string FormatName(uint16_t id) {
  const FormatDesc* f = FindFormat(static_cast<FormatId>(id));
  return f != nullptr ? std::string(f->name) : fmt::format("#{}", id);
}

// A tensor's spec as KvSpecName prints it ("int4+rot+sink4+res64"), from the ids a file holds
// (an unknown format prints as "#id").
std::string SpecText(uint16_t format, const KvTransforms& t) {
  std::string text = FormatName(format);
  if (t.rotate) text += "+rot";
  if (t.sinks > 0) text += fmt::format("+sink{}", t.sinks);
  if (t.residual > 0) text += fmt::format("+res{}", t.residual);
  if (t.pre_rope) text += "+prerope";
  return text;
}

uint64_t SaturatingAdd(uint64_t a, uint64_t b) { return a > kMaxU64 - b ? kMaxU64 : a + b; }

std::string OsError(int err) { return std::strerror(err != 0 ? err : EIO); }

std::string DescribeModel(const ModelFingerprint& m) {
  return fmt::format("{} layers x {} KV heads x head_dim {}, weights {:016x}", m.n_layers,
                     m.n_kv_heads, m.head_dim, m.weights_hash);
}

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

// ---------------------------------------------------------------------------------------------
// Writing.

std::vector<uint8_t> EncodeHeader(const SnapshotImage& image) {
  const size_t table_end = kFixedHeaderBytes + kLayerEntryBytes * image.layers.size();
  std::vector<uint8_t> h(table_end + kChecksumBytes);
  uint8_t* p = h.data();
  std::memcpy(p, kMagic, sizeof(kMagic));
  p += sizeof(kMagic);
  Store<uint32_t>(&p, kSnapshotVersion);
  Store<int64_t>(&p, image.model.n_layers);
  Store<int32_t>(&p, image.model.n_kv_heads);
  Store<int32_t>(&p, image.model.head_dim);
  Store<uint64_t>(&p, image.model.weights_hash);
  Store<int64_t>(&p, image.n_positions);
  Store<uint64_t>(&p, image.rotation_seed);
  for (const SnapshotLayer& layer : image.layers) {
    Store<uint16_t>(&p, layer.key_format);
    Store<uint16_t>(&p, layer.value_format);
    Store<float>(&p, layer.key_scale);
    Store<float>(&p, layer.value_scale);
    Store<uint8_t>(&p, layer.scales_calibrated ? 1 : 0);
    for (const KvTransforms& t : layer.transforms) {  // WriteSnapshot checked the ranges
      Store<uint8_t>(&p, static_cast<uint8_t>((t.rotate ? kRotateBit : 0) | (t.pre_rope ? kPreRopeBit : 0)));
      Store<uint32_t>(&p, static_cast<uint32_t>(t.sinks));
      Store<uint32_t>(&p, static_cast<uint32_t>(t.residual));
    }
    for (int s = 0; s < kSections; ++s) Store<uint64_t>(&p, SectionCount(layer, s));
  }
  Store<uint64_t>(&p, Checksum64(h.data(), table_end));
  return h;
}

// Returns false with errno set when the write came up short.
bool WriteAll(FILE* f, const void* data, size_t bytes) {
  if (bytes == 0) return true;
  errno = 0;
  return std::fwrite(data, 1, bytes, f) == bytes;
}

bool WriteSection(FILE* f, const void* data, size_t bytes, uint64_t seed) {
  const uint64_t sum = Checksum64(data, bytes, seed);
  return WriteAll(f, data, bytes) && WriteAll(f, &sum, sizeof(sum));
}

// A counted section (tokens, state): u64 count, then the count 4-byte numbers.
template <typename T>
std::vector<uint8_t> CountedSection(const std::vector<T>& values) {
  static_assert(sizeof(T) == 4);
  std::vector<uint8_t> bytes(8 + 4 * values.size());
  uint8_t* p = bytes.data();
  Store<uint64_t>(&p, values.size());
  if (!values.empty()) std::memcpy(p, values.data(), 4 * values.size());
  return bytes;
}

// Makes the rename itself durable. Best effort: the snapshot is already in place and complete
// when this runs, so failing the write here would leave a file behind an error.
void SyncParentDirectory(const std::string& path) {
  const size_t slash = path.rfind('/');
  std::string dir = ".";
  if (slash != std::string::npos) dir = slash == 0 ? "/" : path.substr(0, slash);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// ---------------------------------------------------------------------------------------------
// Reading.

// `what`, `bytes` long from offset `start`, runs past the end of a file of `file_size` bytes.
Status TruncatedError(const std::string& path, uint64_t file_size, uint64_t start, uint64_t bytes,
                      std::string_view what) {
  const uint64_t end = SaturatingAdd(start, bytes);
  return Status::Error(
      fmt::format("snapshot '{}' is truncated: expected {} more bytes at offset {} ({} ends at {})",
                  path, end - file_size, file_size, what, end));
}

// Sequential reads from the file with its size known up front, so that every request can be
// checked against what is actually there before a buffer is sized for it.
class Reader {
 public:
  Reader(const std::string& path, FILE* f, uint64_t size) : path_(path), f_(f), size_(size) {}

  uint64_t offset() const { return offset_; }
  uint64_t size() const { return size_; }
  uint64_t remaining() const { return size_ - offset_; }

  Status Read(void* dst, uint64_t bytes, std::string_view what) {
    if (bytes > remaining()) return TruncatedError(path_, size_, offset_, bytes, what);
    if (bytes == 0) return Status::Ok();
    const size_t got = std::fread(dst, 1, bytes, f_);
    if (got != bytes) {
      if (std::ferror(f_)) {
        return Status::Error(fmt::format("cannot read snapshot '{}' at offset {}: {}", path_,
                                         offset_ + got, OsError(errno)));
      }
      return Status::Error(fmt::format(
          "snapshot '{}' is truncated: it ended at offset {} while being read, within {}", path_,
          offset_ + got, what));
    }
    offset_ += bytes;
    return Status::Ok();
  }

  // True when the file really ends here, even if it grew after we measured it.
  bool AtEnd() { return offset_ == size_ && std::fgetc(f_) == EOF; }

 private:
  const std::string& path_;
  FILE* f_;
  uint64_t size_;
  uint64_t offset_ = 0;
};

struct LayerLengths {
  uint64_t bytes[kSections];  // in bytes, in section order; saturated when absurd
};

// Reads a counted section (CountedSection) checksummed with `seed`: its count is read first and
// bounded by what is left of the file before anything is sized by it.
template <typename T>
Result<std::vector<T>> ReadCountedSection(Reader& in, const std::string& path, uint64_t seed, std::string_view name) {
  const std::string what = fmt::format("the {} section", name);
  std::vector<uint8_t> bytes(8);
  if (Status s = in.Read(bytes.data(), 8, what); !s.ok()) return s;
  const uint64_t n = Load<uint64_t>(bytes.data());
  if (n > (in.remaining() < kChecksumBytes ? 0 : (in.remaining() - kChecksumBytes) / 4)) {
    return TruncatedError(path, in.size(), in.offset(), n > kMaxU64 / 8 ? kMaxU64 : 4 * n + kChecksumBytes, what);
  }
  bytes.resize(8 + 4 * n);
  uint64_t stored_sum = 0;
  if (Status s = in.Read(bytes.data() + 8, 4 * n, what); !s.ok()) return s;
  if (Status s = in.Read(&stored_sum, sizeof(stored_sum), what); !s.ok()) return s;
  if (Checksum64(bytes.data(), bytes.size(), seed) != stored_sum) {
    return Status::Error(fmt::format("snapshot '{}' {} section is corrupt (checksum mismatch)", path, name));
  }
  std::vector<T> values(n);
  if (n > 0) std::memcpy(values.data(), bytes.data() + 8, 4 * n);
  return values;
}

}  // namespace

Status WriteSnapshot(const std::string& path, const SnapshotImage& image) {
  if (image.model.n_layers < 0 ||
      image.layers.size() != static_cast<uint64_t>(image.model.n_layers)) {
    return Status::Error(
        fmt::format("cannot write snapshot '{}': the image has {} layers but its model has {}",
                    path, image.layers.size(), image.model.n_layers));
  }
  for (size_t i = 0; i < image.layers.size(); ++i) {
    for (int t = 0; t < 2; ++t) {
      const KvTransforms& x = image.layers[i].transforms[t];
      for (const int32_t rows : {x.sinks, x.residual}) {
        if (rows < 0 || rows > kMaxTransformRows) {
          return Status::Error(fmt::format(
              "cannot write snapshot '{}': layer {} {} have sinks {} and residual {} (each must "
              "be in [0, {}])",
              path, i, kTensorNames[t], x.sinks, x.residual, kMaxTransformRows));
        }
      }
    }
  }
  const std::vector<uint8_t> header = EncodeHeader(image);

  static std::atomic<uint64_t> counter{0};
  const std::string tmp = fmt::format("{}.tmp-{}-{}", path, ::getpid(), counter.fetch_add(1));
  // "x": never clobber a file we did not create, should a stale name collide.
  File file(std::fopen(tmp.c_str(), "wbx"));
  if (!file) {
    return Status::Error(fmt::format("cannot write snapshot '{}': cannot create '{}': {}", path,
                                     tmp, OsError(errno)));
  }
  auto fail = [&](std::string_view step, int err) {
    file.reset();
    std::remove(tmp.c_str());
    return Status::Error(
        fmt::format("cannot write snapshot '{}': {} failed: {}", path, step, OsError(err)));
  };

  FILE* f = file.get();
  if (!WriteAll(f, header.data(), header.size())) return fail("writing the header", errno);
  const std::vector<uint8_t> tokens = CountedSection(image.tokens), state = CountedSection(image.state);
  for (size_t i = 0; i < image.layers.size(); ++i) {
    const SnapshotLayer& layer = image.layers[i];
    for (int s = 0; s < kSections; ++s) {
      if (!WriteSection(f, SectionData(layer, s), SectionBytes(layer, s), SectionSeed(i, s))) {
        const int err = errno;  // before fmt::format can touch it
        return fail(fmt::format("writing layer {} {} section", i, kSectionNames[s]), err);
      }
    }
  }
  if (!WriteSection(f, tokens.data(), tokens.size(), TokensSeed(image.layers.size()))) {
    return fail("writing the tokens", errno);
  }
  if (!WriteSection(f, state.data(), state.size(), StateSeed(image.layers.size()))) {
    return fail("writing the recurrent state", errno);
  }
  errno = 0;
  if (std::fflush(f) != 0) return fail("flushing", errno);
  if (::fsync(::fileno(f)) != 0) return fail("fsync", errno);
  errno = 0;
  const int close_result = std::fclose(file.release());
  if (close_result != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return Status::Error(fmt::format("cannot write snapshot '{}': closing '{}' failed: {}", path,
                                     tmp, OsError(err)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return Status::Error(fmt::format("cannot write snapshot '{}': renaming '{}' into place: {}",
                                     path, tmp, OsError(err)));
  }
  SyncParentDirectory(path);
  return Status::Ok();
}

Result<SnapshotImage> ReadSnapshot(const std::string& path, const SnapshotExpectation& expect) {
  auto error = [&](std::string_view what) {
    return Status::Error(fmt::format("snapshot '{}' {}", path, what));
  };

  File file(std::fopen(path.c_str(), "rb"));
  if (!file) {
    return Status::Error(fmt::format("cannot open snapshot '{}': {}", path, OsError(errno)));
  }
  struct stat st;
  if (::fstat(::fileno(file.get()), &st) != 0) {
    return Status::Error(fmt::format("cannot open snapshot '{}': {}", path, OsError(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return Status::Error(fmt::format("cannot open snapshot '{}': not a regular file", path));
  }
  Reader in(path, file.get(), static_cast<uint64_t>(st.st_size));

  // Magic. A short file whose bytes already differ from the magic is not a snapshot at all,
  // rather than a truncated one.
  std::vector<uint8_t> header(kFixedHeaderBytes);
  const uint64_t magic_present = std::min<uint64_t>(sizeof(kMagic), in.size());
  if (Status s = in.Read(header.data(), magic_present, "the magic"); !s.ok()) return s;
  if (std::memcmp(header.data(), kMagic, magic_present) != 0) {
    return error("is not a kvq snapshot (bad magic)");
  }
  if (Status s =
          in.Read(header.data() + magic_present, sizeof(kMagic) - magic_present, "the magic");
      !s.ok()) {
    return s;
  }

  // Version before anything else: a newer version may lay out the rest differently.
  if (Status s = in.Read(header.data() + 8, 4, "the version"); !s.ok()) return s;
  const uint32_t version = Load<uint32_t>(header.data() + 8);
  if (version > kSnapshotVersion) {
    return error(fmt::format("was written by a newer kvq (version {}; this kvq reads up to {})",
                             version, kSnapshotVersion));
  }
  if (version < kFirstVersionWithState - 1) {
    return error(fmt::format("has version {}, which this kvq does not read (it reads {} and {})", version,
                             kFirstVersionWithState - 1, kSnapshotVersion));
  }

  if (Status s = in.Read(header.data() + 12, kFixedHeaderBytes - 12, "the header"); !s.ok()) {
    return s;
  }
  ModelFingerprint model;
  model.n_layers = Load<int64_t>(header.data() + 12);
  model.n_kv_heads = Load<int32_t>(header.data() + 20);
  model.head_dim = Load<int32_t>(header.data() + 24);
  model.weights_hash = Load<uint64_t>(header.data() + 28);
  const int64_t n_positions = Load<int64_t>(header.data() + 36);
  const uint64_t rotation_seed = Load<uint64_t>(header.data() + 44);

  // The layer count is not yet covered by a checked checksum, so bound it by the file size
  // before sizing the header buffer with it.
  if (model.n_layers < 0) {
    return error(fmt::format("header is corrupt (layer count {})", model.n_layers));
  }
  const uint64_t n_layers = static_cast<uint64_t>(model.n_layers);
  const std::string table_what =
      fmt::format("the header with a layer table of {} layers", n_layers);
  if (in.remaining() < kChecksumBytes ||
      n_layers > (in.remaining() - kChecksumBytes) / kLayerEntryBytes) {
    const uint64_t needed = n_layers > (kMaxU64 - kChecksumBytes) / kLayerEntryBytes
                                ? kMaxU64
                                : n_layers * kLayerEntryBytes + kChecksumBytes;
    return TruncatedError(path, in.size(), in.offset(), needed, table_what);
  }
  const uint64_t table_bytes = n_layers * kLayerEntryBytes;
  header.resize(kFixedHeaderBytes + table_bytes + kChecksumBytes);
  if (Status s =
          in.Read(header.data() + kFixedHeaderBytes, table_bytes + kChecksumBytes, table_what);
      !s.ok()) {
    return s;
  }
  const uint64_t stored_header_sum =
      Load<uint64_t>(header.data() + kFixedHeaderBytes + table_bytes);
  if (Checksum64(header.data(), kFixedHeaderBytes + table_bytes) != stored_header_sum) {
    return error("header is corrupt (checksum mismatch)");
  }

  // The header is intact; check that the sections it announces fit the file, before
  // allocating anything for them.
  SnapshotImage image;
  image.model = model;
  image.n_positions = n_positions;
  image.rotation_seed = rotation_seed;
  image.layers.resize(n_layers);
  std::vector<LayerLengths> lengths(n_layers);
  uint64_t end = in.offset();
  for (uint64_t i = 0; i < n_layers; ++i) {
    const uint8_t* e = header.data() + kFixedHeaderBytes + i * kLayerEntryBytes;
    SnapshotLayer& layer = image.layers[i];
    layer.key_format = Load<uint16_t>(e + 0);
    layer.value_format = Load<uint16_t>(e + 2);
    layer.key_scale = Load<float>(e + 4);
    layer.value_scale = Load<float>(e + 8);
    const uint8_t calibrated = e[12];
    if (calibrated > 1) {
      return error(fmt::format("header is corrupt (layer {} scales flag {})", i, calibrated));
    }
    layer.scales_calibrated = calibrated == 1;
    for (int t = 0; t < 2; ++t) {
      const uint8_t* x = e + kTransformsAt + kTransformBytes * t;
      const uint8_t known = t == 0 ? kRotateBit | kPreRopeBit : kRotateBit;
      if ((x[0] & ~known) != 0) {
        return error(fmt::format("header is corrupt (layer {} {} rotate flag {})", i,
                                 kTensorNames[t], x[0]));
      }
      const uint32_t rows[2] = {Load<uint32_t>(x + 1), Load<uint32_t>(x + 5)};
      for (int r = 0; r < 2; ++r) {
        if (rows[r] > static_cast<uint32_t>(kMaxTransformRows)) {
          return error(fmt::format("header is corrupt (layer {} {} {} {}; the most is {})", i,
                                   kTensorNames[t], r == 0 ? "sinks" : "residual", rows[r],
                                   kMaxTransformRows));
        }
      }
      layer.transforms[t] = {.rotate = (x[0] & kRotateBit) != 0,
                             .sinks = static_cast<int32_t>(rows[0]),
                             .residual = static_cast<int32_t>(rows[1]),
                             .pre_rope = (x[0] & kPreRopeBit) != 0};
    }
    for (int s = 0; s < kSections; ++s) {
      const uint64_t count = Load<uint64_t>(e + kLengthsAt + 8 * s);
      const bool floats = s >= 2;  // counted in floats; an absurd count saturates
      lengths[i].bytes[s] = !floats                           ? count
                            : count > kMaxU64 / sizeof(float) ? kMaxU64
                                                              : count * sizeof(float);
    }
    for (int s = 0; s < kSections; ++s) {
      const uint64_t section = SaturatingAdd(lengths[i].bytes[s], kChecksumBytes);
      if (section > in.size() - end) {
        return TruncatedError(
            path, in.size(), end, section,
            fmt::format("the layer {} {} section with its checksum", i, kSectionNames[s]));
      }
      end += section;
    }
  }

  if (model != expect.model) {
    return error(fmt::format("was saved for another model: {}; this model: {}",
                             DescribeModel(model), DescribeModel(expect.model)));
  }
  if (expect.key_formats.size() != n_layers || expect.value_formats.size() != n_layers ||
      expect.transforms.size() != n_layers) {
    return error(fmt::format(
        "has {} layers; the cache describes {} key formats, {} value formats and {} layers of "
        "transforms",
        n_layers, expect.key_formats.size(), expect.value_formats.size(),
        expect.transforms.size()));
  }
  for (uint64_t i = 0; i < n_layers; ++i) {
    const SnapshotLayer& layer = image.layers[i];
    if (layer.key_format != expect.key_formats[i] ||
        layer.value_format != expect.value_formats[i]) {
      return error(fmt::format(
          "layer {} was saved with K format {} and V format {}; the cache uses {} and {}", i,
          FormatName(layer.key_format), FormatName(layer.value_format),
          FormatName(expect.key_formats[i]), FormatName(expect.value_formats[i])));
    }
    const uint16_t formats[2] = {layer.key_format, layer.value_format};
    for (int t = 0; t < 2; ++t) {
      if (layer.transforms[t] != expect.transforms[i][t]) {
        return error(fmt::format("layer {} {} were saved as {}; the cache uses {}", i,
                                 kTensorNames[t], SpecText(formats[t], layer.transforms[t]),
                                 SpecText(formats[t], expect.transforms[i][t])));
      }
    }
  }
  // The seed only shapes rotated rows: with none, a cache with another seed reads the file the
  // same, so it is not refused.
  if (rotation_seed != expect.rotation_seed) {
    for (uint64_t i = 0; i < n_layers; ++i) {
      for (int t = 0; t < 2; ++t) {
        if (!image.layers[i].transforms[t].rotate) continue;
        return error(fmt::format(
            "was saved with rotation seed {:016x}; the cache uses {:016x} (layer {} {} are "
            "rotated, and rotated rows only read back under the seed that rotated them)",
            rotation_seed, expect.rotation_seed, i, kTensorNames[t]));
      }
    }
  }

  // Read straight into the image's buffers: the data exists once, however large the file.
  for (uint64_t i = 0; i < n_layers; ++i) {
    SnapshotLayer& layer = image.layers[i];
    layer.key_bytes.resize(lengths[i].bytes[0]);
    layer.value_bytes.resize(lengths[i].bytes[1]);
    void* targets[kSections] = {layer.key_bytes.data(), layer.value_bytes.data()};
    for (int s = 2; s < kSections; ++s) {
      std::vector<float>& floats = FloatSection(layer, s);
      floats.resize(lengths[i].bytes[s] / sizeof(float));
      targets[s] = floats.data();
    }
    for (int s = 0; s < kSections; ++s) {
      const std::string what = fmt::format("the layer {} {} section", i, kSectionNames[s]);
      uint64_t stored_sum = 0;
      if (Status st_read = in.Read(targets[s], lengths[i].bytes[s], what); !st_read.ok()) {
        return st_read;
      }
      if (Status st_read = in.Read(&stored_sum, sizeof(stored_sum), what); !st_read.ok()) {
        return st_read;
      }
      if (Checksum64(targets[s], lengths[i].bytes[s], SectionSeed(i, s)) != stored_sum) {
        return error(
            fmt::format("layer {} {} section is corrupt (checksum mismatch)", i, kSectionNames[s]));
      }
    }
  }

  Result<std::vector<int32_t>> tokens = ReadCountedSection<int32_t>(in, path, TokensSeed(n_layers), "tokens");
  if (!tokens.ok()) return tokens.status();
  image.tokens = std::move(tokens).value();
  if (version >= kFirstVersionWithState) {
    Result<std::vector<float>> state = ReadCountedSection<float>(in, path, StateSeed(n_layers), "state");
    if (!state.ok()) return state.status();
    image.state = std::move(state).value();
  }
  if (static_cast<int64_t>(image.state.size()) != expect.state_floats) {
    return error(fmt::format("holds {} floats of recurrent state; this model's sessions carry {}{}",
                             image.state.size(), expect.state_floats,
                             version < kFirstVersionWithState ? " (a version 3 file holds none)" : ""));
  }

  if (!in.AtEnd()) {
    const uint64_t extra = in.size() - in.offset();
    const std::string count =
        extra == 1 ? "1 trailing byte" : fmt::format("{} trailing bytes", extra);
    // A file that grew while being read has bytes past the size we measured.
    return error(fmt::format("has {} after the last section, at offset {}",
                             extra == 0 ? std::string("trailing bytes") : count, in.offset()));
  }
  return image;
}

}  // namespace kvq
