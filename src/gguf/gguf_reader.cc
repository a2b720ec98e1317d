// GGUF reader: maps the file, walks header, metadata and tensor infos with a bounds-checked
// cursor, and validates the tensor layout (alignment, extents, overlaps) before Open returns.
// Every count and length is compared with the bytes actually left in the file before anything is
// reserved or read, so a corrupt length is an error message, not a huge allocation.
#include "gguf/gguf_reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>
#include <optional>
#include <type_traits>
#include <utility>

#include "gguf/gguf_scalar.h"
#include "kvq/units.h"

namespace kvq {
namespace {

static_assert(std::endian::native == std::endian::little,
              "GGUF is little-endian and is read with memcpy");

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxDims = 4;
constexpr int kMaxArrayDepth = 8;  // nested arrays deeper than this are refused (stack safety)
// The fewest bytes one metadata pair or tensor info can take: bounds for the header's counts.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;                // key length, value type, a UINT8
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // name, n_dims, one dim, type, offset
// A count that fits the file may still be wrong: reserve at most this many entries up front and
// let real elements grow the rest, so memory follows what was parsed, not what was claimed.
constexpr uint64_t kMaxReserve = 1 << 14;

using gguf_internal::DecodeScalar;
using gguf_internal::IntegerAs;
using gguf_internal::kValueTypeCount;
using gguf_internal::Load;
using gguf_internal::Name;

}  // namespace

// ---- parsing ----

class GgufParser {
 public:
  // GgufFile::Open (file_bytes empty: the mapping is the whole file) and OpenHeader (the mapping is
  // the first bytes of a file of file_bytes bytes): maps `path` and parses it, tensors checked
  // against the whole file's size.
  static Result<std::unique_ptr<GgufFile>> MapAndParse(const std::string& path, std::optional<int64_t> file_bytes) {
    std::unique_ptr<GgufFile> file(new GgufFile());
    file->path_ = path;
    Result<std::shared_ptr<MappedFile>> mapped = MapFile(path, fmt::format("GGUF file '{}'", path));
    if (!mapped.ok()) return mapped.status();
    file->mapping_ = std::move(mapped).value();
    file->map_ = file->mapping_->data;
    file->size_ = file->mapping_->size;
    if (file_bytes && *file_bytes < file->size_) {
      return Status::Error(fmt::format("GGUF file '{}': {} bytes of its header, more than the whole file's {}", path,
                                       file->size_, *file_bytes));
    }
    file->file_bytes_ = file_bytes.value_or(file->size_);
    GgufParser parser(file.get());
    if (Status s = parser.Parse(); !s.ok()) return s;
    return file;
  }

  explicit GgufParser(GgufFile* file)
      : f_(*file), p_(file->map_), size_(static_cast<uint64_t>(file->size_)),
        file_bytes_(static_cast<uint64_t>(file->file_bytes_)) {}

  Status Parse() {
    if (Status s = ParseHeader(); !s.ok()) return s;
    f_.metadata_.reserve(std::min(n_kv_, kMaxReserve));
    for (uint64_t i = 0; i < n_kv_; ++i) {
      if (Status s = ParseKeyValue(i); !s.ok()) return s;
    }
    for (size_t i = 0; i < f_.metadata_.size(); ++i) {
      if (!f_.key_index_.emplace(f_.metadata_[i].key, i).second) {
        return Error(fmt::format("metadata key {} appears twice", Name(f_.metadata_[i].key)));
      }
    }
    f_.tensors_.reserve(std::min(n_tensors_, kMaxReserve));
    for (uint64_t i = 0; i < n_tensors_; ++i) {
      if (Status s = ParseTensorInfo(i); !s.ok()) return s;
    }
    for (size_t i = 0; i < f_.tensors_.size(); ++i) {
      if (!f_.tensor_index_.emplace(f_.tensors_[i].name, i).second) {
        return Error(fmt::format("tensor {} appears twice", Name(f_.tensors_[i].name)));
      }
    }
    return PlaceTensors();
  }

