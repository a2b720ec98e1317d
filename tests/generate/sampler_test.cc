// The sampler (src/generate/sampler.h): greedy is the argmax with the lowest id winning a tie;
// top-k, top-p and min-p each keep exactly the tokens their definition allows (a token outside is
// never drawn, over many draws and seeds, while without the filter it is drawn); the draws follow
// the softmax of logits / temperature over what is kept, within a derived binomial bound; a seed
// gives one sequence. Each test fails against a sampler with one bug put in (temperature ignored,
// top-p cut one short, min-p or top-k skipped, the last of tied maxima, the seed ignored).
#include "generate/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

namespace kvq {
namespace {

// Logits [n] drawn N(0, scale^2) from `seed`: distinct with probability 1.
std::vector<float> RandomLogits(int32_t n, uint64_t seed, float scale = 2.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> logits(n);
  for (float& l : logits) l = normal(rng);
  return logits;
}

// softmax(logits / temperature) in double: [n].
std::vector<double> Softmax(const std::vector<float>& logits, double temperature) {
  const double top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) sum += p[i] = std::exp((logits[i] - top) / temperature);
  for (double& x : p) x /= sum;
  return p;
}

// Ids by descending probability (ties: lower id first, as the sampler orders them).
std::vector<int32_t> ByProbability(const std::vector<double>& p) {
  std::vector<int32_t> ids(p.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  return ids;
}

// Counts [n] of `draws` samples from one sampler.
std::vector<int64_t> Counts(const std::vector<float>& logits, SamplerOptions options, int64_t draws) {
  Sampler sampler(options);
  std::vector<int64_t> counts(logits.size(), 0);
  for (int64_t i = 0; i < draws; ++i) {
    const int32_t id = sampler.Sample(logits.data(), static_cast<int32_t>(logits.size()));
    EXPECT_GE(id, 0);
    EXPECT_LT(id, static_cast<int32_t>(logits.size()));
    if (id >= 0 && id < static_cast<int32_t>(logits.size())) ++counts[id];
  }
  return counts;
}

// Each count is Binomial(draws, q_i) where q is `expected` (zero outside the kept set). The bound is
// 5 standard deviations, plus the bias of the sampler's integer weights times draws, plus one count
// for the discrete edge. The weights' relative error: the log2 exponent read to 2^-20 (2^-20 · ln 2),
// the table's rounding (2^-31 twice), the logit gap read to 2^-20 (2^-20 · log2(e) / T in the
// exponent, T ≥ 0.5 here: under 2^-18.4) and the scale's rounding (2^-25 of an exponent under 32:
// 2^-20): under 2^-17.5 per weight, so 2^-16 of q bounds the bias of a ratio of sums of them. A kept
// token with q = 0 must never appear.
void ExpectFrequencies(const std::vector<int64_t>& counts, const std::vector<double>& expected,
                       int64_t draws, const std::string& what) {
  for (size_t i = 0; i < counts.size(); ++i) {
    const double q = expected[i];
    if (q == 0) {
      EXPECT_EQ(counts[i], 0) << what << ": token " << i << " is outside the kept set";
      continue;
    }
    const double mean = static_cast<double>(draws) * q;
    const double sigma = std::sqrt(static_cast<double>(draws) * q * (1 - q));
    const double bound = 5 * sigma + mean * std::ldexp(1.0, -16) + 1;
    EXPECT_NEAR(static_cast<double>(counts[i]), mean, bound) << what << ": token " << i << ", q " << q;
  }
}

SamplerOptions Unfiltered(float temperature, uint64_t seed) {
  return {.temperature = temperature, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = seed};
}

TEST(Sampler, GreedyIsTheArgmax) {
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const std::vector<float> logits = RandomLogits(100, seed);
    const int32_t argmax =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    // Greedy ignores the filters and the generator: every seed and setting gives the argmax.
    Sampler sampler({.temperature = 0.0f, .top_k = 5, .top_p = 0.5f, .min_p = 0.5f, .seed = seed});
    for (int rep = 0; rep < 3; ++rep) EXPECT_EQ(sampler.Sample(logits.data(), 100), argmax);
  }
}

TEST(Sampler, GreedyTieGoesToTheLowestId) {
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 3.0f, 3.0f, 2.9f};
  Sampler sampler({.temperature = 0.0f});
  EXPECT_EQ(sampler.Sample(logits.data(), 6), 1);
  // The lowest id wins wherever the tie sits.
  const std::vector<float> late = {-2.0f, -2.0f, 7.0f, 1.0f, 7.0f};
  EXPECT_EQ(sampler.Sample(late.data(), 5), 2);
}

