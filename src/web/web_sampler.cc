// The sampler for the page's GPU path: the module keeps the chain's generator (kvq::Sampler) and
// hands the page, per token, the integer words the GPU sampler (web/gpu/sample_kernels.js) picks
// the id with — settings and one 64-bit draw, so only the id comes back from the GPU — and the
// C++ pick from the same words (kvq_web_sample_with_words), which the GPU's must equal.
#include <emscripten/emscripten.h>

#include <cstdint>

#include "generate/sampler.h"
#include "web/web_common.h"

using kvq_web::Handle;

namespace {

kvq::Sampler* SamplerOf(int handle) { return reinterpret_cast<kvq::Sampler*>(static_cast<intptr_t>(handle)); }

}  // namespace

extern "C" {

/// A sampler with kvq_web_set_sampler's settings (the seed as there: its 32 bits); free with
/// kvq_web_sampler_free.
EMSCRIPTEN_KEEPALIVE int kvq_web_sampler_new(float temperature, int top_k, float top_p, float min_p, int seed) {
  return Handle(new kvq::Sampler({.temperature = temperature, .top_k = top_k, .top_p = top_p, .min_p = min_p,
                                  .seed = static_cast<uint32_t>(seed)}));
}

EMSCRIPTEN_KEEPALIVE void kvq_web_sampler_free(int sampler) { delete SamplerOf(sampler); }

/// The next token's words (kvq::SampleWords: [6] u32 into `out`), advancing the generator as a
/// Sample would. Returns 0 at temperature 0 (greedy: nothing written, nothing drawn), else 1.
EMSCRIPTEN_KEEPALIVE int kvq_web_sampler_next_words(int sampler, uint32_t* out) {
  kvq::Sampler* s = SamplerOf(sampler);
  if (s->options().temperature <= 0.0f) return 0;
  const kvq::SampleWords w = s->NextWords();
  const uint32_t words[6] = {w.top_k, w.exp_scale, w.top_p_q24, w.min_weight, w.draw_lo, w.draw_hi};
  for (int i = 0; i < 6; ++i) out[i] = words[i];
  return 1;
}

/// kvq::Sampler::Sample on logits [n] (the CPU path's pick; its generator advances).
EMSCRIPTEN_KEEPALIVE int kvq_web_sampler_sample(int sampler, const float* logits, int n) {
  return SamplerOf(sampler)->Sample(logits, n);
}

/// kvq::SampleWithWords: the id the chain picks from logits [n] under words [6].
EMSCRIPTEN_KEEPALIVE int kvq_web_sample_with_words(const uint32_t* words, const float* logits, int n) {
  const kvq::SampleWords w{.top_k = words[0], .exp_scale = words[1], .top_p_q24 = words[2],
                           .min_weight = words[3], .draw_lo = words[4], .draw_hi = words[5]};
  return kvq::SampleWithWords(w, logits, n);
}

/// kvq::SampleExp2Table: [2][1024] u32, valid while the module lives.
EMSCRIPTEN_KEEPALIVE const uint32_t* kvq_web_sample_exp2_table(void) { return kvq::SampleExp2Table(); }

}  // extern "C"
