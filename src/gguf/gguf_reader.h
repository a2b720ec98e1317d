// GGUF model files (llama.cpp / ggml, versions 2 and 3): a memory-mapped, fully validated view of
// the metadata and the tensors. Open() checks every length, count, dimension and tensor extent
// against the real file before anything is allocated or returned, so a damaged file costs an
// error message naming the file, never a crash. Tensor data stays in the mapping (no copies).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "base/mapped_file.h"
#include "kvq/status.h"

namespace kvq {

// ---- ggml tensor types ----

/// ggml's type ids (ggml.h `enum ggml_type`); ids 4, 5, 31-33 and 36-38 were removed upstream; 41
/// and 42 are PrismML's fork's 1- and 2-bit types.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
  kQ1_0 = 41,  // PrismML's fork (the Bonsai models): blocks of 128 in 18 bytes
  kQ2_0 = 42,  // PrismML's fork (ternary Bonsai): blocks of 64 in 18 bytes
};

/// What the reader knows of a ggml type: its name and ggml's block layout (for tensor extents).
struct GgmlTypeInfo {
  const char* name;        ///< "F32", "Q4_K", ...
  int64_t block_elements;  ///< 1 for plain types, 32 for Q8_0/Q4_0, 256 for k-quants
  int64_t block_bytes;
};
/// nullptr for an id that is not one of GgmlType's values (unknown, or removed upstream).
const GgmlTypeInfo* FindGgmlType(uint32_t id);
/// "F32", "Q4_K", ...; "unknown" for an id not in GgmlType.
const char* GgmlTypeName(GgmlType type);
/// Bytes holding `n_elements` elements of `type`. Fails if the type is unknown, `n_elements` is
/// negative or not a whole number of blocks, or the count overflows int64.
Result<int64_t> GgmlTypeBytes(GgmlType type, int64_t n_elements);

// ---- metadata values ----

/// GGUF metadata value types (gguf.h `enum gguf_type`).
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

/// "UINT8", ..., "FLOAT64"; "unknown" past FLOAT64.
const char* GgufValueTypeName(GgufValueType type);
/// Encoded size of one scalar of `type` (bool 1); 0 for STRING, ARRAY and unknown types.
int64_t GgufScalarBytes(GgufValueType type);

struct GgufValue;

/// An array value. Its contents point into the file's mapping: valid while the GgufFile lives.
struct GgufArray {
  GgufValueType element_type = GgufValueType::kUint8;
  int64_t size = 0;
  /// Numeric and BOOL elements: `size` little-endian scalars, packed and possibly unaligned
  /// (read with memcpy, or with NumberAt).
  const uint8_t* raw = nullptr;
  std::vector<std::string_view> strings;  ///< STRING elements
  std::vector<GgufValue> arrays;          ///< ARRAY elements (nested arrays; each has its own type)

  /// Element i of a numeric or BOOL array as a double (exact for every integer up to 2^53).
  double NumberAt(int64_t i) const;
};

/// One metadata value. Integers are widened (unsigned types to uint64_t, signed to int64_t),
/// FLOAT32 and FLOAT64 to double; strings are views into the mapping.
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  std::variant<uint64_t, int64_t, double, bool, std::string_view, GgufArray> data;
};

/// One key and its value, in file order.
struct GgufKeyValue {
  std::string key;
  GgufValue value;
};

/// A value for a human: `42`, `"llama"`, `[STRING x 32000: "<unk>", "<s>", ...]`. Arrays show
/// at most `max_elements` elements; strings are cut at 64 bytes.
std::string FormatGgufValue(const GgufValue& value, int max_elements = 8);

// ---- tensors ----

struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> dims;      ///< dims[0] is the row length (fastest varying); 1 to 4 dims
  int64_t n_elements = 0;
  uint64_t offset = 0;            ///< relative to the data section, as stored
  const uint8_t* data = nullptr;  ///< into the mapping; aligned to the file's alignment (null: OpenHeader)
  int64_t n_bytes = 0;
};

// ---- the file ----

