// Fast Walsh-Hadamard rotation (see hadamard.h). Scalar on purpose: a row is rotated once when it
// is appended and a query once per attention call — d·log2(d) additions, a vanishing share of the
// encode and attention work — so one readable loop is the reference and the fast path at once.
#include "formats/transforms/hadamard.h"

#include <cmath>

namespace kvq {
namespace {

// In place, unnormalised: x ← H x (Sylvester ordering), log2(d) stages of butterflies.
void Fwht(float* x, int32_t d) {
  for (int32_t half = 1; half < d; half *= 2) {
    for (int32_t block = 0; block < d; block += 2 * half) {
      for (int32_t i = block; i < block + half; ++i) {
        const float a = x[i], b = x[i + half];
        x[i] = a + b;
        x[i + half] = a - b;
      }
    }
  }
}

}  // namespace

std::vector<float> RotationSigns(uint64_t seed, int32_t d) {
  // splitmix64: a fixed, portable stream (std:: distributions differ between libraries).
  uint64_t state = seed ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(d));
  std::vector<float> signs(static_cast<size_t>(d));
  for (float& s : signs) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    s = (z >> 63) ? -1.0f : 1.0f;
  }
  return signs;
}

void RotateHeads(const float* signs, int32_t d, int64_t n_heads, float* x) {
  const float norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  for (int64_t h = 0; h < n_heads; ++h, x += d) {
    for (int32_t i = 0; i < d; ++i) x[i] *= signs[i];  // exact: a sign flip
    Fwht(x, d);
    for (int32_t i = 0; i < d; ++i) x[i] *= norm;
  }
}

void UnrotateHeads(const float* signs, int32_t d, int64_t n_heads, float* x) {
  const float norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  for (int64_t h = 0; h < n_heads; ++h, x += d) {
    Fwht(x, d);
    for (int32_t i = 0; i < d; ++i) x[i] = x[i] * norm * signs[i];
  }
}

double RotationRoundTripBound(int32_t d) {
  // Per direction: each stage's additions round each element once (relative error ≤ u of the
  // stage's output, whose norm grows by √2 per stage — a relative error ≤ u·√(stages) in 2-norm
  // at worst summed linearly: ≤ u·log2(d)), the scaling by a rounded 1/√d twice more (≤ 2u).
  // Both directions: 2·(log2(d) + 2)·u, and a 1% margin for the second-order terms.
  const double u = std::ldexp(1.0, -24);
  const double stages = std::log2(static_cast<double>(d));
  return 2.0 * (stages + 2.0) * u * 1.01;
}

}  // namespace kvq
