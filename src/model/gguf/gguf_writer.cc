// GGUF writer: encodes metadata values as they will appear in the file, checks tensors against
// their shapes when they are added, and serializes a version-3 file with every tensor's data
// aligned (and padded after) to the file's alignment, as ggml lays it out.
#include "model/gguf/gguf_writer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

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

Status GgufWriter::AddTensor(std::string name, GgmlType type, std::vector<int64_t> dims,
                             std::vector<uint8_t> bytes) {
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
  if (static_cast<int64_t>(bytes.size()) != *want) {
    return fail(fmt::format("{} bytes given, {} elements of {} take {}", bytes.size(), n,
                            GgmlTypeName(type), *want));
  }
  tensors_.push_back(Tensor{std::move(name), type, std::move(dims), std::move(bytes)});
  return Status::Ok();
}

std::vector<uint8_t> GgufWriter::Serialize() const {
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
    offset += (t.bytes.size() + alignment_ - 1) / alignment_ * alignment_;
  }
  if (!tensors_.empty()) Pad(&out, alignment_);
  for (const Tensor& t : tensors_) {
    out.insert(out.end(), t.bytes.begin(), t.bytes.end());
    Pad(&out, alignment_);
  }
  return out;
}

Status GgufWriter::Write(const std::string& path) const {
  const std::vector<uint8_t> b = Serialize();
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = fmt::format("{}.tmp-{}-{}", path, ::getpid(), counter.fetch_add(1));
  auto fail = [&](std::string_view what, int err) {
    std::remove(tmp.c_str());
    return Status::Error(fmt::format("cannot write GGUF file '{}': {} '{}': {}", path, what, tmp,
                                     std::strerror(err)));
  };
  std::FILE* f = std::fopen(tmp.c_str(), "wbx");
  if (f == nullptr) return fail("cannot create", errno);
  if (!b.empty() && std::fwrite(b.data(), 1, b.size(), f) != b.size()) {
    const int err = errno;
    std::fclose(f);
    return fail("writing", err);
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
