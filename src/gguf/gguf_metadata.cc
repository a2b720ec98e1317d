// The ggml type table and the GGUF value types (names, sizes, printing), and GgufFile's typed
// metadata getters: each checks the stored type and range and names the key, the file, and what
// was expected when they do not fit.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <variant>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_scalar.h"
#include "kvq/units.h"

namespace kvq {
namespace {

using gguf_internal::DecodeScalar;
using gguf_internal::IntegerAs;
using gguf_internal::IsIntegerType;
using gguf_internal::kValueTypeCount;
using gguf_internal::Quote;

// Indexed by ggml type id. Block sizes are ggml's `blck_size` and `type_size`.
// clang-format off
constexpr GgmlTypeInfo kTypes[] = {
    {"F32", 1, 4},        {"F16", 1, 2},          {"Q4_0", 32, 18},
    {"Q4_1", 32, 20},    {nullptr, 0, 0},       {nullptr, 0, 0},
    {"Q5_0", 32, 22},    {"Q5_1", 32, 24},      {"Q8_0", 32, 34},
    {"Q8_1", 32, 36},    {"Q2_K", 256, 84},     {"Q3_K", 256, 110},
    {"Q4_K", 256, 144},  {"Q5_K", 256, 176},    {"Q6_K", 256, 210},
    {"Q8_K", 256, 292},  {"IQ2_XXS", 256, 66},  {"IQ2_XS", 256, 74},
    {"IQ3_XXS", 256, 98}, {"IQ1_S", 256, 50},   {"IQ4_NL", 32, 18},
    {"IQ3_S", 256, 110}, {"IQ2_S", 256, 82},    {"IQ4_XS", 256, 136},
    {"I8", 1, 1},        {"I16", 1, 2},         {"I32", 1, 4},
    {"I64", 1, 8},       {"F64", 1, 8},         {"IQ1_M", 256, 56},
    {"BF16", 1, 2},       {nullptr, 0, 0},       {nullptr, 0, 0},
    {nullptr, 0, 0},     {"TQ1_0", 256, 54},    {"TQ2_0", 256, 66},
    {nullptr, 0, 0},     {nullptr, 0, 0},       {nullptr, 0, 0},
    {"MXFP4", 32, 17},   {nullptr, 0, 0},
    // PrismML's fork (Bonsai): Q1_0 = f16 d + 128 sign bits; Q2_0 = f16 d + 64 2-bit codes.
    {"Q1_0", 128, 18},   {"Q2_0", 64, 18},
};
// clang-format on
constexpr uint32_t kTypeCount = sizeof(kTypes) / sizeof(kTypes[0]);

constexpr const char* kValueTypeNames[] = {"UINT8",   "INT8",  "UINT16", "INT16", "UINT32",
                                           "INT32",   "FLOAT32", "BOOL", "STRING", "ARRAY",
                                           "UINT64",  "INT64", "FLOAT64"};

}  // namespace

const GgmlTypeInfo* FindGgmlType(uint32_t id) {
  return id < kTypeCount && kTypes[id].name != nullptr ? &kTypes[id] : nullptr;
}
const char* GgmlTypeName(GgmlType type) {
  const GgmlTypeInfo* info = FindGgmlType(static_cast<uint32_t>(type));
  return info != nullptr ? info->name : "unknown";
}

Result<int64_t> GgmlTypeBytes(GgmlType type, int64_t n_elements) {
  const GgmlTypeInfo* info = FindGgmlType(static_cast<uint32_t>(type));
  if (info == nullptr) {
    return Status::Error(fmt::format("unknown ggml type id {}", static_cast<uint32_t>(type)));
  }
  if (n_elements < 0 || n_elements % info->block_elements != 0) {
    return Status::Error(fmt::format("{} elements of {} are not a whole number of blocks of {}",
                                     n_elements, info->name, info->block_elements));
  }
  int64_t bytes = 0;
  if (!CheckedMul(n_elements / info->block_elements, info->block_bytes, &bytes)) {
    return Status::Error(fmt::format("{} elements of {} overflow a 64-bit byte count", n_elements,
                                     info->name));
  }
  return bytes;
}

const char* GgufValueTypeName(GgufValueType type) {
  const auto id = static_cast<uint32_t>(type);
  return id < kValueTypeCount ? kValueTypeNames[id] : "unknown";
}

int64_t GgufScalarBytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8: case GgufValueType::kInt8: case GgufValueType::kBool: return 1;
    case GgufValueType::kUint16: case GgufValueType::kInt16: return 2;
    case GgufValueType::kUint32: case GgufValueType::kInt32: case GgufValueType::kFloat32: return 4;
    case GgufValueType::kUint64: case GgufValueType::kInt64: case GgufValueType::kFloat64: return 8;
    default: return 0;
  }
}

