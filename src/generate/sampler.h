// Choosing the next token from logits: greedy, or temperature with top-k, top-p (nucleus) and
// min-p filters, from a seeded generator so a run is reproducible.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace kvq {

struct SamplerOptions {
  float temperature = 0.8f;  ///< 0: greedy (argmax)
  int32_t top_k = 40;        ///< 0: off
  float top_p = 0.95f;       ///< 1: off
  float min_p = 0.05f;       ///< 0: off; keeps tokens with p ≥ min_p · p_max
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(SamplerOptions options);
  /// Picks a token id from logits [n] (modifies nothing the caller keeps).
  int32_t Sample(const float* logits, int32_t n);

 private:
  SamplerOptions o_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

}  // namespace kvq