TEST(Sampler, TopKOfOneIsGreedy) {
  for (uint64_t seed = 0; seed < 50; ++seed) {
    std::vector<float> logits = RandomLogits(64, seed);
    if (seed % 2 == 1) logits[40] = logits[7] = *std::max_element(logits.begin(), logits.end()) + 1;
    Sampler greedy({.temperature = 0.0f, .seed = seed});
    Sampler top1({.temperature = 1.5f, .top_k = 1, .top_p = 1.0f, .min_p = 0.0f, .seed = seed});
    const int32_t want = greedy.Sample(logits.data(), 64);
    if (seed % 2 == 1) {
      EXPECT_EQ(want, 7);  // the tie: the lowest id, in both
    }
    for (int rep = 0; rep < 20; ++rep) EXPECT_EQ(top1.Sample(logits.data(), 64), want) << seed;
  }
}

TEST(Sampler, TemperatureDrawsFollowTheSoftmax) {
  const std::vector<float> logits = {1.0f, 0.0f, -0.5f, 2.0f, 0.3f, -2.0f, 1.2f, 0.9f};
  constexpr int64_t kDraws = 200000;
  for (const float t : {0.5f, 1.0f, 2.0f}) {
    const std::vector<int64_t> counts = Counts(logits, Unfiltered(t, 11), kDraws);
    ExpectFrequencies(counts, Softmax(logits, t), kDraws, "temperature " + std::to_string(t));
  }
  // The bound separates temperatures: the top token (id 3) has p 0.664 at T = 0.5 and 0.389 at
  // T = 1: about 54 900 of 200 000 draws apart, against a 5-sigma bound of about 1 090, so the check above
  // would fail if the temperature were ignored.
  const std::vector<int64_t> cold = Counts(logits, Unfiltered(0.5f, 11), kDraws);
  const double p1 = Softmax(logits, 1.0)[3];
  EXPECT_GT(std::abs(static_cast<double>(cold[3]) - kDraws * p1),
            5 * std::sqrt(kDraws * p1 * (1 - p1)));
}

TEST(Sampler, TopKKeepsTheKLargestAndRenormalises) {
  const std::vector<float> logits = RandomLogits(20, 3, 1.0f);
  const std::vector<double> p = Softmax(logits, 1.0);
  const std::vector<int32_t> order = ByProbability(p);
  constexpr int64_t kDraws = 100000;
  for (const int32_t k : {2, 5, 12}) {
    std::vector<double> expected(20, 0.0);
    double kept = 0;
    for (int32_t i = 0; i < k; ++i) kept += p[order[i]];
    for (int32_t i = 0; i < k; ++i) expected[order[i]] = p[order[i]] / kept;
    SamplerOptions o = Unfiltered(1.0f, 100 + k);
    o.top_k = k;
    ExpectFrequencies(Counts(logits, o, kDraws), expected, kDraws, "top-k " + std::to_string(k));
  }
}

// The smallest prefix of the tokens by probability whose mass reaches top_p, as ids.
std::set<int32_t> NucleusOf(const std::vector<double>& p, double top_p) {
  std::set<int32_t> kept;
  double mass = 0;
  for (const int32_t id : ByProbability(p)) {
    kept.insert(id);
    mass += p[id];
    if (mass >= top_p) break;
  }
  return kept;
}

