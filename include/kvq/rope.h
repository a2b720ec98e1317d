// Rotary position embedding: the two pairings Llama-family checkpoints use, and the frequency
// scalings that stretch a model's context (linear, and Llama 3.1's per-frequency factors).
//
// A head rotates its first d numbers (d = rotary_dims, or head_dim when 0: partial rotation, as
// Qwen3-Next's 64 of 256, leaves the rest as they are). For pair i (0 ≤ i < d/2) at position p the
// pair is rotated by the angle
//   p · s · θ^(−2i/d) / f_i        (s: linear position scale, f_i: frequency factor, 1 by default)
// Pairings:
//   kAdjacent  (llama, mistral in GGUF): numbers (2i, 2i+1) of a head — llama2.c's layout; the
//              GGUF converters permute Q and K rows into it.
//   kHalves    (qwen2, "NeoX"): numbers (i, i + d/2) of a head.
// In kvq_base because two layers rotate by it: the model (q and k) and attention (a "prerope" key
// spec's keys, stored before RoPE and rotated as they are read) — one implementation, one set of
// bits.
#pragma once

#include <cstdint>
#include <vector>

namespace kvq {

enum class RopePairing { kAdjacent, kHalves };

struct RopeParams {
  float theta = 10000.0f;
  RopePairing pairing = RopePairing::kAdjacent;
  float position_scale = 1.0f;         ///< linear scaling: 1 / rope.scaling.factor
  const float* freq_factors =
      nullptr;              ///< [rotary dims / 2] divisors of each pair's frequency, or none
  int32_t rotary_dims = 0;  ///< numbers rotated per head (even); 0: the whole head
};

/// RopeParams with its frequency factors owned: what a KV cache keeps to rotate pre-RoPE keys
/// (KvCacheConfig::key_rope).
struct RopeConfig {
  float theta = 10000.0f;
  RopePairing pairing = RopePairing::kAdjacent;
  float position_scale = 1.0f;
  std::vector<float> freq_factors;  ///< [rotary dims / 2], or empty
  int32_t rotary_dims = 0;          ///< as RopeParams::rotary_dims
  /// The view ApplyRope takes; valid while this config lives.
  RopeParams Params() const {
    return {.theta = theta,
            .pairing = pairing,
            .position_scale = position_scale,
            .freq_factors = freq_factors.empty() ? nullptr : freq_factors.data(),
            .rotary_dims = rotary_dims};
  }
  bool operator==(const RopeConfig&) const = default;
};

/// Rotates `n` numbers holding n / head_dim heads, at position `pos`.
void ApplyRope(float* v, int32_t n, int32_t head_dim, int64_t pos, const RopeParams& params);
/// The cos and sin ApplyRope rotates pair i by at position `pos`: cos_sin [rot / 2][2] (rot:
/// rotary_dims, or head_dim when 0) — the same bits, for a device that rotates keys itself.
void RopeCosSin(int32_t head_dim, int64_t pos, const RopeParams& params, float* cos_sin);
/// ApplyRope with the cos and sin given (RopeCosSin's): ApplyRope is RopeCosSin then this.
void RotateByCosSin(float* v, int32_t n, int32_t head_dim, const float* cos_sin, RopePairing pairing,
                    int32_t rotary_dims);

/// Llama 3.1's frequency scaling, as in its reference code: wavelengths shorter than
/// original_context / high_freq_factor keep their frequency, longer than original_context /
/// low_freq_factor are divided by factor, and those between blend the two smoothly.
struct Llama3RopeScaling {
  float factor = 8.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int32_t original_context = 8192;
};

/// The per-pair divisors of that scaling ([head_dim / 2]: 1 for kept frequencies, `factor` for
/// divided ones) — what llama.cpp's converter stores as the `rope_freqs.weight` tensor.
std::vector<float> Llama3RopeFreqFactors(int32_t head_dim, float theta, const Llama3RopeScaling& scaling);

}  // namespace kvq
