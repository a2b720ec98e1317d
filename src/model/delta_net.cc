// DeltaNetBlock (see delta_net.h). f32 throughout (llama.cpp runs this math in f32 too); every sum
// runs in index order, so the bits depend only on the tokens and the state, never on the block
// the tokens came in or the thread count. Two parallel phases: the conv, SiLU and L2 norms per
// channel group over the whole block, then the delta rule per value head over the whole block
// (the head's state stays in cache for the block's tokens; one hand-off per phase, not per token).
#include "model/delta_net.h"

#include <algorithm>
#include <cmath>

#include "base/thread_pool.h"
#include "model/delta_rule.h"
#include "weights/ops.h"

namespace kvq {
namespace {

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float Silu(float x) { return x * Sigmoid(x); }
// ln(1 + eˣ), returning x itself above 20 as ggml and torch do (e^x would dominate anyway).
float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// x ← x / max(‖x‖₂, eps): llama.cpp's ggml_l2_norm, the floor after the square root.
void L2Normalize(float* x, int32_t n, float eps) {
  float sum = 0.0f;
  for (int32_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float scale = 1.0f / std::max(std::sqrt(sum), eps);
  for (int32_t i = 0; i < n; ++i) x[i] *= scale;
}

// Below this many channel·tokens the conv phase runs on the calling thread: a hand-off would
// cost more than it saves.
constexpr int64_t kMinParallelConv = 8192;

}  // namespace

void DeltaNetBlock(const DeltaNetConfig& c, const LayerWeights& L, float eps,
                   const DeltaNetInput& in, int64_t n, float* state, float* out,
                   DeltaNetScratch* scratch, ThreadPool& pool) {
  const int64_t C = c.conv_channels(), Ck = c.k_channels(), Cv = c.v_channels();
  const int32_t K = c.conv_kernel, dk = c.key_dim, dv = c.value_dim, Hk = c.n_k_heads;
  const int32_t Hv = c.n_v_heads;
  const int32_t threads = std::max(1, std::min(pool.threads(), Hv));  // Run's thread indices
  scratch->conv_out.resize(static_cast<size_t>(n * C));
  scratch->head_out.resize(static_cast<size_t>(dv) * threads);
  float* y = scratch->conv_out.data();  // [n][C]
  float* conv_state = state;            // [C][K−1]
  // Conv of channels [from, to) over the block: window = the channel's K−1 stored raw inputs
  // (oldest first) then this token's; tap 0 multiplies the oldest. The window then drops its
  // oldest sample and keeps the raw input.
  auto conv = [&](int64_t from, int64_t to) {
    for (int64_t ch = from; ch < to; ++ch) {
      float* window = conv_state + ch * (K - 1);
      const float* w = L.ssm_conv + ch * K;
      for (int64_t t = 0; t < n; ++t) {
        const float x = in.qkv[t * C + ch];
        float u = 0.0f;
        for (int32_t j = 0; j < K - 1; ++j) u += w[j] * window[j];
        u += w[K - 1] * x;
        for (int32_t j = 0; j + 1 < K - 1; ++j) window[j] = window[j + 1];
        if (K > 1) window[K - 2] = x;
        y[t * C + ch] = Silu(u);  // every channel, q and k included
      }
    }
  };
  // Channel groups: q of key head g (g < Hk), k of key head g − Hk (g < 2Hk), then v of value
  // head g − 2Hk. q and k are L2-normed per key head and token, before any sharing across v heads.
  auto group = [&](int64_t g64, int32_t /*thread*/) {
    const auto g = static_cast<int32_t>(g64);
    if (g < 2 * Hk) {
      const int64_t from = int64_t{g} * dk;  // q heads then k heads: channels [0, 2Ck)
      conv(from, from + dk);
      for (int64_t t = 0; t < n; ++t) L2Normalize(y + t * C + from, dk, eps);
    } else {
      const int64_t from = 2 * Ck + int64_t{g - 2 * Hk} * dv;
      conv(from, from + dv);
    }
  };
  const int32_t n_groups = 2 * Hk + Hv;
  if (threads == 1 || n * C < kMinParallelConv) {
    for (int32_t g = 0; g < n_groups; ++g) group(g, 0);
  } else {
    pool.Run(n_groups, group);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
  float* S_all = state + c.conv_state_floats();  // [Hv][dk][dv]
  // Each value head owns its state and output: the heads split across threads, each scanning the
  // block's tokens in order.
  auto head = [&](int64_t h64, int32_t thread) {
    const auto h = static_cast<int32_t>(h64);
    float* o = scratch->head_out.data() + int64_t{thread} * dv;  // [dv] the read-out
    const int32_t g = c.KeyHeadOf(h);
    for (int64_t t = 0; t < n; ++t) {
      const float* yt = y + t * C;
      const float gamma =  // g ≤ 0, so γ ∈ (0, 1]
          std::exp(L.ssm_a[h] * Softplus(in.alpha[t * Hv + h] + L.ssm_dt_bias[h]));
      DeltaRuleStep({.dk = dk,
                     .dv = dv,
                     .q = yt + int64_t{g} * dk,
                     .k = yt + Ck + int64_t{g} * dk,
                     .v = yt + 2 * Ck + int64_t{h} * dv,
                     .beta = Sigmoid(in.beta[t * Hv + h]),
                     .gamma = gamma,
                     .scale = scale,
                     .S = S_all + int64_t{h} * dk * dv,
                     .o = o});
      // Gated RMSNorm: the norm over dv with the shared ssm_norm, then × silu(z), per head.
      float* out_h = out + t * Cv + int64_t{h} * dv;
      const float* z = in.z + t * Cv + int64_t{h} * dv;
      RmsNorm(out_h, o, L.ssm_norm, dv, eps);
      for (int32_t j = 0; j < dv; ++j) out_h[j] *= Silu(z[j]);
    }
  };
  if (threads == 1) {
    for (int32_t h = 0; h < Hv; ++h) head(h, 0);
  } else {
    pool.Run(Hv, head);
  }
}

}  // namespace kvq
