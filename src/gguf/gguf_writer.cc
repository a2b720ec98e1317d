// GGUF writer: encodes metadata values as they will appear in the file, checks tensors against
// their shapes when they are added, and serializes a version-3 file with every tensor's data
// aligned (and padded after) to the file's alignment, as ggml lays it out. Serialize and Write
// share one emitter that hands the bytes to a sink in order: the header, then each tensor's data
// (streamed tensors chunk by chunk), so the file never has to exist in memory.
#include "gguf/gguf_writer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <variant>

#include "kvq/units.h"

namespace kvq {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;
constexpr uint32_t kVersion = 3;

template <typename T>
void Append(std::vector<uint8_t>* out, T v) {
  const size_t at = out->size();
  out->resize(at + sizeof(T));
  std::memcpy(out->data() + at, &v, sizeof(T));
}

void AppendString(std::vector<uint8_t>* out, std::string_view s) {
  Append<uint64_t>(out, s.size());
  out->insert(out->end(), s.begin(), s.end());
}

void Pad(std::vector<uint8_t>* out, uint64_t alignment) {
  out->resize((out->size() + alignment - 1) / alignment * alignment, 0);
}

int64_t RoundUp(int64_t n, int64_t alignment) { return (n + alignment - 1) / alignment * alignment; }

// Streamed tensors are produced in chunks of about this size: large enough that a source's
// per-call cost (a thread-pool dispatch) vanishes, small enough to stay in cache-friendly memory.
constexpr int64_t kStreamChunkBytes = 8 << 20;

// A scalar of GgufValue's widened representation, narrowed back to its stored type.
template <typename T>
void AppendNarrowed(std::vector<uint8_t>* out, const GgufValue& v) {
  if (const auto* u = std::get_if<uint64_t>(&v.data)) {
    Append(out, static_cast<T>(*u));
  } else if (const auto* i = std::get_if<int64_t>(&v.data)) {
    Append(out, static_cast<T>(*i));
  } else if (const auto* d = std::get_if<double>(&v.data)) {
    Append(out, static_cast<T>(*d));  // FLOAT32 was widened exactly, so this is exact
  } else if (const auto* b = std::get_if<bool>(&v.data)) {
    Append<uint8_t>(out, *b ? 1 : 0);
  }
}

// The bytes that follow a value's type tag in the file.
void AppendValueBytes(std::vector<uint8_t>* out, const GgufValue& v) {
  switch (v.type) {
    case GgufValueType::kUint8: AppendNarrowed<uint8_t>(out, v); break;
    case GgufValueType::kInt8: AppendNarrowed<int8_t>(out, v); break;
    case GgufValueType::kUint16: AppendNarrowed<uint16_t>(out, v); break;
    case GgufValueType::kInt16: AppendNarrowed<int16_t>(out, v); break;
    case GgufValueType::kUint32: AppendNarrowed<uint32_t>(out, v); break;
    case GgufValueType::kInt32: AppendNarrowed<int32_t>(out, v); break;
    case GgufValueType::kUint64: AppendNarrowed<uint64_t>(out, v); break;
    case GgufValueType::kInt64: AppendNarrowed<int64_t>(out, v); break;
    case GgufValueType::kFloat32: AppendNarrowed<float>(out, v); break;
    case GgufValueType::kFloat64: AppendNarrowed<double>(out, v); break;
    case GgufValueType::kBool: AppendNarrowed<uint8_t>(out, v); break;
    case GgufValueType::kString: AppendString(out, std::get<std::string_view>(v.data)); break;
    case GgufValueType::kArray: {
      const GgufArray& a = std::get<GgufArray>(v.data);
      Append<uint32_t>(out, static_cast<uint32_t>(a.element_type));
      Append<uint64_t>(out, static_cast<uint64_t>(a.size));
      if (a.element_type == GgufValueType::kString) {
        for (std::string_view s : a.strings) AppendString(out, s);
      } else if (a.element_type == GgufValueType::kArray) {
        for (const GgufValue& e : a.arrays) AppendValueBytes(out, e);
      } else if (a.size > 0) {
        // Numeric elements are kept packed as stored: copy them as they are.
        const auto n = static_cast<size_t>(a.size * GgufScalarBytes(a.element_type));
        out->insert(out->end(), a.raw, a.raw + n);
      }
      break;
    }
  }
}

}  // namespace

