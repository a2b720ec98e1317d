// The sampler for the page's GPU path: the module keeps the chain's generator (kvq::Sampler) and
// hands the page, per token, the integer words the GPU sampler (web/gpu/sample_kernels.js) picks
// the id with — settings and one 64-bit draw, so only the id comes back from the GPU — and, when
// the settings bias or penalise the logits, the edits its adjust pass applies (the logits the
// window's tokens and the biases name, with what Sampler::Adjust does to each); and the C++ pick
// from the same words (kvq_web_sample_with_words), which the GPU's must equal.
#include <emscripten/emscripten.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "generate/sampler.h"
#include "web/web_common.h"

using kvq_web::Fail;
using kvq_web::Handle;

namespace {

kvq::Sampler* SamplerOf(int handle) { return reinterpret_cast<kvq::Sampler*>(static_cast<intptr_t>(handle)); }

}  // namespace

namespace kvq_web {

std::string WebSamplerOptions(const float* settings, uint32_t seed_low, uint32_t seed_high, const int32_t* bias,
                              int n_bias, kvq::SamplerOptions* out) {
  const float temperature = settings[0], top_p = settings[2], min_p = settings[3];
  const float repeat_penalty = settings[4], frequency = settings[5], presence = settings[6];
  const float top_k = settings[1], repeat_last_n = settings[7];
  auto integer = [](float x) { return std::isfinite(x) && x == std::floor(x); };
  // Each refusal names the field, the value given and what it takes (the page shows it as is).
  auto refuse = [](const char* field, float value, const char* expected) {
    return fmt::format("{} {}: must be {}", field, value, expected);
  };
  if (!(temperature >= 0 && std::isfinite(temperature))) return refuse("temperature", temperature, "≥ 0 (and finite)");
  if (!(integer(top_k) && top_k >= 0 && top_k < 2147483648.0f)) return refuse("top_k", top_k, "a whole number ≥ 0");
  if (!(top_p >= 0 && top_p <= 1)) return refuse("top_p", top_p, "in [0, 1]");
  if (!(min_p >= 0 && min_p <= 1)) return refuse("min_p", min_p, "in [0, 1]");
  // A normal float: the GPU's exact division (sample_kernels.js div_exact) takes one.
  if (!(std::isnormal(repeat_penalty) && repeat_penalty > 0)) {
    return refuse("repeat_penalty", repeat_penalty, "> 0 (and finite)");
  }
  if (!(frequency >= -2 && frequency <= 2)) return refuse("frequency_penalty", frequency, "in [-2, 2]");
  if (!(presence >= -2 && presence <= 2)) return refuse("presence_penalty", presence, "in [-2, 2]");
  if (!(integer(repeat_last_n) && repeat_last_n >= -1 && repeat_last_n < 2147483648.0f)) {
    return refuse("repeat_last_n", repeat_last_n, "a whole number ≥ -1 (-1: every token held, 0: off)");
  }
  *out = {.temperature = temperature, .top_k = static_cast<int32_t>(top_k), .top_p = top_p, .min_p = min_p,
          .seed = uint64_t{seed_high} << 32 | seed_low, .repeat_penalty = repeat_penalty, .frequency_penalty = frequency,
          .presence_penalty = presence, .repeat_last_n = static_cast<int32_t>(repeat_last_n)};
  for (int i = 0; i < n_bias; ++i) {
    const float value = std::bit_cast<float>(bias[2 * i + 1]);
    if (!std::isfinite(value)) return fmt::format("logit_bias {}: its value {} must be finite", bias[2 * i], value);
    out->logit_bias.emplace_back(bias[2 * i], value);
  }
  return "";
}

}  // namespace kvq_web