double GgufArray::NumberAt(int64_t i) const {
  GgufValue v;
  DecodeScalar(element_type, raw + i * GgufScalarBytes(element_type), &v);
  return std::visit(
      [](const auto& x) -> double {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_arithmetic_v<T>) return static_cast<double>(x);
        return 0.0;
      },
      v.data);
}

std::string FormatGgufValue(const GgufValue& value, int max_elements) {
  switch (value.type) {
    case GgufValueType::kString: return Quote(std::get<std::string_view>(value.data));
    case GgufValueType::kBool: return std::get<bool>(value.data) ? "true" : "false";
    case GgufValueType::kFloat32: case GgufValueType::kFloat64:
      return fmt::format("{}", std::get<double>(value.data));
    case GgufValueType::kArray: break;
    default:
      if (const auto* u = std::get_if<uint64_t>(&value.data)) return fmt::format("{}", *u);
      return fmt::format("{}", std::get<int64_t>(value.data));
  }
  const auto& a = std::get<GgufArray>(value.data);
  std::string out = fmt::format("[{} x {}", GgufValueTypeName(a.element_type), a.size);
  const int64_t shown = std::min<int64_t>(a.size, std::max(max_elements, 0));
  for (int64_t i = 0; i < shown; ++i) {
    out += i == 0 ? ": " : ", ";
    if (a.element_type == GgufValueType::kString) {
      out += Quote(a.strings[i]);
    } else if (a.element_type == GgufValueType::kArray) {
      out += FormatGgufValue(a.arrays[i], max_elements);
    } else {
      GgufValue element;
      DecodeScalar(a.element_type, a.raw + i * GgufScalarBytes(a.element_type), &element);
      out += FormatGgufValue(element, max_elements);
    }
  }
  return out + (shown < a.size ? ", ...]" : "]");
}

// ---- typed metadata ----

bool GgufFile::Has(std::string_view key) const { return Find(key) != nullptr; }

const GgufValue* GgufFile::Find(std::string_view key) const {
  const auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &metadata_[it->second].value;
}

Result<const GgufValue*> GgufFile::Lookup(std::string_view key) const {
  if (const GgufValue* v = Find(key)) return v;
  return Status::Error(fmt::format("GGUF file '{}' has no metadata key '{}'", path_, key));
}

Status GgufFile::TypeError(std::string_view key, const GgufValue& value,
                           std::string_view wanted) const {
  std::string type = GgufValueTypeName(value.type);
  if (value.type == GgufValueType::kArray) {
    type += fmt::format(" of {}", GgufValueTypeName(std::get<GgufArray>(value.data).element_type));
  }
  return Status::Error(fmt::format("GGUF file '{}': metadata key '{}' is {}, expected {}", path_,
                                   key, type, wanted));
}

template <typename T>
Result<T> GgufFile::GetInteger(std::string_view key, const char* wanted) const {
  Result<const GgufValue*> v = Lookup(key);
  if (!v.ok()) return v.status();
  const GgufValue& value = **v;
  if (!IsIntegerType(value.type)) return TypeError(key, value, wanted);
  T out{};
  if (!IntegerAs(value, &out)) {
    return Status::Error(fmt::format("GGUF file '{}': metadata key '{}' is {} {}, which does not "
                                     "fit {}", path_, key, GgufValueTypeName(value.type),
                                     FormatGgufValue(value), wanted));
  }
  return out;
}