 private:
  Status Error(std::string_view detail) const {
    return Status::Error(fmt::format("GGUF file '{}': {}", f_.path_, detail));
  }
  bool Has(uint64_t n) const { return n <= size_ - pos_; }
  Status Truncated(uint64_t need, std::string_view what) const {
    return Error(fmt::format("truncated: {}{} needs {} bytes at offset {}, but the file has {} "
                             "bytes", context_, what, need, pos_, size_));
  }
  template <typename T>
  Status Read(T* out, std::string_view what) {
    if (!Has(sizeof(T))) return Truncated(sizeof(T), what);
    *out = Load<T>(p_ + pos_);
    pos_ += sizeof(T);
    return Status::Ok();
  }
  // A GGUF string: u64 length, then the bytes. `index` >= 0 names an array element on error.
  Status ReadString(std::string_view* out, std::string_view what, int64_t index = -1) {
    if (!Has(8)) {
      return Truncated(8, index < 0 ? fmt::format("the length of {}", what)
                                    : fmt::format("the length of {} {}", what, index));
    }
    const uint64_t n = Load<uint64_t>(p_ + pos_);
    pos_ += 8;
    if (!Has(n)) {
      return Truncated(n, index < 0 ? std::string(what) : fmt::format("{} {}", what, index));
    }
    *out = std::string_view(reinterpret_cast<const char*>(p_ + pos_), n);
    pos_ += n;
    return Status::Ok();
  }

  Status ParseHeader() {
    if (size_ < 4) {
      return Status::Error(
          fmt::format("'{}' is not a GGUF file: it has {} bytes", f_.path_, size_));
    }
    const uint32_t magic = Load<uint32_t>(p_);
    if (magic != kGgufMagic) {
      return Status::Error(fmt::format(
          "'{}' is not a GGUF file: it starts with {:02x} {:02x} {:02x} {:02x}, not \"GGUF\"",
          f_.path_, p_[0], p_[1], p_[2], p_[3]));
    }
    pos_ = 4;
    uint32_t version = 0;
    if (Status s = Read(&version, "the version"); !s.ok()) return s;
    if (version == 0x02000000u || version == 0x03000000u) {
      return Error("is a big-endian GGUF file; kvq reads little-endian GGUF only");
    }
    if (version < 2 || version > 3) {
      return Error(fmt::format("GGUF version {} is not supported (kvq reads versions 2 and 3)",
                               version));
    }
    f_.version_ = version;
    if (Status s = Read(&n_tensors_, "the tensor count"); !s.ok()) return s;
    if (Status s = Read(&n_kv_, "the metadata count"); !s.ok()) return s;
    const uint64_t left = size_ - pos_;
    if (n_kv_ > left / kMinKvBytes) {
      return Error(fmt::format("the header claims {} metadata pairs, but only {} bytes follow "
                               "(truncated or corrupt)",
                               n_kv_, left));
    }
    if (n_tensors_ > left / kMinTensorInfoBytes) {
      return Error(fmt::format("the header claims {} tensors, but only {} bytes follow "
                               "(truncated or corrupt)",
                               n_tensors_, left));
    }
    return Status::Ok();
  }

  Status ParseKeyValue(uint64_t i) {
    context_ = fmt::format("metadata pair {}: ", i);
    std::string_view key;
    if (Status s = ReadString(&key, "the key"); !s.ok()) return s;
    context_ = fmt::format("metadata key {}: ", Name(key));
    uint32_t type = 0;
    if (Status s = Read(&type, "the value type"); !s.ok()) return s;
    GgufKeyValue kv{std::string(key), GgufValue{}};
    if (Status s = ParseValue(type, 0, &kv.value); !s.ok()) return s;
    f_.metadata_.push_back(std::move(kv));
    return Status::Ok();
  }

  Status CheckValueType(uint32_t type, std::string_view what) const {
    if (type >= kValueTypeCount) {
      return Error(fmt::format("{}{} has unknown value type {}", context_, what, type));
    }
    return Status::Ok();
  }

  Status ParseValue(uint32_t type_id, int depth, GgufValue* out) {
    if (Status s = CheckValueType(type_id, "the value"); !s.ok()) return s;
    const auto type = static_cast<GgufValueType>(type_id);
    out->type = type;
    if (type == GgufValueType::kString) {
      std::string_view s;
      if (Status st = ReadString(&s, "the string"); !st.ok()) return st;
      out->data = s;
      return Status::Ok();
    }
    if (type == GgufValueType::kArray) return ParseArray(depth, out);
    const auto n = static_cast<uint64_t>(GgufScalarBytes(type));
    if (!Has(n)) return Truncated(n, fmt::format("the {} value", GgufValueTypeName(type)));
    if (type == GgufValueType::kBool && p_[pos_] > 1) {
      return Error(fmt::format("{}BOOL value is {}, not 0 or 1", context_, p_[pos_]));
    }
    DecodeScalar(type, p_ + pos_, out);
    pos_ += n;
    return Status::Ok();
  }