TEST(Sampler, TopPKeepsTheNucleus) {
  // Probabilities 0.4, 0.3, 0.2, 0.1 (logits are their logs): top_p 0.35 keeps the first alone,
  // 0.65 the first two (0.4 < 0.65 <= 0.7), 0.85 the first three; no boundary lies within float
  // rounding of a cumulative sum.
  const std::vector<float> logits = {std::log(0.2f), std::log(0.4f), std::log(0.1f), std::log(0.3f)};
  const std::vector<double> p = Softmax(logits, 1.0);
  constexpr int64_t kDraws = 100000;
  for (const float top_p : {0.35f, 0.65f, 0.85f}) {
    const std::set<int32_t> nucleus = NucleusOf(p, top_p);
    ASSERT_EQ(nucleus.size(), top_p < 0.4f ? 1u : top_p < 0.7f ? 2u : 3u);
    double mass = 0;
    for (const int32_t id : nucleus) mass += p[id];
    std::vector<double> expected(4, 0.0);
    for (const int32_t id : nucleus) expected[id] = p[id] / mass;
    SamplerOptions o = Unfiltered(1.0f, 7);
    o.top_p = top_p;
    ExpectFrequencies(Counts(logits, o, kDraws), expected, kDraws, "top-p " + std::to_string(top_p));
  }
  // Without the filter the least likely token is drawn (so the zero counts above mean something).
  EXPECT_GT(Counts(logits, Unfiltered(1.0f, 7), 10000)[2], 0);
}

TEST(Sampler, MinPKeepsTokensWithinAFactorOfTheTop) {
  // p = 0.5, 0.25, 0.15, 0.1: min_p 0.4 keeps p >= 0.2 (two tokens), min_p 0.25 keeps p >= 0.125
  // (three), min_p 0.1 keeps all four.
  const std::vector<float> logits = {std::log(0.15f), std::log(0.1f), std::log(0.5f), std::log(0.25f)};
  const std::vector<double> p = Softmax(logits, 1.0);
  constexpr int64_t kDraws = 100000;
  for (const float min_p : {0.4f, 0.25f, 0.1f}) {
    std::vector<double> expected(4, 0.0);
    double mass = 0;
    const double p_max = *std::max_element(p.begin(), p.end());
    for (size_t i = 0; i < 4; ++i) {
      if (p[i] >= min_p * p_max) mass += expected[i] = p[i];
    }
    for (double& q : expected) q /= mass;
    SamplerOptions o = Unfiltered(1.0f, 9);
    o.min_p = min_p;
    ExpectFrequencies(Counts(logits, o, kDraws), expected, kDraws, "min-p " + std::to_string(min_p));
  }
}

// Many seeds and random logits, every filter at once: a drawn token is always in the set the
// filters allow, computed here from their definitions in llama.cpp's order (top-k, softmax with
// temperature, top-p, min-p).
TEST(Sampler, CombinedFiltersNeverDrawOutsideTheAllowedSet) {
  constexpr int32_t kVocab = 50;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    const std::vector<float> logits = RandomLogits(kVocab, 1000 + seed, 1.5f);
    const SamplerOptions o{.temperature = 0.7f + 0.05f * static_cast<float>(seed % 10),
                           .top_k = 10 + static_cast<int32_t>(seed % 15),
                           .top_p = 0.6f + 0.01f * static_cast<float>(seed % 30),
                           .min_p = 0.02f * static_cast<float>(seed % 8),
                           .seed = seed};
    const std::vector<double> p_all = Softmax(logits, o.temperature);
    const std::vector<int32_t> order = ByProbability(p_all);
    std::vector<double> p(kVocab, 0.0);  // softmax over the top k
    double mass_k = 0;
    for (int32_t i = 0; i < o.top_k; ++i) mass_k += p_all[order[i]];
    for (int32_t i = 0; i < o.top_k; ++i) p[order[i]] = p_all[order[i]] / mass_k;
    std::set<int32_t> allowed;
    double mass = 0;
    for (int32_t i = 0; i < o.top_k && (allowed.empty() || mass < o.top_p); ++i) {
      allowed.insert(order[i]);
      mass += p[order[i]];
    }
    const double p_max = p[order[0]];
    for (auto it = allowed.begin(); it != allowed.end();) {
      it = p[*it] >= o.min_p * p_max ? std::next(it) : allowed.erase(it);
    }
    Sampler sampler(o);
    std::set<int32_t> drawn;
    for (int i = 0; i < 2000; ++i) drawn.insert(sampler.Sample(logits.data(), kVocab));
    for (const int32_t id : drawn) {
      EXPECT_TRUE(allowed.count(id)) << "seed " << seed << ": token " << id << " (p " << p[id]
                                     << ") is outside the " << allowed.size() << " allowed";
    }
  }
}

