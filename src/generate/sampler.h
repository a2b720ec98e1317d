// Choosing the next token from logits: the chain include/kvq/sampling.h describes (greedy, or
// top-k, temperature, top-p and min-p), from a seeded generator so a run is reproducible.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kvq/sampling.h"

namespace kvq {

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
