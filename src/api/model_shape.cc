// ModelFile (see include/kvq/model_shape.h): a model file's configuration read by the model
// layer's loaders without repacking or a vocabulary, and its caches planned as sessions' are.
#include "kvq/model_shape.h"

#include <fmt/format.h>

#include "api/api_internal.h"
#include "model/cache_config.h"
#include "model/load_model.h"

namespace kvq {

struct ModelFile::Impl {
  DecoderConfig config;  // what ModelCacheConfig plans the model's cache from
};

ModelFile::ModelFile(ModelShape shape, std::shared_ptr<const Impl> impl)
    : shape_(std::move(shape)), impl_(std::move(impl)) {}

Result<ModelFile> ModelFile::Read(const std::string& path) {
  Result<DecoderWeights> weights = OpenModelWeights(path, nullptr);
  if (!weights.ok()) return weights.status();
  auto impl = std::make_shared<Impl>();
  impl->config = weights->config;  // the weight views (and the mapping) end here
  const DecoderConfig& c = impl->config;
  const KvShape kv = ModelKvShape(c);
  ModelShape shape{.architecture = c.arch, .n_layers = c.n_layers,
                   .n_attention_layers = static_cast<int32_t>(kv.n_layers), .n_kv_heads = kv.n_kv_heads,
                   .head_dim = kv.head_dim, .state_bytes = c.state_floats() * 4, .trained_context = c.seq_len};
  return ModelFile(std::move(shape), std::move(impl));
}

Result<KvCacheConfig> ModelFile::CacheConfig(int64_t max_positions, const KvOptions& kv) const {
  if (max_positions <= 0) {
    return Status::Error(fmt::format("max_positions must be positive (got {})", max_positions));
  }
  Result<CacheChoice> choice = CacheChoiceFor(impl_->config, kv);
  if (!choice.ok()) return choice.status();
  return ModelCacheConfig(impl_->config, max_positions, *choice);
}

}  // namespace kvq