  Status ParseArray(int depth, GgufValue* out) {
    if (depth >= kMaxArrayDepth) {
      return Error(fmt::format("{}arrays are nested more than {} deep", context_, kMaxArrayDepth));
    }
    uint32_t element_type = 0;
    uint64_t count = 0;
    if (Status s = Read(&element_type, "the array element type"); !s.ok()) return s;
    if (Status s = CheckValueType(element_type, "the array element"); !s.ok()) return s;
    if (Status s = Read(&count, "the array length"); !s.ok()) return s;
    GgufArray a;
    a.element_type = static_cast<GgufValueType>(element_type);
    // Each element takes at least this many bytes: refuse an impossible count before reserving.
    const uint64_t min_bytes = a.element_type == GgufValueType::kString  ? 8
                               : a.element_type == GgufValueType::kArray ? 12
                                   : static_cast<uint64_t>(GgufScalarBytes(a.element_type));
    if (count > (size_ - pos_) / min_bytes) {
      return Error(fmt::format(
          "{}truncated or corrupt: an array of {} {} elements needs at least {} bytes each at "
          "offset {}, but the file has {} bytes",
          context_, count, GgufValueTypeName(a.element_type), min_bytes, pos_, size_));
    }
    a.size = static_cast<int64_t>(count);
    if (a.element_type == GgufValueType::kString) {
      a.strings.reserve(std::min(count, kMaxReserve));
      for (uint64_t i = 0; i < count; ++i) {
        if (Status s = ReadString(&a.strings.emplace_back(), "string element", i); !s.ok()) {
          return s;
        }
      }
    } else if (a.element_type == GgufValueType::kArray) {
      a.arrays.reserve(std::min(count, kMaxReserve));
      for (uint64_t i = 0; i < count; ++i) {
        if (Status s = ParseValue(element_type, depth + 1, &a.arrays.emplace_back()); !s.ok()) {
          return s;
        }
      }
    } else {
      a.raw = p_ + pos_;
      if (a.element_type == GgufValueType::kBool) {
        for (uint64_t i = 0; i < count; ++i) {
          if (a.raw[i] > 1) {
            return Error(fmt::format("{}BOOL element {} is {}, not 0 or 1", context_, i, a.raw[i]));
          }
        }
      }
      pos_ += count * min_bytes;
    }
    out->data = std::move(a);
    return Status::Ok();
  }

  Status ParseTensorInfo(uint64_t i) {
    context_ = fmt::format("tensor info {}: ", i);
    std::string_view name;
    if (Status s = ReadString(&name, "the tensor name"); !s.ok()) return s;
    GgufTensor t;
    t.name = std::string(name);
    context_ = fmt::format("tensor {}: ", Name(name));
    uint32_t n_dims = 0;
    if (Status s = Read(&n_dims, "the dimension count"); !s.ok()) return s;
    if (n_dims < 1 || n_dims > kMaxDims) {
      return Error(fmt::format("{}has {} dimensions (kvq reads 1 to {})", context_, n_dims,
                               kMaxDims));
    }
    t.n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      if (Status s = Read(&dim, fmt::format("dimension {}", d)); !s.ok()) return s;
      const auto sdim = static_cast<int64_t>(dim);  // ggml stores int64
      if (sdim <= 0) {
        return Error(fmt::format("{}dimension {} is {} (must be positive)", context_, d, sdim));
      }
      if (!CheckedMul(t.n_elements, sdim, &t.n_elements)) {
        return Error(fmt::format("{}the element count overflows 64 bits", context_));
      }
      t.dims.push_back(sdim);
    }
    uint32_t type = 0;
    if (Status s = Read(&type, "the type"); !s.ok()) return s;
    const GgmlTypeInfo* info = FindGgmlType(type);
    if (info == nullptr) return Error(fmt::format("{}has unknown ggml type id {}", context_, type));
    t.type = static_cast<GgmlType>(type);
    if (Status s = Read(&t.offset, "the data offset"); !s.ok()) return s;
    if (t.dims[0] % info->block_elements != 0) {
      return Error(fmt::format("{}row length {} is not a multiple of {}'s block of {} elements",
                               context_, t.dims[0], info->name, info->block_elements));
    }
    Result<int64_t> bytes = GgmlTypeBytes(t.type, t.n_elements);
    if (!bytes.ok()) return Error(fmt::format("{}{}", context_, bytes.status().message()));
    t.n_bytes = *bytes;
    f_.tensors_.push_back(std::move(t));
    return Status::Ok();
  }