class GgufFile {
 public:
  /// Maps `path` read-only and validates all of it; every error message names `path`.
  static Result<std::unique_ptr<GgufFile>> Open(const std::string& path);
  /// `path` holds the first bytes of a GGUF file of `file_bytes` bytes, at least its header (the
  /// metadata and the tensor table, HeaderBytes): the header is validated as Open does, each tensor's
  /// extent against `file_bytes`, and every tensor's `data` is null (its bytes are not here: a
  /// runtime that reads them from the file itself, by data_offset() + offset, the page's GPU path).
  static Result<std::unique_ptr<GgufFile>> OpenHeader(const std::string& path, int64_t file_bytes);
  /// The length of the header (metadata and tensor table, up to the aligned data section) of a GGUF
  /// file of `file_bytes` bytes whose first bytes are `prefix`; 0 when the prefix is too short to
  /// tell (read more); an error when the bytes are not a valid GGUF header (`name` in the message)
  /// — a short prefix reads as too short, so a damaged file is named once all of it is given.
  static Result<int64_t> HeaderBytes(std::span<const uint8_t> prefix, int64_t file_bytes, const std::string& name);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  int64_t file_bytes() const { return file_bytes_; }
  /// Whether only the header is mapped (OpenHeader): every tensor's data is null.
  bool header_only() const { return file_bytes_ != size_; }
  uint32_t alignment() const { return alignment_; }
  /// Absolute file offset of the data section.
  int64_t data_offset() const { return data_offset_; }

  // Metadata. A typed getter fails, naming the key and the file, when the key is missing or its
  // value has another type. Integer getters accept any integer type whose value fits.
  bool Has(std::string_view key) const;
  const GgufValue* Find(std::string_view key) const;  ///< nullptr when missing
  const std::vector<GgufKeyValue>& metadata() const { return metadata_; }
  Result<std::string> GetString(std::string_view key) const;
  Result<uint32_t> GetU32(std::string_view key) const;
  Result<int32_t> GetI32(std::string_view key) const;
  Result<uint64_t> GetU64(std::string_view key) const;
  Result<int64_t> GetI64(std::string_view key) const;
  /// FLOAT32, FLOAT64 (rounded to f32) or an integer.
  Result<float> GetF32(std::string_view key) const;
  Result<bool> GetBool(std::string_view key) const;
  /// Any array; the pointer is valid while this GgufFile lives.
  Result<const GgufArray*> GetArray(std::string_view key) const;
  /// An array of STRING; the views point into the mapping (valid while this GgufFile lives).
  Result<std::span<const std::string_view>> GetStringArray(std::string_view key) const;
  /// An array of FLOAT32.
  Result<std::vector<float>> GetF32Array(std::string_view key) const;
  /// An array of any integer type whose every element fits int32.
  Result<std::vector<int32_t>> GetI32Array(std::string_view key) const;

  // Tensors, in file order, of any ggml type: which types kvq computes with is the weight-type
  // registry's business (weights/weight_type.h), asked by the model loader.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  /// The tensor called `name`, if it exists (of any ggml type).
  Result<const GgufTensor*> FindTensor(std::string_view name) const;

 private:
  friend class GgufParser;
  GgufFile() = default;
  Result<const GgufValue*> Lookup(std::string_view key) const;
  Status TypeError(std::string_view key, const GgufValue& value, std::string_view wanted) const;
  template <typename T>
  Result<T> GetInteger(std::string_view key, const char* wanted) const;

  std::string path_;
  std::shared_ptr<MappedFile> mapping_;  // base/mapped_file: the whole file, read-only
  const uint8_t* map_ = nullptr;         // mapping_->data
  int64_t size_ = 0;                     // mapping_->size
  int64_t file_bytes_ = 0;               // the whole file's (size_ unless OpenHeader)
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  int64_t data_offset_ = 0;
  std::vector<GgufKeyValue> metadata_;
  std::unordered_map<std::string_view, size_t> key_index_;  // views of metadata_[i].key
  std::vector<GgufTensor> tensors_;
  std::unordered_map<std::string_view, size_t> tensor_index_;  // views of tensors_[i].name
};

}  // namespace kvq
