// `kvq eval attention`'s entry (see attention_eval.h): the loaded model's tokenizer, weights and
// layer kinds handed to measure/'s attention-error measurement.
#include "attention_eval/attention_eval.h"

#include "api/api_internal.h"
#include "measure/attention_error.h"
#include "model/cache_config.h"

namespace kvq {

std::vector<int32_t> AttentionLayersOf(const Model& model) { return ModelLayersOfCache(model.impl().weights.config); }

AttentionTextInput AttentionTextOf(const Model& model, std::string_view text, int64_t n) {
  return MakeAttentionTextInput(model.impl().tokenizer, text, n);
}

Result<AttentionErrorReport> EvalModelAttentionError(const Model& model, std::span<const int32_t> tokens,
                                                     const AttentionErrorConfig& config,
                                                     const std::function<void(const std::string&)>& progress) {
  const Model::Impl& m = model.impl();
  DecoderModel forward(m.weights, m.info.threads);  // a copy of the weight views, as a Session's
  return MeasureModelAttentionError(forward, tokens, config, progress);
}

Result<AttentionErrorReport> EvalSyntheticAttentionError(const SyntheticShape& shape, uint64_t seed,
                                                         const AttentionErrorConfig& config,
                                                         const std::function<void(const std::string&)>& progress) {
  return MeasureSyntheticAttentionError(shape, seed, config, progress);
}

}  // namespace kvq
