// Generation: prefill a prompt through the model and cache, then decode new tokens until EOS or an
// end-of-turn token (Tokenizer::IsEndOfGeneration), a
// BOS (llama2.c models mark a new story with BOS), -n tokens, or the context ends — streaming each
// piece as it is produced, timing prefill and decode separately.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvq/kv_cache.h"
#include "model/llama.h"
#include "generate/sampler.h"
#include "text/tokenizer.h"

namespace kvq {

struct GenerateOptions {
  std::string prompt;
  /// The prompt's tokens when the caller has them already (then `prompt` is not encoded again).
  std::vector<int32_t> prompt_tokens;
  int32_t n_new = 256;  ///< new tokens at most (llama.cpp's -n); < 0: until EOS or the context ends
  SamplerOptions sampling;
  /// Called once when the cache holds every prompt token but the last (the prefix a prompt cache
  /// saves: the last token is always run again, for its logits). Its error stops generation.
  std::function<Status(const std::vector<int32_t>& prefix)> on_prefix;
  /// Called with each generated token and its piece, after on_piece; returning false stops
  /// generation there (the token is kept). Empty: never stops early.
  std::function<bool(int32_t token, const std::string& piece)> on_token;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  ///< BOS, prompt and completion ids
  int32_t n_prompt = 0;         ///< of which the prompt (with BOS)
  std::string completion;       ///< generated text only
  double prompt_seconds = 0;
  double decode_seconds = 0;
  int32_t n_decoded = 0;        ///< forward passes in the decode phase
  int32_t n_reused = 0;         ///< prompt tokens whose prefill a prompt cache skipped
  bool cancelled = false;       ///< on_token returned false
  /// [vocab_size] the logits after the last token the cache holds (tokens[0, n_cached)).
  std::vector<float> logits;
  int64_t n_cached = 0;         ///< positions in the cache at the end (the last sampled token may not be)
};

/// Runs `options.prompt` through `model` with `cache`. The cache may already hold a prefix of the
/// prompt's tokens (a loaded prompt cache, shorter than the prompt): prefill starts after it.
/// `on_piece` receives each generated piece as it is sampled. Errors: a prompt longer than the
/// context, a cache whose contents are not a proper prefix of the prompt, cache errors.
Result<GenerateResult> Generate(LlamaModel& model, const Tokenizer& tokenizer, KvCache& cache,
                                const GenerateOptions& options,
                                const std::function<void(const std::string&)>& on_piece,
                                const std::vector<int32_t>& cached_tokens = {});

}  // namespace kvq