extern "C" {

/// A sampler with kvq_web_set_sampler's settings (settings [8], the seed's low and high 32 bits,
/// bias [n_bias][id, f32 bits]: kvq_web::WebSamplerOptions); 0 when they are out of range
/// (kvq_web_last_error says which). Free with kvq_web_sampler_free.
EMSCRIPTEN_KEEPALIVE int kvq_web_sampler_new(const float* settings, uint32_t seed_low, uint32_t seed_high,
                                             const int32_t* bias, int n_bias) {
  kvq::SamplerOptions options;
  const std::string error = kvq_web::WebSamplerOptions(settings, seed_low, seed_high, bias, n_bias, &options);
  if (!error.empty()) {
    Fail(error);
    return 0;
  }
  return Handle(new kvq::Sampler(std::move(options)));
}

EMSCRIPTEN_KEEPALIVE void kvq_web_sampler_free(int sampler) { delete SamplerOf(sampler); }

/// The next token's words (kvq::SampleWords: [6] u32 into `out`), advancing the generator as a
/// Sample would. Returns 1 then; at temperature 0, 0 (greedy: the step's argmax; nothing written,
/// nothing drawn), or 2 when the logits are adjusted first: words of top_k 1 (the chain then picks
/// the first largest logit, as Sample's argmax does), the generator untouched.
EMSCRIPTEN_KEEPALIVE int kvq_web_sampler_next_words(int sampler, uint32_t* out) {
  kvq::Sampler* s = SamplerOf(sampler);
  if (s->options().temperature <= 0.0f) {
    if (!s->options().AdjustsLogits()) return 0;
    const uint32_t greedy[6] = {1, 0, 1u << 24, 0, 0, 0};
    for (int i = 0; i < 6; ++i) out[i] = greedy[i];
    return 2;
  }
  const kvq::SampleWords w = s->NextWords();
  const uint32_t words[6] = {w.top_k, w.exp_scale, w.top_p_q24, w.min_weight, w.draw_lo, w.draw_hi};
  for (int i = 0; i < 6; ++i) out[i] = words[i];
  return 1;
}

/// Words kvq_web_sampler_edits needs at most for `n_recent` tokens held.
EMSCRIPTEN_KEEPALIVE int kvq_web_sampler_edits_capacity(int sampler, int n_recent) {
  const size_t n_bias = SamplerOf(sampler)->options().logit_bias.size();
  return static_cast<int>(2 + 4 * (n_bias + static_cast<size_t>(n_recent)) + n_bias);
}

/// What Sampler::Adjust does to logits [n] after `recent` [n_recent] (the tokens before the one
/// drawn), as the GPU's adjust pass takes it, into out [kvq_web_sampler_edits_capacity]:
/// [0] the edits m, [1] the biases nb, then m edits of 4 u32 (id; where its biases start; their
/// count, bit 31 set for a token in the window; the window's subtrahend count · frequency_penalty
/// + presence_penalty as f32 bits, computed here as Adjust does), then nb f32 biases. m = 0 when
/// the settings adjust nothing (Sample skips Adjust then).
EMSCRIPTEN_KEEPALIVE int kvq_web_sampler_edits(int sampler, const int32_t* recent, int n_recent, int n, uint32_t* out) {
  const kvq::SamplerOptions& o = SamplerOf(sampler)->options();
  out[0] = out[1] = 0;
  if (!o.AdjustsLogits()) return 0;
  struct Edit {
    std::vector<float> biases;
    int32_t count = 0;  // occurrences in the window
  };
  std::vector<int32_t> order;  // the ids edited, first touched first
  std::unordered_map<int32_t, Edit> edits;
  auto edit = [&](int32_t id) -> Edit& {
    auto [it, inserted] = edits.try_emplace(id);
    if (inserted) order.push_back(id);
    return it->second;
  };
  for (const auto& [id, bias] : o.logit_bias) {
    if (id >= 0 && id < n) edit(id).biases.push_back(bias);
  }
  if (o.repeat_last_n != 0) {
    const int window = o.repeat_last_n < 0 ? n_recent : std::min(n_recent, o.repeat_last_n);
    for (int i = n_recent - window; i < n_recent; ++i) {
      if (recent[i] >= 0 && recent[i] < n) ++edit(recent[i]).count;
    }
  }
  uint32_t* records = out + 2;
  std::vector<float> biases;
  for (int32_t id : order) {
    const Edit& e = edits[id];
    const float sub = static_cast<float>(e.count) * o.frequency_penalty + o.presence_penalty;
    const uint32_t record[4] = {static_cast<uint32_t>(id), static_cast<uint32_t>(biases.size()),
                                static_cast<uint32_t>(e.biases.size()) | (e.count > 0 ? 0x80000000u : 0u),
                                std::bit_cast<uint32_t>(sub)};
    for (int i = 0; i < 4; ++i) *records++ = record[i];
    biases.insert(biases.end(), e.biases.begin(), e.biases.end());
  }
  for (float b : biases) *records++ = std::bit_cast<uint32_t>(b);
  out[0] = static_cast<uint32_t>(order.size());
  out[1] = static_cast<uint32_t>(biases.size());
  return static_cast<int>(order.size());
}

/// Sampler::Adjust on logits [n] in place, with `recent` [n_recent] (the CPU steps of a GPU
/// generation after a lost device: then kvq_web_sample_with_words picks from them).
EMSCRIPTEN_KEEPALIVE void kvq_web_sampler_adjust(int sampler, float* logits, int n, const int32_t* recent, int n_recent) {
  kvq::Sampler* s = SamplerOf(sampler);
  if (!s->options().AdjustsLogits()) return;
  std::vector<float> adjusted;  // [n]
  s->Adjust(logits, n, {recent, static_cast<size_t>(n_recent)}, &adjusted);
  std::copy(adjusted.begin(), adjusted.end(), logits);
}

/// kvq::Sampler::Sample on logits [n] after `recent` [n_recent] (the CPU path's pick; its
/// generator advances).
EMSCRIPTEN_KEEPALIVE int kvq_web_sampler_sample(int sampler, const float* logits, int n, const int32_t* recent,
                                                int n_recent) {
  return SamplerOf(sampler)->Sample(logits, n, {recent, static_cast<size_t>(n_recent)});
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
