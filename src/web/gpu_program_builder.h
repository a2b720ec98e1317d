// GpuProgramBuilder: how BuildGpuProgram (gpu_program.h) and the builders of its layer kinds
// (gpu_delta_net.h, gpu_moe.h) add a weight to the program's tensor table and an op to its list. A
// weight of a header-only load is located in the model file by its GGUF name.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "gguf/gguf_reader.h"
#include "kvq/status.h"
#include "web/gpu_program.h"
#include "weights/repack.h"
#include "weights/weight_type.h"

namespace kvq_web {

class GpuProgramBuilder {
 public:
  GpuProgramBuilder(GpuProgram* p, const kvq::GgufFile* header) : p_(p), header_(header) {}

  int32_t Matrix(const std::string& name, const kvq::Matrix& m) {
    const kvq::WeightTypeDesc* d = kvq::FindWeightType(m.type);
    return Add({.name = name, .type = d != nullptr ? d->name : "?",
                .layout = m.layout == kvq::MatrixLayout::kRowMajor ? "rows" : "interleaved16",
                .address = reinterpret_cast<uintptr_t>(m.data), .bytes = kvq::MatrixDataBytes(m),
                .rows = m.rows, .cols = m.cols});
  }
  int32_t Vector(const std::string& name, const float* v, int64_t n) {
    return Add({.name = name, .type = "f32", .layout = "rows", .address = reinterpret_cast<uintptr_t>(v),
                .bytes = n * 4, .rows = 1, .cols = n});
  }
  void Op(GpuOp op) { p_->ops.push_back(std::move(op)); }
  kvq::Status status() const { return status_; }

 private:
  int32_t Add(GpuTensor t) {
    if (header_ != nullptr) Locate(&t);
    p_->tensors.push_back(std::move(t));
    return static_cast<int32_t>(p_->tensors.size() - 1);
  }
  // A header-only load's tensor: its file offset, by the GGUF name the loader read it by
  // (gguf_llama.cc, gguf_hybrid.cc): "blk.3.attn_q" is "blk.3.attn_q.weight", a bias and a
  // DeltaNet layer's ssm_a keep their names, a hybrid's ffn_norm is its post_attention_norm, and
  // a tied classifier ("output" absent from the file) is the embedding.
  void Locate(GpuTensor* t) {
    const bool bare = t->name.ends_with(".bias") || t->name.ends_with(".ssm_a");
    std::string name = bare ? t->name : t->name + ".weight";
    if (name == "output.weight" && !header_->FindTensor(name).ok()) name = "token_embd.weight";
    if (name.ends_with(".ffn_norm.weight") && !header_->FindTensor(name).ok()) {
      name = name.substr(0, name.size() - std::string_view("ffn_norm.weight").size()) + "post_attention_norm.weight";
    }
    kvq::Result<const kvq::GgufTensor*> found = header_->FindTensor(name);
    if (!found.ok()) {
      if (status_.ok()) status_ = found.status();
      return;
    }
    if ((*found)->n_bytes != t->bytes && status_.ok()) {
      status_ = kvq::Status::Error(header_->path() + ": tensor '" + name + "' has " +
                                   std::to_string((*found)->n_bytes) + " bytes; its shape needs " +
                                   std::to_string(t->bytes));
    }
    t->file_offset = header_->data_offset() + static_cast<int64_t>((*found)->offset);
  }
  GpuProgram* p_;
  const kvq::GgufFile* header_;
  kvq::Status status_ = kvq::Status::Ok();
};


}  // namespace kvq_web
