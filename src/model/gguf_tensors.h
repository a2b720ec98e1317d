// Reading a GGUF model's tensors as checked weight views: LoadGgufLlama and the hybrid layers'
// loader (gguf_hybrid.h) share it, so every tensor is refused the same way — missing, of a type
// kvq has no kernels for, or of a shape the metadata does not imply — naming the file and tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "kvq/status.h"
#include "model/decoder_weights.h"

namespace kvq {

class GgufTensorReader {
 public:
  /// Views point into `file`; each tensor read is added to `weights`' fingerprint bytes. A
  /// header-only file (GgufFile::OpenHeader) gives views with null data.
  GgufTensorReader(const GgufFile& file, DecoderWeights* weights) : file_(file), weights_(weights) {}
  const std::string& path() const { return file_.path(); }
  bool Has(const std::string& name) const;
  /// A tensor of GGUF dims exactly `dims` (ne0 first) as a row-major Matrix of dims[0] columns and
  /// dims[1]·dims[2]·… rows (a 3-D expert tensor [cols, rows, n_experts]: the experts stacked).
  Result<Matrix> Shaped(const std::string& name, const std::vector<int64_t>& dims);
  /// A matrix [cols, rows], or a vector of cols numbers when rows = 0.
  Result<Matrix> Get(const std::string& name, int64_t cols, int64_t rows) {
    return Shaped(name, rows == 0 ? std::vector<int64_t>{cols} : std::vector<int64_t>{cols, rows});
  }
  /// An F32 tensor of GGUF dims `dims` (norm weights, biases, conv taps, gates).
  Result<const float*> F32(const std::string& name, const std::vector<int64_t>& dims);

 private:
  const GgufFile& file_;
  DecoderWeights* weights_;
};

}  // namespace kvq
