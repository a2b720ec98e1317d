// Generation: prefill a prompt through the model and cache, then decode new tokens until EOS, a
// BOS (llama2.c models mark a new story with BOS), -n tokens, or the context ends — streaming each
// piece as it is produced, timing prefill and decode separately.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvq/kv_cache.h"
#include "model/llama.h"
#include "model/sampler.h"
#include "model/tokenizer.h"

namespace kvq {

struct GenerateOptions {
  std::string prompt;
  int32_t n_new = 256;  ///< new tokens at most (llama.cpp's -n); < 0: until EOS or the context ends
  SamplerOptions sampling;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  ///< BOS, prompt and completion ids
  int32_t n_prompt = 0;         ///< of which the prompt (with BOS)
  std::string completion;       ///< generated text only
  double prompt_seconds = 0;
  double decode_seconds = 0;
  int32_t n_decoded = 0;        ///< forward passes in the decode phase
};

/// Runs `options.prompt` through `model` with `cache` (empty on entry). `on_piece` receives each
/// generated piece as it is sampled. Errors: a prompt longer than the context, cache errors.
Result<GenerateResult> Generate(LlamaModel& model, const Tokenizer& tokenizer, KvCache& cache,
                                const GenerateOptions& options,
                                const std::function<void(const std::string&)>& on_piece);

}  // namespace kvq