Result<uint32_t> GgufFile::GetU32(std::string_view key) const {
  return GetInteger<uint32_t>(key, "UINT32");
}
Result<int32_t> GgufFile::GetI32(std::string_view key) const {
  return GetInteger<int32_t>(key, "INT32");
}
Result<uint64_t> GgufFile::GetU64(std::string_view key) const {
  return GetInteger<uint64_t>(key, "UINT64");
}
Result<int64_t> GgufFile::GetI64(std::string_view key) const {
  return GetInteger<int64_t>(key, "INT64");
}

Result<std::string> GgufFile::GetString(std::string_view key) const {
  Result<const GgufValue*> v = Lookup(key);
  if (!v.ok()) return v.status();
  if ((*v)->type != GgufValueType::kString) return TypeError(key, **v, "STRING");
  return std::string(std::get<std::string_view>((*v)->data));
}

Result<float> GgufFile::GetF32(std::string_view key) const {
  Result<const GgufValue*> v = Lookup(key);
  if (!v.ok()) return v.status();
  const GgufValue& value = **v;
  if (const auto* d = std::get_if<double>(&value.data)) return static_cast<float>(*d);
  if (!IsIntegerType(value.type)) return TypeError(key, value, "FLOAT32");
  if (const auto* u = std::get_if<uint64_t>(&value.data)) return static_cast<float>(*u);
  return static_cast<float>(std::get<int64_t>(value.data));
}

Result<bool> GgufFile::GetBool(std::string_view key) const {
  Result<const GgufValue*> v = Lookup(key);
  if (!v.ok()) return v.status();
  if ((*v)->type != GgufValueType::kBool) return TypeError(key, **v, "BOOL");
  return std::get<bool>((*v)->data);
}

Result<const GgufArray*> GgufFile::GetArray(std::string_view key) const {
  Result<const GgufValue*> v = Lookup(key);
  if (!v.ok()) return v.status();
  if ((*v)->type != GgufValueType::kArray) return TypeError(key, **v, "ARRAY");
  return &std::get<GgufArray>((*v)->data);
}

Result<std::span<const std::string_view>> GgufFile::GetStringArray(std::string_view key) const {
  Result<const GgufArray*> a = GetArray(key);
  if (!a.ok()) return a.status();
  if ((*a)->element_type != GgufValueType::kString) {
    return TypeError(key, *Find(key), "ARRAY of STRING");
  }
  return std::span<const std::string_view>((*a)->strings);
}

Result<std::vector<float>> GgufFile::GetF32Array(std::string_view key) const {
  Result<const GgufArray*> a = GetArray(key);
  if (!a.ok()) return a.status();
  if ((*a)->element_type != GgufValueType::kFloat32) {
    return TypeError(key, *Find(key), "ARRAY of FLOAT32");
  }
  std::vector<float> out(static_cast<size_t>((*a)->size));
  if (!out.empty()) std::memcpy(out.data(), (*a)->raw, out.size() * sizeof(float));
  return out;
}

Result<std::vector<int32_t>> GgufFile::GetI32Array(std::string_view key) const {
  Result<const GgufArray*> a = GetArray(key);
  if (!a.ok()) return a.status();
  const GgufArray& arr = **a;
  if (!IsIntegerType(arr.element_type)) return TypeError(key, *Find(key), "ARRAY of INT32");
  std::vector<int32_t> out(static_cast<size_t>(arr.size));
  for (int64_t i = 0; i < arr.size; ++i) {
    GgufValue e;
    DecodeScalar(arr.element_type, arr.raw + i * GgufScalarBytes(arr.element_type), &e);
    if (!IntegerAs(e, &out[i])) {
      return Status::Error(fmt::format("GGUF file '{}': metadata key '{}' element {} is {}, "
                                       "which does not fit INT32", path_, key, i,
                                       FormatGgufValue(e)));
    }
  }
  return out;
}

Result<const GgufTensor*> GgufFile::FindTensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  if (it == tensor_index_.end()) {
    return Status::Error(fmt::format("GGUF file '{}' has no tensor '{}'", path_, name));
  }
  return &tensors_[it->second];
}
}  // namespace kvq
