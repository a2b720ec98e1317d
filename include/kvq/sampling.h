// The sampler chain's settings: how the next token is chosen from the logits.
//
// Order of the chain (llama.cpp's usual one): temperature 0 → greedy (argmax; the lowest id wins a
// tie) and nothing else runs; otherwise top-k on the logits, softmax with the temperature, top-p
// (the smallest set of most likely tokens whose probability reaches top_p), min-p (tokens at
// least min_p times as likely as the most likely one), and one draw from what is left, from a
// 64-bit Mersenne Twister seeded with `seed` — the same seed and logits give the same token.
#pragma once

#include <cstdint>

namespace kvq {

struct SamplerOptions {
  float temperature = 0.8f;  ///< 0: greedy (argmax); > 0 otherwise
  int32_t top_k = 40;        ///< keep the k largest logits; 0: off
  float top_p = 0.95f;       ///< in (0, 1]; 1: off
  float min_p = 0.05f;       ///< in [0, 1); 0: off; keeps tokens with p ≥ min_p · p_max
  uint64_t seed = 0;         ///< seed of the draw
};

}  // namespace kvq
