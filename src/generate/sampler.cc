// Sampler (see sampler.h): filters in llama.cpp's usual order — top-k, then softmax with
// temperature, then top-p, then min-p — and one draw from what is left.
#include "generate/sampler.h"

#include <algorithm>
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
  candidates_.clear();
  // A token at -infinity (refused by a grammar: Generator::Constrain) can never be drawn; without
  // one every logit is finite and this keeps them all, as before.
  constexpr float kRefused = -std::numeric_limits<float>::infinity();
  for (int32_t i = 0; i < n; ++i) {
    if (logits[i] != kRefused) candidates_.emplace_back(logits[i], i);
  }
  if (candidates_.empty()) return 0;  // every token refused: nothing to draw from
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t keep = candidates_.size();
  if (o_.top_k > 0 && static_cast<size_t>(o_.top_k) < keep) {
    keep = o_.top_k;
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
    candidates_.resize(keep);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  // Softmax with temperature (max subtracted), in sorted order.
  const float top = candidates_[0].first;
  double sum = 0;
  for (auto& c : candidates_) {
    c.first = std::exp((c.first - top) / o_.temperature);
    sum += c.first;
  }
  for (auto& c : candidates_) c.first = static_cast<float>(c.first / sum);
  if (o_.top_p < 1.0f) {
    double cumulative = 0;
    size_t cut = candidates_.size();
    for (size_t i = 0; i < candidates_.size(); ++i) {
      cumulative += candidates_[i].first;
      if (cumulative >= o_.top_p) {
        cut = i + 1;
        break;
      }
    }
    candidates_.resize(cut);
  }
  if (o_.min_p > 0.0f) {
    const float floor = o_.min_p * candidates_[0].first;
    size_t cut = 1;
    while (cut < candidates_.size() && candidates_[cut].first >= floor) ++cut;
    candidates_.resize(cut);
  }
  double total = 0;
  for (const auto& c : candidates_) total += c.first;
  std::uniform_real_distribution<double> unit(0.0, total);
  double r = unit(rng_);
  for (const auto& c : candidates_) {
    r -= c.first;
    if (r <= 0) return c.second;
  }
  return candidates_.back().second;
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