namespace gguf_internal {
GgufEncoded EncodeScalarBytes(GgufValueType type, const void* value, size_t n) {
  GgufEncoded e;
  e.type = type;
  e.bytes.resize(n);
  std::memcpy(e.bytes.data(), value, n);
  return e;
}
}  // namespace gguf_internal

GgufEncoded GgufEncodeString(std::string_view value) {
  GgufEncoded e;
  e.type = GgufValueType::kString;
  AppendString(&e.bytes, value);
  return e;
}

GgufEncoded GgufEncodeValue(const GgufValue& value) {
  GgufEncoded e;
  e.type = value.type;
  AppendValueBytes(&e.bytes, value);
  return e;
}

GgufEncoded GgufEncodeArray(GgufValueType element_type, const std::vector<GgufEncoded>& elements) {
  GgufEncoded e;
  e.type = GgufValueType::kArray;
  Append<uint32_t>(&e.bytes, static_cast<uint32_t>(element_type));
  Append<uint64_t>(&e.bytes, elements.size());
  for (size_t i = 0; i < elements.size(); ++i) {
    const GgufEncoded& el = elements[i];
    if (!el.error.empty()) {
      e.error = el.error;
      return e;
    }
    if (el.type != element_type) {
      e.error = fmt::format("array element {} is {}, but the array holds {}", i,
                            GgufValueTypeName(el.type), GgufValueTypeName(element_type));
      return e;
    }
    e.bytes.insert(e.bytes.end(), el.bytes.begin(), el.bytes.end());
  }
  return e;
}

Status GgufWriter::Set(std::string key, GgufEncoded value) {
  if (!value.error.empty()) {
    return Status::Error(fmt::format("GGUF writer: metadata key '{}': {}", key, value.error));
  }
  for (const auto& [k, v] : metadata_) {
    if (k == key) {
      return Status::Error(fmt::format("GGUF writer: metadata key '{}' set twice", key));
    }
  }
  if (key == "general.alignment") {
    uint32_t a = 0;
    if (value.type == GgufValueType::kUint32) std::memcpy(&a, value.bytes.data(), 4);
    if (!std::has_single_bit(a) || a > (1u << 30)) {
      return Status::Error("GGUF writer: general.alignment must be a UINT32 power of two up to "
                           "2^30");
    }
    alignment_ = a;
  }
  metadata_.emplace_back(std::move(key), std::move(value));
  return Status::Ok();
}

Status GgufWriter::SetString(std::string key, std::string_view value) {
  return Set(std::move(key), GgufEncodeString(value));
}
Status GgufWriter::SetU32(std::string key, uint32_t value) {
  return Set(std::move(key), GgufEncode(value));
}
Status GgufWriter::SetI32(std::string key, int32_t value) {
  return Set(std::move(key), GgufEncode(value));
}
Status GgufWriter::SetU64(std::string key, uint64_t value) {
  return Set(std::move(key), GgufEncode(value));
}
Status GgufWriter::SetF32(std::string key, float value) {
  return Set(std::move(key), GgufEncode(value));
}
Status GgufWriter::SetBool(std::string key, bool value) {
  return Set(std::move(key), GgufEncode(value));
}

Status GgufWriter::SetStringArray(std::string key, const std::vector<std::string>& values) {
  // Encoded directly: vocabularies hold 10^5 strings.
  GgufEncoded e;
  e.type = GgufValueType::kArray;
  Append<uint32_t>(&e.bytes, static_cast<uint32_t>(GgufValueType::kString));
  Append<uint64_t>(&e.bytes, values.size());
  for (const std::string& s : values) AppendString(&e.bytes, s);
  return Set(std::move(key), std::move(e));
}

