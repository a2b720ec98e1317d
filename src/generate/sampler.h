// Choosing the next token from logits: the chain include/kvq/sampling.h describes (greedy, or
// top-k, temperature, top-p and min-p), from a seeded generator so a run is reproducible. After
// top-k the chain runs in integers (SampleWords, SampleWithWords), so that a GPU kernel
// (web/gpu/sample_kernels.js) picks the same id from the same logits and draw, bit for bit.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "kvq/sampling.h"

namespace kvq {

/// One temperature > 0 draw's settings and random number as the integers the chain runs on: what
/// the page uploads to the GPU sampler per token (8 bytes of draw and 16 of settings).
struct SampleWords {
  uint32_t top_k = 0;       ///< keep the k largest logits; 0: all
  uint32_t exp_scale = 0;   ///< log2(e) / temperature in units of 2^-24 (saturated)
  uint32_t top_p_q24 = 0;   ///< top_p in units of 2^-24 (truncated; 2^24: keep the whole set)
  uint32_t min_weight = 0;  ///< min_p · 2^31 rounded up: the least weight min-p keeps
  uint32_t draw_lo = 0;     ///< the generator's 64-bit number, low word
  uint32_t draw_hi = 0;     ///< high word
};

/// The words of options' chain (temperature > 0) with the random number `draw`.
SampleWords SampleWordsOf(const SamplerOptions& options, uint64_t draw);

/// A logit the chain keeps, and its weight once weighed.
struct SampleCandidate {
  float logit = 0.0f;
  int32_t id = 0;
  uint32_t weight = 0;  ///< ∝ exp((logit - top) / temperature); 2^31 for the top
};

/// The id the chain picks from logits [n] (already biased and penalised) under `words`; 0 when
/// every logit is -infinity. Sampler::Sample at temperature > 0 is this with the next draw.
/// Logits are read to 2^-20 and clamped to [-2048, 2047]; temperatures under log2(e) / 256
/// (≈ 0.0056) sample as that one. `scratch`: reused storage ([≤ n] candidates).
int32_t SampleWithWords(const SampleWords& words, const float* logits, int32_t n);
int32_t SampleWithWords(const SampleWords& words, const float* logits, int32_t n,
                        std::vector<SampleCandidate>* scratch);

/// The table of 2^-x the weights are read from: [2][1024] u32, row 0 round(2^31 · 2^(-j/1024)),
/// row 1 round(2^31 · 2^(-j/2^20)), computed in integers (the same on every machine).
const uint32_t* SampleExp2Table();

class Sampler {
 public:
  explicit Sampler(SamplerOptions options);
  /// Picks a token id from logits [n] (modifies nothing the caller keeps). `recent`: the tokens
  /// before the one drawn (the penalties read its last repeat_last_n).
  int32_t Sample(const float* logits, int32_t n, std::span<const int32_t> recent = {});
  /// logits [n] with logit_bias and the penalties over `recent` applied, into `out` [n].
  void Adjust(const float* logits, int32_t n, std::span<const int32_t> recent, std::vector<float>* out);
  /// The words of the next temperature > 0 draw (advances the generator as Sample does): a device
  /// sampling with them picks what Sample would have from the same logits.
  SampleWords NextWords() { return SampleWordsOf(o_, rng_()); }
  const SamplerOptions& options() const { return o_; }

 private:
  SamplerOptions o_;
  std::vector<float> adjusted_;          // [n] the logits after bias and penalties
  std::vector<int32_t> window_counts_;   // [n] occurrences in the window (zeroed after each use)
  std::mt19937_64 rng_;
  std::vector<SampleCandidate> scratch_;  // [≤ n] the candidates of the last draw
};

}  // namespace kvq
