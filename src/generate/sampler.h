// Choosing the next token from logits: the chain include/kvq/sampling.h describes (greedy, or
// top-k, temperature, top-p and min-p), from a seeded generator so a run is reproducible.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "kvq/sampling.h"

namespace kvq {

class Sampler {
 public:
  explicit Sampler(SamplerOptions options);
  /// Picks a token id from logits [n] (modifies nothing the caller keeps). `recent`: the tokens
  /// before the one drawn (the penalties read its last repeat_last_n).
  int32_t Sample(const float* logits, int32_t n, std::span<const int32_t> recent = {});
  /// logits [n] with logit_bias and the penalties over `recent` applied, into `out` [n].
  void Adjust(const float* logits, int32_t n, std::span<const int32_t> recent, std::vector<float>* out);

 private:
  SamplerOptions o_;
  std::vector<float> adjusted_;          // [n] the logits after bias and penalties
  std::vector<int32_t> window_counts_;   // [n] occurrences in the window (zeroed after each use)
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

}  // namespace kvq
