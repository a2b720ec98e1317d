// GgufTensorReader (see gguf_tensors.h).
#include "model/gguf_tensors.h"

#include <fmt/format.h>

#include "weights/matvec.h"
#include "weights/weight_type.h"

namespace kvq {
namespace {

// The registry maps GGUF type ids; an id it lacks (a ggml type kvq has no kernels for, or one
// ggml itself does not define) is refused naming the file, the tensor and the id.
Result<WeightType> ToWeightType(const GgufTensor& t, const std::string& path) {
  const auto id = static_cast<uint32_t>(t.type);
  if (const WeightTypeDesc* d = FindWeightTypeByGgufId(id)) return d->type;
  return Status::Error(
      fmt::format("{}: tensor '{}' has type {} (GGUF type id {}), which kvq does not support "
                  "(supported: {})",
                  path, t.name, GgmlTypeName(t.type), id, WeightTypeLabelList()));
}

}  // namespace

bool GgufTensorReader::Has(const std::string& name) const {
  for (const GgufTensor& t : file_.tensors()) {
    if (t.name == name) return true;
  }
  return false;
}

Result<Matrix> GgufTensorReader::Shaped(const std::string& name, const std::vector<int64_t>& dims) {
  Result<const GgufTensor*> t = file_.FindTensor(name);
  if (!t.ok()) return t.status();
  if ((*t)->dims != dims) {
    return Status::Error(fmt::format("{}: tensor '{}' has shape [{}]; the metadata implies [{}]",
                                     path(), name, fmt::join((*t)->dims, ", "),
                                     fmt::join(dims, ", ")));
  }
  Result<WeightType> type = ToWeightType(**t, path());
  if (!type.ok()) return type.status();
  // A header-only file (GgufFile::OpenHeader) has no bytes to hash.
  if ((*t)->data != nullptr) weights_->fingerprint_bytes.emplace_back((*t)->data, static_cast<size_t>((*t)->n_bytes));
  int64_t rows = 1;
  for (size_t i = 1; i < dims.size(); ++i) rows *= dims[i];
  const Matrix matrix{*type, (*t)->data, rows, dims[0]};
  if (Status s = CheckMatrix(matrix); !s.ok()) {
    return Status::Error(fmt::format("{}: tensor '{}': {}", path(), name, s.message()));
  }
  return matrix;
}

Result<const float*> GgufTensorReader::F32(const std::string& name,
                                           const std::vector<int64_t>& dims) {
  Result<Matrix> m = Shaped(name, dims);
  if (!m.ok()) return m.status();
  if (m->type != WeightType::kF32) {
    return Status::Error(
        fmt::format("{}: tensor '{}' must be F32 (is {})", path(), name, WeightTypeName(m->type)));
  }
  return reinterpret_cast<const float*>(m->data);
}

}  // namespace kvq
