// Internal to src/gguf/: the scalar decoding and message quoting that the parser (gguf_reader.cc) and
// the typed metadata getters (gguf_metadata.cc) share. Not part of any public header.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "gguf/gguf_reader.h"

namespace kvq::gguf_internal {

/// GGUF's value types are ids 0..kValueTypeCount - 1 (GgufValueType).
inline constexpr uint32_t kValueTypeCount = 13;

inline bool IsIntegerType(GgufValueType t) {
  return GgufScalarBytes(t) > 0 && t != GgufValueType::kFloat32 &&
         t != GgufValueType::kFloat64 && t != GgufValueType::kBool;
}

// An integer value as T, when it is one and fits.
template <typename T>
inline bool IntegerAs(const GgufValue& v, T* out) {
  if (!IsIntegerType(v.type)) return false;
  const auto* u = std::get_if<uint64_t>(&v.data);
  const auto* s = std::get_if<int64_t>(&v.data);
  if (u != nullptr ? !std::in_range<T>(*u) : !std::in_range<T>(*s)) return false;
  *out = u != nullptr ? static_cast<T>(*u) : static_cast<T>(*s);
  return true;
}

template <typename T>
inline T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// A scalar of `type` at `p` (caller checked the bytes), in GgufValue's widened representation.
inline void DecodeScalar(GgufValueType type, const uint8_t* p, GgufValue* out) {
  out->type = type;
  switch (type) {
    case GgufValueType::kUint8: out->data = uint64_t{Load<uint8_t>(p)}; break;
    case GgufValueType::kInt8: out->data = int64_t{Load<int8_t>(p)}; break;
    case GgufValueType::kUint16: out->data = uint64_t{Load<uint16_t>(p)}; break;
    case GgufValueType::kInt16: out->data = int64_t{Load<int16_t>(p)}; break;
    case GgufValueType::kUint32: out->data = uint64_t{Load<uint32_t>(p)}; break;
    case GgufValueType::kInt32: out->data = int64_t{Load<int32_t>(p)}; break;
    case GgufValueType::kUint64: out->data = Load<uint64_t>(p); break;
    case GgufValueType::kInt64: out->data = Load<int64_t>(p); break;
    case GgufValueType::kFloat32: out->data = double{Load<float>(p)}; break;
    case GgufValueType::kFloat64: out->data = Load<double>(p); break;
    case GgufValueType::kBool: out->data = Load<uint8_t>(p) != 0; break;
    default: break;
  }
}

// A string for a message: quoted, at most `max` bytes, control and non-ASCII bytes as \xNN.
inline std::string Quote(std::string_view s, size_t max = 64, char quote = '"') {
  std::string out(1, quote);
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == static_cast<unsigned char>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7F) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > max) out += "...";
  return out + quote;
}

// A key or tensor name from the file, for a message: 'name', escaped, at most 128 bytes.
inline std::string Name(std::string_view s) { return Quote(s, 128, '\''); }

}  // namespace kvq::gguf_internal
