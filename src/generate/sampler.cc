// Sampler (see sampler.h): filters in llama.cpp's usual order — top-k, then softmax with
// temperature, then top-p, then min-p — and one draw from what is left. After top-k every step
// is integer arithmetic (weights from a table, 64-bit sums), so web/gpu/sample_kernels.js, which
// mirrors SampleWithWords op for op, sums in parallel and still picks the same id.
#include "generate/sampler.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

namespace kvq {

Sampler::Sampler(SamplerOptions options) : o_(options), rng_(options.seed) {}

void Sampler::Adjust(const float* logits, int32_t n, std::span<const int32_t> recent, std::vector<float>* out) {
  out->assign(logits, logits + n);
  for (const auto& [id, bias] : o_.logit_bias) {
    if (id >= 0 && id < n) (*out)[id] += bias;
  }
  if (o_.repeat_last_n == 0) return;
  const size_t window = o_.repeat_last_n < 0 ? recent.size() : std::min<size_t>(recent.size(), o_.repeat_last_n);
  const std::span<const int32_t> last = recent.subspan(recent.size() - window);
  window_counts_.resize(n, 0);
  for (int32_t id : last) {
    if (id >= 0 && id < n) ++window_counts_[id];
  }
  for (int32_t id : last) {
    if (id < 0 || id >= n || window_counts_[id] == 0) continue;  // each distinct token once
    float& l = (*out)[id];
    l = l > 0 ? l / o_.repeat_penalty : l * o_.repeat_penalty;
    l -= static_cast<float>(window_counts_[id]) * o_.frequency_penalty + o_.presence_penalty;
    window_counts_[id] = 0;
  }
}

int32_t Sampler::Sample(const float* logits, int32_t n, std::span<const int32_t> recent) {
  if (o_.AdjustsLogits()) {
    Adjust(logits, n, recent, &adjusted_);
    logits = adjusted_.data();
  }
  if (o_.temperature <= 0.0f) {
    return static_cast<int32_t>(std::max_element(logits, logits + n) - logits);  // first max wins
  }
  return SampleWithWords(NextWords(), logits, n, &scratch_);
}

namespace {

// a · b as 128 bits {high, low}, from 32-bit halves (the GPU kernels' way; ISO C++ has no 128-bit type).
struct U128 {
  uint64_t hi, lo;
};
U128 Mul128(uint64_t a, uint64_t b) {
  const uint64_t a0 = a & 0xffffffffu, a1 = a >> 32, b0 = b & 0xffffffffu, b1 = b >> 32;
  const uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
  const uint64_t mid = (p00 >> 32) + (p01 & 0xffffffffu) + (p10 & 0xffffffffu);
  return {p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32), (mid << 32) | (p00 & 0xffffffffu)};
}
// (a · b) >> s for 0 < s < 64 (the caller knows the result fits in 64 bits).
uint64_t MulShift(uint64_t a, uint64_t b, int s) {
  const U128 p = Mul128(a, b);
  return (p.hi << (64 - s)) | (p.lo >> s);
}

// 2^-x for x = numerator / 2^denominator_log2 in [0, 1), in Q62, by e^-t = Σ (-t)^k / k! in
// integers (t = x·ln 2 < 0.7: 30 terms leave an error far below the 2^-31 the table keeps).
uint64_t Exp2NegQ62(uint64_t numerator, int denominator_log2) {
  constexpr uint64_t kOne = 1ULL << 62;
  constexpr uint64_t kLn2Q62 = 0x2c5c85fdf473de6aULL;  // floor(ln 2 · 2^62)
  const uint64_t t = MulShift(numerator, kLn2Q62, denominator_log2);
  uint64_t term = kOne, sum = kOne;
  for (uint64_t k = 1; k <= 30; ++k) {
    term = MulShift(term, t, 62) / k;
    sum = k % 2 ? sum - term : sum + term;
  }
  return sum;
}

std::array<uint32_t, 2048> MakeExp2Table() {
  std::array<uint32_t, 2048> table{};
  for (uint64_t j = 0; j < 1024; ++j) {
    table[j] = static_cast<uint32_t>((Exp2NegQ62(j, 10) + (1ULL << 30)) >> 31);
    table[1024 + j] = static_cast<uint32_t>((Exp2NegQ62(j, 20) + (1ULL << 30)) >> 31);
  }
  return table;
}

// A logit in units of 2^-20, clamped to [-2048, 2047] (truncated toward zero: the float product
// by 2^20 is exact, so this is the logit's own value, cut).
int32_t LogitQ20(float logit) { return static_cast<int32_t>(std::clamp(logit, -2048.0f, 2047.0f) * 1048576.0f); }

// The weight of a logit `below` the top one: round-ish 2^31 · 2^-y with y = (top - logit) ·
// log2(e) / temperature, y read to 2^-20 (its integer part a shift, its fraction two table rows).
// Non-increasing in `below`, 2^31 at the top, 0 beyond 2^-31.
uint32_t Weight(uint32_t below, uint32_t exp_scale, const uint32_t* table) {
  const uint64_t y = (static_cast<uint64_t>(below) * exp_scale) >> 24;  // log2 units · 2^20
  const uint64_t whole = y >> 20;
  if (whole >= 32) return 0;
  const uint32_t frac = static_cast<uint32_t>(y & 0xfffff);
  const uint64_t m = static_cast<uint64_t>(table[frac >> 10]) * table[1024 + (frac & 1023)];  // < 2^62
  return static_cast<uint32_t>(m >> (31 + whole));
}

}  // namespace

