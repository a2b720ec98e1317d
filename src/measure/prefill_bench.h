// `kvq bench prefill`: real prefill speed per KV format and prompt length (issue 16). A prompt of
// real tokens is run through DecoderModel::ForwardBlock in kvq's blocks of 64 into a fresh KvCache
// of each format (formats as interleaved arms), the forward pass's ForwardProfile splitting the
// time into weights, attention and the rest, and each figure is set beside its compute ceiling:
// the multiply-adds it needs over the peak rate measured in the same run (measure/roofline.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvq/format.h"
#include "kvq/kv_spec.h"
#include "kvq/status.h"
#include "measure/roofline.h"
#include "model/decoder.h"

namespace kvq {

/// Tokens per ForwardBlock, as Session::Prefill and Generate's prefill cut a prompt.
inline constexpr int32_t kPrefillBenchBlock = 64;

/// Multiply-adds a prefill needs, split by the peak they are held to: a weight type with a
/// quantised activation (Q8_0, Q4_0, the K-quants, ...) runs integer dots, the plain types (F32,
/// F16, BF16) f32 FMAs.
struct WeightMacs {
  int64_t int8_per_token = 0;  ///< Σ rows·cols of the layer matrices of quantised-activation types
  int64_t f32_per_token = 0;   ///< the same for the plain types
  int64_t int8_classifier = 0; ///< the classifier's rows·cols (run once per prompt) by its type
  int64_t f32_classifier = 0;
  int64_t per_token() const { return int8_per_token + f32_per_token; }
  /// Every weight multiply-add of a prompt of `n` tokens: n · per token + the classifier once.
  int64_t ForPrompt(int64_t n) const { return n * per_token() + int8_classifier + f32_classifier; }
};

/// The weight multiply-adds of `weights` timed in the weights phase: every layer's wq, wk, wv, wo,
/// w1, w2, w3, a MoE layer's router, shared gate and the n_experts_used routed experts a token
/// runs; the classifier. A hybrid's recurrent layers are timed in the attention phase
/// (ForwardProfile) and not counted here.
WeightMacs CountWeightMacs(const DecoderWeights& weights);

/// Causal attention's multiply-adds over a prompt of `n` tokens: position p attends to p + 1
/// positions, each costing head_dim multiply-adds per query head for the score and as many for
/// the value sum: attention layers · Σ_{p<n} (p + 1) · 2 · n_heads · head_dim (a hybrid's
/// recurrent layers, timed in the same phase, are not counted).
int64_t PrefillAttentionMacs(const DecoderConfig& config, int64_t n);

/// The seconds the weights need at the peaks of `roofline` for a prompt of `n` tokens (the int8
/// part at best_int8_gmacs, the f32 part at best_f32_gmacs).
double WeightsCeilingSeconds(const WeightMacs& macs, const ComputeRoofline& roofline, int64_t n);

/// The instruction(s) the weights' ceiling comes from: the best int8 dot, the best f32 FMA, or
/// both ("vpdpbusd zmm + vfmadd231ps zmm") when the model mixes the two kinds.
std::string WeightsCeilingInstruction(const WeightMacs& macs, const ComputeRoofline& roofline);

/// A prompt of `n` tokens: bos, then `text` (token ids, at least one) repeated as often as needed.
std::vector<int32_t> RepeatPrompt(int32_t bos, const std::vector<int32_t>& text, int64_t n);

struct PrefillBenchConfig {
  std::vector<KvSpec> formats;  ///< arms (K and V in the same spec), run A B C A B C ...
  std::vector<int64_t> lengths;            ///< prompt lengths, each at most the model's context
  std::vector<int32_t> prompt;             ///< tokens, at least the longest length; each uses its prefix
  int32_t reps = 3;                        ///< timed prefills per arm and length, after one warm-up block
  ComputeRoofline roofline;                ///< the peaks of this run, for the ceilings
};

struct PrefillBenchRow {
  std::string format;
  int64_t length = 0;
  double s_median = 0, s_min = 0, s_max = 0;  ///< seconds for the whole prompt
  double tokens_per_second = 0;               ///< length / s_median
  double tps_min = 0, tps_max = 0;            ///< length / s_max, length / s_min
  /// Phase seconds summed over the reps (ForwardProfile) and the total they tile, also summed.
  double weights_s = 0, attention_s = 0, rest_s = 0, total_s = 0;
  double weights_share = 0, attention_share = 0, rest_share = 0;  ///< of total_s
  int64_t weight_macs = 0;     ///< WeightMacs::ForPrompt(length)
  int64_t attention_macs = 0;  ///< PrefillAttentionMacs(length)
  double weights_ceiling_tps = 0;   ///< length / WeightsCeilingSeconds: the weights alone at peak
  double pct_of_weights_ceiling = 0;  ///< 100 · tokens_per_second / weights_ceiling_tps
  double weights_phase_pct = 0;     ///< 100 · the ceiling seconds · reps / weights_s: the phase alone
  double attention_ceiling_s = 0;   ///< attention_macs / the f32 FMA peak
  double attention_phase_pct = 0;   ///< 100 · attention_ceiling_s · reps / attention_s
  std::vector<float> logits;        ///< [vocab] after the last token of the last rep
};

/// Runs the benchmark on `model` (its thread count is the model's). Errors: no formats or
/// lengths, reps under 1, a length past the model's context or the prompt, a cache that cannot
/// be created. `progress` (may be empty) gets a line about every 10 s of a prefill, with an ETA.
Result<std::vector<PrefillBenchRow>> RunPrefillBench(DecoderModel& model, const PrefillBenchConfig& config,
                                                     const std::function<void(const std::string&)>& progress);

}  // namespace kvq
