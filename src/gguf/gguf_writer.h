// A small GGUF (version 3) writer: metadata of every value type (nested arrays included) and
// tensors laid out with alignment padding the way ggml does. A tensor is given either as
// ready-made bytes (tests) or as a row source called while the file is written, so `kvq synth`
// can write a multi-GB model holding one chunk of it in memory at a time. Files are written to a
// temporary name and renamed into place, so a reader never sees half a file.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kvq/status.h"
#include "gguf/gguf_reader.h"

namespace kvq {

/// One metadata value, encoded: its type and its bytes as they follow the type tag in the file.
/// `error` is set when building it failed (an array with an element of another type).
struct GgufEncoded {
  GgufValueType type = GgufValueType::kUint8;
  std::vector<uint8_t> bytes;
  std::string error;
};

namespace gguf_internal {
template <typename T>
constexpr GgufValueType ScalarType() {
  static_assert(std::is_same_v<T, uint8_t> || std::is_same_v<T, int8_t> ||
                    std::is_same_v<T, uint16_t> || std::is_same_v<T, int16_t> ||
                    std::is_same_v<T, uint32_t> || std::is_same_v<T, int32_t> ||
                    std::is_same_v<T, uint64_t> || std::is_same_v<T, int64_t> ||
                    std::is_same_v<T, float> || std::is_same_v<T, double> ||
                    std::is_same_v<T, bool>,
                "GGUF scalars are (u)int8/16/32/64_t, float, double or bool");
  if constexpr (std::is_same_v<T, uint8_t>) return GgufValueType::kUint8;
  if constexpr (std::is_same_v<T, int8_t>) return GgufValueType::kInt8;
  if constexpr (std::is_same_v<T, uint16_t>) return GgufValueType::kUint16;
  if constexpr (std::is_same_v<T, int16_t>) return GgufValueType::kInt16;
  if constexpr (std::is_same_v<T, uint32_t>) return GgufValueType::kUint32;
  if constexpr (std::is_same_v<T, int32_t>) return GgufValueType::kInt32;
  if constexpr (std::is_same_v<T, uint64_t>) return GgufValueType::kUint64;
  if constexpr (std::is_same_v<T, int64_t>) return GgufValueType::kInt64;
  if constexpr (std::is_same_v<T, float>) return GgufValueType::kFloat32;
  if constexpr (std::is_same_v<T, double>) return GgufValueType::kFloat64;
  return GgufValueType::kBool;
}
GgufEncoded EncodeScalarBytes(GgufValueType type, const void* value, size_t n);
}  // namespace gguf_internal

/// A scalar; T picks the type: uint8_t UINT8, int8_t INT8, ..., float FLOAT32, double FLOAT64,
/// bool BOOL (stored as one byte, 0 or 1).
template <typename T>
GgufEncoded GgufEncode(T value) {
  constexpr GgufValueType type = gguf_internal::ScalarType<T>();
  if constexpr (std::is_same_v<T, bool>) {
    const uint8_t byte = value ? 1 : 0;
    return gguf_internal::EncodeScalarBytes(type, &byte, 1);
  } else {
    return gguf_internal::EncodeScalarBytes(type, &value, sizeof(T));
  }
}
GgufEncoded GgufEncodeString(std::string_view value);
/// An array of `element_type`; every element must have that type (arrays may hold arrays of
/// different element types, as GGUF allows).
GgufEncoded GgufEncodeArray(GgufValueType element_type, const std::vector<GgufEncoded>& elements);
/// A value read by GgufFile, encoded back exactly as it was stored (its own type, narrow
/// integers included, nested arrays and all): for copying metadata from one file to another.
GgufEncoded GgufEncodeValue(const GgufValue& value);

/// Produces rows [first_row, first_row + n_rows) of a streamed tensor into `out`: n_rows rows of
/// dims[0] elements each, in the tensor's type, back to back. A tensor of dims [d0, d1, ...] has
/// d1·d2·... rows. The writer calls it in row order, in chunks of at most a few MiB (at least
/// one row); an error stops the write and is returned by Write.
using GgufRowSource = std::function<Status(int64_t first_row, int64_t n_rows, uint8_t* out)>;

/// Called after each tensor's data is in the file: the tensor's index (in the order added), the
/// bytes of the file written so far and the file's total size.
using GgufWriteProgress =
    std::function<void(size_t tensor_index, int64_t bytes_written, int64_t file_bytes)>;

class GgufWriter {
 public:
  /// Adds a metadata pair; fails if the key is already set or `value` carries an error.
  /// Setting "general.alignment" (a power-of-two integer) changes the file's alignment.
  Status Set(std::string key, GgufEncoded value);
  Status SetString(std::string key, std::string_view value);
  Status SetU32(std::string key, uint32_t value);
  Status SetI32(std::string key, int32_t value);
  Status SetU64(std::string key, uint64_t value);
  Status SetF32(std::string key, float value);
  Status SetBool(std::string key, bool value);
  Status SetStringArray(std::string key, const std::vector<std::string>& values);
  Status SetF32Array(std::string key, const std::vector<float>& values);
  Status SetI32Array(std::string key, const std::vector<int32_t>& values);

  /// Adds a tensor; `dims[0]` is the row length. Fails on a duplicate name, an unknown type, 1 to
  /// 4 positive dims violated, a row length that is not a whole number of blocks, or `bytes` not
  /// exactly the size of `dims` elements of `type`. Any known type may be written.
  Status AddTensor(std::string name, GgmlType type, std::vector<int64_t> dims,
                   std::vector<uint8_t> bytes);
  /// Adds a tensor whose bytes `source` produces while the file is written (the same checks as
  /// AddTensor, but for `bytes`). The source must outlive Write/Serialize.
  Status AddStreamedTensor(std::string name, GgmlType type, std::vector<int64_t> dims,
                           GgufRowSource source);

  /// The size of the file Write would write, in bytes (header, padding and data).
  int64_t FileBytes() const;

  /// The whole file in memory (tests patch it to build corrupt files). Empty if a streamed
  /// tensor's source fails.
  std::vector<uint8_t> Serialize() const;
  /// Serializes to `path`: a temporary file in the same folder, flushed, then renamed. On any
  /// failure (a source's error, a full disk) the temporary file is removed and the error names
  /// `path`. `progress`, if set, is called after each tensor.
  Status Write(const std::string& path, const GgufWriteProgress& progress = {}) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> dims;
    int64_t n_bytes = 0;
    std::vector<uint8_t> bytes;  // ready-made data, or empty when `source` produces it
    GgufRowSource source;
  };
  using Sink = std::function<Status(const uint8_t* data, size_t n)>;
  Result<int64_t> CheckTensor(const std::string& name, GgmlType type,
                              const std::vector<int64_t>& dims) const;
  std::vector<uint8_t> Header() const;  // everything before the data section, padded
  Status Emit(const Sink& sink, const GgufWriteProgress& progress) const;
  std::vector<std::pair<std::string, GgufEncoded>> metadata_;
  std::vector<Tensor> tensors_;
  uint32_t alignment_ = 32;
};

}  // namespace kvq
