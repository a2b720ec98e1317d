// Speculative decoding's parts that do not run the model (see include/kvq/speculation.h): the
// prompt-lookup drafter and the gate. Session::Generate runs the passes.
#include "kvq/speculation.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

namespace kvq {

namespace {
// Weight of a new measurement in the smoothed acceptance and pass times.
constexpr double kSmoothing = 0.25;
// Before a pass of b tokens has been timed and only the 1-token pass has: T(b) = T(1)·(1 + s·(b−1)).
// A decode step reads every weight once whatever b is small, so a short pass costs little more.
constexpr double kPriorSlope = 0.1;
// How far a pass without a draft that existed moves the acceptance back toward its prior.
constexpr double kRecovery = 0.02;
constexpr double kPriorAcceptance = 0.5;
}  // namespace

const char* DraftSourceName(DraftSource source) {
  return source == DraftSource::kNgram ? "ngram" : "none";
}

Result<DraftSource> ParseDraftSource(const std::string& name) {
  if (name == "none") return DraftSource::kNone;
  if (name == "ngram") return DraftSource::kNgram;
  return Status::Error(fmt::format("unknown draft source '{}' (expected none or ngram)", name));
}

Status CheckSpeculation(const SpeculationOptions& o) {
  if (o.max_draft < 1 || o.max_draft > 64) {
    return Status::Error(fmt::format("SpeculationOptions::max_draft must be in 1..64 (got {})", o.max_draft));
  }
  if (o.max_ngram < 1 || o.max_ngram > 16) {
    return Status::Error(fmt::format("SpeculationOptions::max_ngram must be in 1..16 (got {})", o.max_ngram));
  }
  if (o.min_ngram < 1 || o.min_ngram > o.max_ngram) {
    return Status::Error(fmt::format("SpeculationOptions::min_ngram must be in 1..max_ngram ({}) (got {})",
                                     o.max_ngram, o.min_ngram));
  }
  return Status::Ok();
}

std::vector<int32_t> DraftByLookup(std::span<const int32_t> seq, int32_t max_tokens,
                                   const SpeculationOptions& o) {
  const int64_t size = static_cast<int64_t>(seq.size());
  if (max_tokens <= 0) return {};
  for (int64_t n = std::min<int64_t>(o.max_ngram, size - 1); n >= o.min_ngram; --n) {
    const std::span<const int32_t> tail = seq.subspan(size - n);
    // The latest earlier occurrence: it starts at i < size − n, so something follows it.
    for (int64_t i = size - n - 1; i >= 0; --i) {
      if (!std::equal(tail.begin(), tail.end(), seq.begin() + i)) continue;
      const int64_t from = i + n;
      const int64_t count = std::min<int64_t>(max_tokens, size - from);
      return {seq.begin() + from, seq.begin() + from + count};
    }
  }
  return {};
}

SpeculationGate::SpeculationGate(int32_t max_draft) : max_draft_(max_draft), seconds_(max_draft + 1, 0.0) {}

double SpeculationGate::PassSeconds(int32_t tokens) const {
  if (seconds_[tokens - 1] > 0) return seconds_[tokens - 1];
  // Timed counts, with the 1-token pass estimated from the shortest timed one when it has not run.
  std::vector<std::pair<int32_t, double>> timed;  // (tokens, seconds), increasing tokens
  for (int32_t b = 1; b <= max_draft_ + 1; ++b) {
    if (seconds_[b - 1] > 0) timed.emplace_back(b, seconds_[b - 1]);
  }
  if (timed.empty()) return 1.0 + kPriorSlope * (tokens - 1);  // only ratios matter to Choose
  if (timed.front().first != 1) {
    const auto [b, t] = timed.front();
    timed.insert(timed.begin(), {1, t / (1.0 + kPriorSlope * (b - 1))});
  }
  // Between the nearest timed counts, linearly; past the largest, along the line from the 1-token
  // pass to it (the prior's slope when only the 1-token pass is known).
  for (size_t i = 1; i < timed.size(); ++i) {
    if (timed[i].first > tokens) {
      const auto [b0, t0] = timed[i - 1];
      const auto [b1, t1] = timed[i];
      return t0 + (t1 - t0) * (tokens - b0) / (b1 - b0);
    }
  }
  const auto [b, t] = timed.back();
  const double t1 = timed.front().second;
  const double slope = b > 1 ? std::max(0.0, (t - t1) / (b - 1)) : kPriorSlope * t1;
  return t + slope * (tokens - b);
}

int32_t SpeculationGate::Choose(int32_t available) const {
  const int32_t most = std::min(available, max_draft_);
  // Tokens a pass of k drafts yields on average: 1 + a + a² + … + a^k (a draft stops at its first
  // rejected token), per second of such a pass.
  int32_t best = 0;
  double best_rate = 1.0 / PassSeconds(1), yield = 1.0, term = 1.0;
  for (int32_t k = 1; k <= most; ++k) {
    term *= acceptance_;
    yield += term;
    const double rate = yield / PassSeconds(k + 1);
    if (rate > best_rate) {
      best = k;
      best_rate = rate;
    }
  }
  return best;
}

void SpeculationGate::Record(int32_t drafted, int32_t accepted, double seconds, bool gated) {
  double& t = seconds_[drafted];
  t = t > 0 ? t + kSmoothing * (seconds - t) : seconds;
  if (drafted > 0) {
    // A draft's tokens after its first rejection were never judged: count those judged.
    const int32_t judged = std::min(drafted, accepted + 1);
    const double share = static_cast<double>(accepted) / judged;
    acceptance_ += kSmoothing * (share - acceptance_);
  } else if (gated) {
    acceptance_ += kRecovery * (kPriorAcceptance - acceptance_);
  }
}

}  // namespace kvq
