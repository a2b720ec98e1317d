// `kvq eval fidelity`: what each KV format does to a real model's predictions, teacher-forced
// (seeds 002 and 004, docs/design.md §5). One token sequence goes through the model twice per format —
// once with an f32 cache (the reference), once with the candidate format for K and V — one decode
// step per token, and the logits are compared at every position. Free-run divergence (let both
// arms generate and see where they part) is greedy chaos, not a fidelity number, and is not measured.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "measure_report/fidelity_report.h"  // FidelityArm, FidelityConfig, FidelityReport
#include "kvq/format.h"
#include "kvq/kv_spec.h"
#include "kvq/status.h"
#include "model/decoder.h"
#include "text/tokenizer.h"

namespace kvq {

/// The token sequence a fidelity run feeds: `text` encoded with BOS first when the vocabulary
/// asks for one, cut to the first `context` ids.
struct FidelityInput {
  std::vector<int32_t> tokens;
  int64_t full_count = 0;  ///< ids the whole text gives; > tokens.size() when it was cut
};
FidelityInput MakeFidelityInput(const Tokenizer& tokenizer, std::string_view text, int64_t context);

/// Runs `tokens` (2 ≤ n ≤ the model's seq_len, each id < vocab_size) through an f32 reference
/// cache and then through a cache of each arm, one Forward per token, and compares the
/// logits position by position. Softmax, KL and perplexity are computed in double. The result
/// does not depend on the model's thread count. `progress` (may be empty) gets one line per arm.
Result<FidelityReport> RunFidelity(DecoderModel& model, std::span<const int32_t> tokens,
                                   const FidelityConfig& config,
                                   const std::function<void(const std::string&)>& progress);

}  // namespace kvq