TEST(Sampler, SameSeedSameSequence) {
  const std::vector<float> logits = RandomLogits(32, 5, 0.5f);
  auto sequence = [&](uint64_t seed) {
    Sampler sampler({.temperature = 1.0f, .top_k = 0, .top_p = 0.95f, .min_p = 0.0f, .seed = seed});
    std::vector<int32_t> ids;
    for (int i = 0; i < 300; ++i) ids.push_back(sampler.Sample(logits.data(), 32));
    return ids;
  };
  EXPECT_EQ(sequence(42), sequence(42));
  // Another seed gives another sequence (300 draws over ~30 tokens: equal by chance ~never).
  EXPECT_NE(sequence(42), sequence(43));
}

// The chain at temperature > 0 is SampleWithWords on the words of the generator's next draw (what
// the GPU sampler runs): a Sampler and the words of a twin with the same seed pick the same ids,
// with every filter on and off, and an id the words' draw does not pick when the draw changes.
TEST(Sampler, SampleIsSampleWithTheNextWords) {
  const std::vector<float> logits = RandomLogits(500, 77, 3.0f);
  int32_t changed = 0;
  for (uint64_t seed = 0; seed < 60; ++seed) {
    const SamplerOptions o{.temperature = 0.6f + 0.1f * static_cast<float>(seed % 5),
                           .top_k = seed % 3 == 0 ? 0 : 40, .top_p = seed % 2 ? 0.9f : 1.0f,
                           .min_p = seed % 4 == 0 ? 0.05f : 0.0f, .seed = seed};
    Sampler sampler(o), twin(o);
    for (int i = 0; i < 20; ++i) {
      SampleWords words = twin.NextWords();
      const int32_t id = SampleWithWords(words, logits.data(), 500);
      EXPECT_EQ(sampler.Sample(logits.data(), 500), id) << "seed " << seed << ", draw " << i;
      words.draw_hi ^= 0x80000000u;
      changed += SampleWithWords(words, logits.data(), 500) != id;
    }
  }
  EXPECT_GT(changed, 100);  // of 1200: the draw reaches the pick
}

// The table of 2^-x, computed in integers, against the double exp2: each entry the rounding of
// 2^31 · 2^-x to within 0.5 plus the double's error (2^31 · 2^-52 relative: under 2^-20).
TEST(Sampler, Exp2TableIsTheRoundedPower) {
  const uint32_t* table = SampleExp2Table();
  for (int j = 0; j < 1024; ++j) {
    EXPECT_NEAR(table[j], std::ldexp(std::exp2(-j / 1024.0), 31), 0.5 + std::ldexp(1.0, -20)) << j;
    EXPECT_NEAR(table[1024 + j], std::ldexp(std::exp2(-j / 1048576.0), 31), 0.5 + std::ldexp(1.0, -20)) << j;
  }
  EXPECT_EQ(table[0], 1u << 31);
}

// Every logit refused (-infinity): 0, and the draw is still taken (the GPU's host draws once per
// sampled token whatever the logits).
TEST(Sampler, AllRefusedGivesZeroAndDraws) {
  const std::vector<float> refused(8, -std::numeric_limits<float>::infinity());
  const std::vector<float> logits = RandomLogits(8, 3);
  const SamplerOptions o{.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 9};
  Sampler a(o), b(o);
  EXPECT_EQ(a.Sample(refused.data(), 8), 0);
  b.NextWords();
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.Sample(logits.data(), 8), b.Sample(logits.data(), 8));
}

}  // namespace
}  // namespace kvq