  // Alignment, the data section, and every tensor's extent: aligned, inside the file, disjoint.
  Status PlaceTensors() {
    context_.clear();
    if (const GgufValue* v = f_.Find("general.alignment")) {
      uint32_t a = 0;
      if (!IntegerAs(*v, &a) || !std::has_single_bit(a) || a > (1u << 30)) {
        return Error(fmt::format("general.alignment is {} {}; it must be a power of two "
                                 "integer up to 2^30",
                                 GgufValueTypeName(v->type), FormatGgufValue(*v)));
      }
      f_.alignment_ = a;
    }
    const uint64_t align = f_.alignment_;
    const uint64_t data = (pos_ + align - 1) / align * align;
    f_.data_offset_ = static_cast<int64_t>(data);
    const uint64_t room = data <= file_bytes_ ? file_bytes_ - data : 0;
    const bool mapped = file_bytes_ == size_;  // else only the header is (OpenHeader)
    for (GgufTensor& t : f_.tensors_) {
      if (t.offset % align != 0) {
        return Error(fmt::format("tensor {} has offset {}, which is not a multiple of the "
                                 "alignment {}", Name(t.name), t.offset, align));
      }
      if (t.offset > room || static_cast<uint64_t>(t.n_bytes) > room - t.offset) {
        return Error(fmt::format("tensor {} (offset {}, {} bytes) extends past the end of the "
                                 "file ({} bytes; data section at {})",
                                 Name(t.name), t.offset, t.n_bytes, file_bytes_, data));
      }
      t.data = mapped ? p_ + data + t.offset : nullptr;
    }
    std::vector<size_t> order(f_.tensors_.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return f_.tensors_[a].offset < f_.tensors_[b].offset;
    });
    for (size_t k = 1; k < order.size(); ++k) {
      const GgufTensor& prev = f_.tensors_[order[k - 1]];
      const GgufTensor& next = f_.tensors_[order[k]];
      if (prev.offset + static_cast<uint64_t>(prev.n_bytes) > next.offset) {
        return Error(fmt::format("tensors {} (offset {}, {} bytes) and {} (offset {}) overlap",
                                 Name(prev.name), prev.offset, prev.n_bytes, Name(next.name),
                                 next.offset));
      }
    }
    return Status::Ok();
  }

  GgufFile& f_;
  const uint8_t* p_;
  uint64_t size_;        // the bytes mapped
  uint64_t file_bytes_;  // the whole file's (tensor extents)
  uint64_t pos_ = 0;
  uint64_t n_tensors_ = 0;
  uint64_t n_kv_ = 0;
  std::string context_;  // "metadata key "x": " etc.: what is being read, for messages
};

// ---- the file ----

Result<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  return GgufParser::MapAndParse(path, std::nullopt);
}

Result<std::unique_ptr<GgufFile>> GgufFile::OpenHeader(const std::string& path, int64_t file_bytes) {
  return GgufParser::MapAndParse(path, file_bytes);
}

Result<int64_t> GgufFile::HeaderBytes(std::span<const uint8_t> prefix, int64_t file_bytes, const std::string& name) {
  if (static_cast<int64_t>(prefix.size()) > file_bytes) {
    return Status::Error(fmt::format("GGUF file '{}': a prefix of {} bytes of a {}-byte file", name, prefix.size(),
                                     file_bytes));
  }
  GgufFile file;
  file.path_ = name;
  file.map_ = prefix.data();
  file.size_ = static_cast<int64_t>(prefix.size());
  file.file_bytes_ = file_bytes;
  GgufParser parser(&file);
  if (Status s = parser.Parse(); !s.ok()) {
    // Any failure of a part of the file may be the header running past it: read more first.
    if (file.size_ < file_bytes) return int64_t{0};
    return s;
  }
  return file.data_offset_;
}

GgufFile::~GgufFile() = default;

}  // namespace kvq
