// kvq's public C++ API: a model file's shape and the KV cache its sessions would get, read from
// the file's metadata and tensor table without loading the model (`kvq plan -m`).
//
//   kvq::Result<kvq::ModelFile> file = kvq::ModelFile::Read("model.gguf");
//   const kvq::ModelShape& s = file->shape();  // layers, KV heads, head_dim, recurrent state
//   kvq::Result<kvq::KvCacheConfig> cache = file->CacheConfig(32768, {.key_format = "int4"});
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kvq/kv_cache.h"
#include "kvq/model.h"
#include "kvq/status.h"

namespace kvq {

/// What a model file holds, as far as its memory is concerned (names as ModelInfo's).
struct ModelShape {
  std::string architecture;  ///< "llama", "qwen35", ...
  int32_t n_layers = 0;
  /// Layers with a KV cache: a hybrid model's full-attention layers; n_layers for other models.
  int32_t n_attention_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  /// Bytes of a hybrid model's fixed recurrent state per sequence (f32); 0 for other models.
  int64_t state_bytes = 0;
  /// The context the model was trained for (its file says; 0 when it states none).
  int64_t trained_context = 0;
};

/// A model file opened for its shape only. A GGUF file's weights are viewed in its mapping, never
/// read, repacked or dequantised, and no vocabulary is read, so a many-GB file opens at once; a
/// llama2.c checkpoint (anything not ".gguf") has no metadata section and is read whole.
class ModelFile {
 public:
  /// Errors name the file and what was wrong (as Model::Load's do).
  static Result<ModelFile> Read(const std::string& path);

  const ModelShape& shape() const { return shape_; }

  /// The KV cache a session of this model holding `max_positions` positions gets with `kv`'s
  /// formats, budgets and page size (kv.context is not used: any positive `max_positions` may be
  /// planned, past the trained context too): the same function plans it as a session's
  /// (Model::NewSession), checked against the model's shape and the budgets, not allocated.
  /// KvCache::Plan(config) then says where it would live.
  Result<KvCacheConfig> CacheConfig(int64_t max_positions, const KvOptions& kv) const;

  struct Impl;  ///< internal: the configuration the model layer plans caches from

 private:
  ModelFile(ModelShape shape, std::shared_ptr<const Impl> impl);
  ModelShape shape_;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace kvq