Status GgufWriter::SetF32Array(std::string key, const std::vector<float>& values) {
  GgufEncoded e;
  e.type = GgufValueType::kArray;
  Append<uint32_t>(&e.bytes, static_cast<uint32_t>(GgufValueType::kFloat32));
  Append<uint64_t>(&e.bytes, values.size());
  for (float v : values) Append(&e.bytes, v);
  return Set(std::move(key), std::move(e));
}

Status GgufWriter::SetI32Array(std::string key, const std::vector<int32_t>& values) {
  GgufEncoded e;
  e.type = GgufValueType::kArray;
  Append<uint32_t>(&e.bytes, static_cast<uint32_t>(GgufValueType::kInt32));
  Append<uint64_t>(&e.bytes, values.size());
  for (int32_t v : values) Append(&e.bytes, v);
  return Set(std::move(key), std::move(e));
}

Result<int64_t> GgufWriter::CheckTensor(const std::string& name, GgmlType type,
                                        const std::vector<int64_t>& dims) const {
  auto fail = [&](std::string_view why) {
    return Status::Error(fmt::format("GGUF writer: tensor '{}': {}", name, why));
  };
  for (const Tensor& t : tensors_) {
    if (t.name == name) return fail("added twice");
  }
  const GgmlTypeInfo* info = FindGgmlType(static_cast<uint32_t>(type));
  if (info == nullptr) {
    return fail(fmt::format("unknown ggml type id {}", static_cast<uint32_t>(type)));
  }
  if (dims.empty() || dims.size() > 4) return fail(fmt::format("{} dims (1 to 4)", dims.size()));
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d <= 0) return fail(fmt::format("dimension {} is not positive", d));
    if (!CheckedMul(n, d, &n)) return fail("the element count overflows 64 bits");
  }
  if (dims[0] % info->block_elements != 0) {
    return fail(fmt::format("row length {} is not a whole number of {} blocks of {}", dims[0],
                            info->name, info->block_elements));
  }
  Result<int64_t> want = GgmlTypeBytes(type, n);
  if (!want.ok()) return fail(want.status().message());
  // Room for the padding after it, so every offset and FileBytes stay far from overflow.
  if (*want > (int64_t{1} << 60)) return fail(fmt::format("{} bytes is too large", *want));
  return *want;
}

Status GgufWriter::AddTensor(std::string name, GgmlType type, std::vector<int64_t> dims,
                             std::vector<uint8_t> bytes) {
  Result<int64_t> want = CheckTensor(name, type, dims);
  if (!want.ok()) return want.status();
  if (static_cast<int64_t>(bytes.size()) != *want) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;  // checked above
    return Status::Error(fmt::format("GGUF writer: tensor '{}': {} bytes given, {} elements of {} "
                                     "take {}", name, bytes.size(), n, GgmlTypeName(type), *want));
  }
  tensors_.push_back(Tensor{std::move(name), type, std::move(dims), *want, std::move(bytes), {}});
  return Status::Ok();
}

Status GgufWriter::AddStreamedTensor(std::string name, GgmlType type, std::vector<int64_t> dims,
                                     GgufRowSource source) {
  Result<int64_t> want = CheckTensor(name, type, dims);
  if (!want.ok()) return want.status();
  if (!source) {
    return Status::Error(fmt::format("GGUF writer: tensor '{}': no row source given", name));
  }
  tensors_.push_back(Tensor{std::move(name), type, std::move(dims), *want, {}, std::move(source)});
  return Status::Ok();
}

std::vector<uint8_t> GgufWriter::Header() const {
  std::vector<uint8_t> out;
  Append(&out, kGgufMagic);
  Append(&out, kVersion);
  Append<uint64_t>(&out, tensors_.size());
  Append<uint64_t>(&out, metadata_.size());
  for (const auto& [key, value] : metadata_) {
    AppendString(&out, key);
    Append<uint32_t>(&out, static_cast<uint32_t>(value.type));
    out.insert(out.end(), value.bytes.begin(), value.bytes.end());
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    AppendString(&out, t.name);
    Append<uint32_t>(&out, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) Append<uint64_t>(&out, static_cast<uint64_t>(d));
    Append<uint32_t>(&out, static_cast<uint32_t>(t.type));
    Append<uint64_t>(&out, offset);
    offset += static_cast<uint64_t>(RoundUp(t.n_bytes, alignment_));
  }
  if (!tensors_.empty()) Pad(&out, alignment_);
  return out;
}

