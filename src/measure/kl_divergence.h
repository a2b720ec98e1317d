// kvq's logits against llama.cpp's (issue 12 item 5): `kvq eval fidelity --kl-divergence-base`
// runs kvq over llama-perplexity's chunking (llama_logits_file.h) with any KV spec and compares
// each scored position with the base file's record — KL divergence, top-1 agreement ("Same top
// p"), Δp and both perplexities, with the definitions and summary statistics llama.cpp's
// `--kl-divergence` prints — and `--kl-divergence-base-out` writes kvq's own records for llama.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "measure_report/fidelity_report.h"  // KlSummary, KlReport
#include "kvq/format.h"
#include "kvq/kv_spec.h"
#include "kvq/status.h"
#include "measure/llama_logits_file.h"
#include "model/decoder.h"

namespace kvq {

/// One scored position against its base record, as llama.cpp's kl_divergence defines it (here
/// in double). p is softmax(logits); p_base_i = exp(log p_base_i) from the record.
struct KlPosition {
  /// Σ over i with log p_base_i > −16 of p_base_i·(log p_base_i − log p_i), nats. The tokens
  /// left out are those the encoding clamped (16 or more below the top log-probability).
  double kl = 0;
  double p_diff = 0;    ///< p(target) − p_base(target)
  double nll = 0;       ///< −log p(target)
  double nll_base = 0;  ///< −log p_base(target)
  bool same_top = false;  ///< the first largest logit is the first largest base code
};
KlPosition CompareWithBase(const float* logits, int32_t n_vocab, const LlamaLogProbs& base, int32_t target);

/// The summary of `positions` (at least 1). Quantiles interpolate linearly between the sorted
/// values at fraction·(n − 1); the median of an even count is the mean of the two middle ones.
KlSummary Summarize(std::span<const KlPosition> positions);

/// The ids llama-perplexity evaluates for a text of `tokens` (the text tokenized with BOS first
/// when the vocabulary adds one): the first n_chunk·n_ctx, n_chunk = tokens.size() / n_ctx.
std::vector<int32_t> LlamaChunkTokens(std::span<const int32_t> tokens, int32_t n_ctx);

/// Ok when `base` can be compared with this model over `text_tokens` (kvq's tokenization of the
/// text, BOS first as llama.cpp tokenizes): its n_vocab is the model's, its n_ctx fits the
/// model's context, and its ids are the first n_chunk·n_ctx of text_tokens. Errors name the file,
/// what it holds and what was expected.
Status CheckBaseMatches(const LlamaLogitsReader& base, int32_t vocab_size, int64_t seq_len,
                        std::span<const int32_t> text_tokens);

struct KlRunConfig {
  const FormatDesc* key = nullptr;    ///< the KV spec kvq runs with
  const FormatDesc* value = nullptr;
  KvTransforms key_transforms;        ///< and its transforms (kvq/kv_spec.h)
  KvTransforms value_transforms;
  int32_t n_ctx = 0;
  /// The id every chunk's first token is replaced by (llama.cpp does so when the vocabulary adds
  /// BOS); −1: none.
  int32_t bos = -1;
  const LlamaLogitsReader* base = nullptr;  ///< compare with it (checked by CheckBaseMatches)
  LlamaLogitsWriter* out = nullptr;         ///< write kvq's records into it (closed by the caller)
};

/// Runs `tokens` [n_chunk][n_ctx] chunk by chunk: a fresh cache, positions 0..first−1 as one
/// block, then one decode step per scored position (its logits compared and/or written; position
/// n_ctx − 1 predicts nothing and is not run). `progress` (may be empty) gets a line per chunk.
Result<KlReport> RunKlDivergence(DecoderModel& model, std::span<const int32_t> tokens, const KlRunConfig& config,
                                 const std::function<void(const std::string&)>& progress);

}  // namespace kvq
