// The sampler chain's settings: how the next token is chosen from the logits.
//
// First the logits are adjusted (llama.cpp's order): logit_bias is added, then the penalties over
// a window of the recent tokens (the last repeat_last_n the session holds, prompt included, as
// llama.cpp's server counts them): a token in the window has its logit divided by repeat_penalty
// when positive and multiplied by it otherwise (CTRL's rule, as llama.cpp applies it), then
// lowered by frequency_penalty × its count in the window and by presence_penalty once (OpenAI's
// definitions). Greedy sees the adjusted logits too.
//
// Then the chain (llama.cpp's usual one): temperature 0 → greedy (argmax; the lowest id wins a
// tie) and nothing else runs; otherwise top-k on the logits, softmax with the temperature, top-p
// (the smallest set of most likely tokens whose probability reaches top_p), min-p (tokens at
// least min_p times as likely as the most likely one), and one draw from what is left, from a
// 64-bit Mersenne Twister seeded with `seed` — the same seed and logits give the same token. After
// top-k the chain runs in integers (weights 2^31 · exp((logit - top) / temperature), the logits read
// to 2^-20 and clamped to ±2048, the exponent in base 2 to 2^-20; temperatures under 0.0056 act as
// 0.0056), so the page's GPU sampler picks the same token from the same logits and seed, bit for bit.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace kvq {

struct SamplerOptions {
  float temperature = 0.8f;  ///< 0: greedy (argmax); > 0 otherwise
  int32_t top_k = 40;        ///< keep the k largest logits; 0: off
  float top_p = 0.95f;       ///< in (0, 1]; 1: off
  float min_p = 0.05f;       ///< in [0, 1); 0: off; keeps tokens with p ≥ min_p · p_max
  uint64_t seed = 0;         ///< seed of the draw
  float repeat_penalty = 1.0f;     ///< > 0; 1: off
  float frequency_penalty = 0.0f;  ///< in [-2, 2] (OpenAI's range); 0: off
  float presence_penalty = 0.0f;   ///< in [-2, 2]; 0: off
  /// The penalties' window: the last repeat_last_n tokens; 0: no penalties; -1: every token held.
  int32_t repeat_last_n = 64;
  /// (token id, value added to its logit); ids outside the vocabulary are ignored by the sampler
  /// (callers check them against theirs).
  std::vector<std::pair<int32_t, float>> logit_bias;

  /// Whether any penalty or bias changes the logits.
  bool AdjustsLogits() const {
    return !logit_bias.empty() ||
           (repeat_last_n != 0 && (repeat_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f));
  }
};

/// One token's log-probability under the model (log-softmax of the logits the model gave, at
/// temperature 1, before biases, penalties, grammars and the sampler's filters).
struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

/// The logprob of `token`, and the `top` most likely tokens (descending; ties: lower id first),
/// from logits [n]. Sums in double.
struct TokenLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;
};
TokenLogprobs LogprobsOf(std::span<const float> logits, int32_t token, int32_t top);

}  // namespace kvq