const uint32_t* SampleExp2Table() {
  static const std::array<uint32_t, 2048> table = MakeExp2Table();
  return table.data();
}

SampleWords SampleWordsOf(const SamplerOptions& o, uint64_t draw) {
  SampleWords w;
  w.top_k = o.top_k > 0 ? static_cast<uint32_t>(o.top_k) : 0;
  // Correctly rounded double division and rounding: the same words on every machine.
  const double scale = std::round(1.4426950408889634 / static_cast<double>(o.temperature) * 16777216.0);
  w.exp_scale = scale >= 4294967295.0 ? 0xffffffffu : static_cast<uint32_t>(scale);
  w.top_p_q24 = o.top_p >= 1.0f ? (1u << 24) : o.top_p <= 0.0f ? 0u : static_cast<uint32_t>(o.top_p * 16777216.0f);
  w.min_weight = o.min_p <= 0.0f ? 0u
               : o.min_p >= 1.0f ? (1u << 31)
                                 : static_cast<uint32_t>(std::ceil(static_cast<double>(o.min_p) * 2147483648.0));
  w.draw_lo = static_cast<uint32_t>(draw);
  w.draw_hi = static_cast<uint32_t>(draw >> 32);
  return w;
}

int32_t SampleWithWords(const SampleWords& words, const float* logits, int32_t n) {
  std::vector<SampleCandidate> scratch;
  return SampleWithWords(words, logits, n, &scratch);
}

int32_t SampleWithWords(const SampleWords& words, const float* logits, int32_t n, std::vector<SampleCandidate>* c) {
  // A token at -infinity (refused by a grammar: Generator::Constrain) can never be drawn.
  constexpr float kRefused = -std::numeric_limits<float>::infinity();
  c->clear();
  for (int32_t i = 0; i < n; ++i) {
    if (logits[i] != kRefused) c->push_back({logits[i], i, 0});
  }
  if (c->empty()) return 0;  // every token refused: nothing to draw from
  // By logit, descending; a tie: the lower id first (a total order, so any sort gives this).
  auto by_logit = [](const SampleCandidate& a, const SampleCandidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  size_t keep = c->size();
  if (words.top_k > 0 && words.top_k < keep) {
    keep = words.top_k;
    std::partial_sort(c->begin(), c->begin() + static_cast<ptrdiff_t>(keep), c->end(), by_logit);
  } else {
    std::sort(c->begin(), c->end(), by_logit);
  }
  c->resize(keep);
  // Weights ∝ exp((logit - top) / temperature), the top one 2^31: integers from here on, so every
  // sum is exact in any order.
  const uint32_t* table = SampleExp2Table();
  const uint32_t top = static_cast<uint32_t>(LogitQ20((*c)[0].logit));
  uint64_t total = 0;
  for (SampleCandidate& x : *c) {
    x.weight = Weight(top - static_cast<uint32_t>(LogitQ20(x.logit)), words.exp_scale, table);
    total += x.weight;
  }
  // Top-p: the shortest prefix whose weight reaches top_p of the total (rounded up).
  const U128 product = Mul128(total, words.top_p_q24);
  const uint64_t threshold = MulShift(total, words.top_p_q24, 24) + ((product.lo & 0xffffff) != 0 ? 1 : 0);
  uint64_t cumulative = 0;
  size_t cut = 0;
  while (cut < keep) {
    cumulative += (*c)[cut++].weight;
    if (cumulative >= threshold) break;
  }
  // Min-p: weights at least min_p times the top's (weights never grow along the order).
  size_t floor_cut = 1;
  while (floor_cut < cut && (*c)[floor_cut].weight >= words.min_weight) ++floor_cut;
  keep = floor_cut;
  uint64_t kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += (*c)[i].weight;
  // The draw: r uniform in [0, kept) (the 64-bit number scaled by kept), the first token whose
  // running weight passes it.
  const uint64_t draw = static_cast<uint64_t>(words.draw_hi) << 32 | words.draw_lo;
  const uint64_t r = Mul128(draw, kept).hi;
  uint64_t running = 0;
  for (size_t i = 0; i < keep; ++i) {
    running += (*c)[i].weight;
    if (running > r) return (*c)[i].id;
  }
  return (*c)[keep - 1].id;  // unreachable: running reaches kept > r
}

}  // namespace kvq

namespace kvq {

TokenLogprobs LogprobsOf(std::span<const float> logits, int32_t token, int32_t top) {
  TokenLogprobs out;
  if (logits.empty()) return out;
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  const double log_sum = max + std::log(sum);
  auto logprob = [&](int32_t id) { return static_cast<float>(logits[id] - log_sum); };
  if (token >= 0 && static_cast<size_t>(token) < logits.size()) out.chosen = {token, logprob(token)};
  const size_t k = std::min<size_t>(std::max(top, 0), logits.size());
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (size_t i = 0; i < k; ++i) out.top.push_back({ids[i], logprob(ids[i])});
  return out;
}

}  // namespace kvq