int64_t GgufWriter::FileBytes() const {
  int64_t bytes = static_cast<int64_t>(Header().size());
  for (const Tensor& t : tensors_) bytes += RoundUp(t.n_bytes, alignment_);
  return bytes;
}

Status GgufWriter::Emit(const Sink& sink, const GgufWriteProgress& progress) const {
  const std::vector<uint8_t> header = Header();
  int64_t total = static_cast<int64_t>(header.size());
  for (const Tensor& t : tensors_) total += RoundUp(t.n_bytes, alignment_);
  if (Status s = sink(header.data(), header.size()); !s.ok()) return s;
  int64_t written = static_cast<int64_t>(header.size());
  const std::vector<uint8_t> zeros(alignment_, 0);
  std::vector<uint8_t> chunk;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    if (t.source) {
      const int64_t n_rows = t.n_bytes / *GgmlTypeBytes(t.type, t.dims[0]);
      const int64_t row_bytes = t.n_bytes / n_rows;
      const int64_t chunk_rows = std::max<int64_t>(1, kStreamChunkBytes / row_bytes);
      chunk.resize(static_cast<size_t>(std::min(n_rows, chunk_rows) * row_bytes));
      for (int64_t row = 0; row < n_rows; row += chunk_rows) {
        const int64_t rows = std::min(chunk_rows, n_rows - row);
        if (Status s = t.source(row, rows, chunk.data()); !s.ok()) {
          return Status::Error(fmt::format("tensor '{}': {}", t.name, s.message()));
        }
        if (Status s = sink(chunk.data(), static_cast<size_t>(rows * row_bytes)); !s.ok()) return s;
      }
    } else if (Status s = sink(t.bytes.data(), t.bytes.size()); !s.ok()) {
      return s;
    }
    const int64_t padding = RoundUp(t.n_bytes, alignment_) - t.n_bytes;
    if (Status s = sink(zeros.data(), static_cast<size_t>(padding)); !s.ok()) return s;
    written += t.n_bytes + padding;
    if (progress) progress(i, written, total);
  }
  return Status::Ok();
}

std::vector<uint8_t> GgufWriter::Serialize() const {
  std::vector<uint8_t> out;
  const Status s = Emit(
      [&out](const uint8_t* data, size_t n) {
        out.insert(out.end(), data, data + n);
        return Status::Ok();
      },
      {});
  if (!s.ok()) return {};
  return out;
}

Status GgufWriter::Write(const std::string& path, const GgufWriteProgress& progress) const {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = fmt::format("{}.tmp-{}-{}", path, ::getpid(), counter.fetch_add(1));
  auto fail = [&](std::string_view what, int err) {
    std::remove(tmp.c_str());
    return Status::Error(fmt::format("cannot write GGUF file '{}': {} '{}': {}", path, what, tmp,
                                     std::strerror(err)));
  };
  std::FILE* f = std::fopen(tmp.c_str(), "wbx");
  if (f == nullptr) return fail("cannot create", errno);
  bool write_failed = false;
  int write_errno = 0;
  const Status emitted = Emit(
      [&](const uint8_t* data, size_t n) {
        if (n > 0 && std::fwrite(data, 1, n, f) != n) {
          write_failed = true;
          write_errno = errno != 0 ? errno : EIO;
          return Status::Error("write failed");
        }
        return Status::Ok();
      },
      progress);
  if (!emitted.ok()) {
    std::fclose(f);
    if (write_failed) return fail("writing", write_errno);
    std::remove(tmp.c_str());
    return Status::Error(fmt::format("cannot write GGUF file '{}': {}", path, emitted.message()));
  }
  if (std::fflush(f) != 0 || ::fsync(::fileno(f)) != 0) {
    const int err = errno;
    std::fclose(f);
    return fail("flushing", err);
  }
  if (std::fclose(f) != 0) return fail("closing", errno);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return fail("renaming into place", errno);
  return Status::Ok();
}

}  // namespace kvq
