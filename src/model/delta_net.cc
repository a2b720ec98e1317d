// DeltaNetToken (see delta_net.h). Plain scalar loops in the spec's order of operations, f32
// throughout (llama.cpp runs this math in f32 too); every sum runs in index order, so the bits
// depend only on the token and the state, never on the block the token came in.
#include "model/delta_net.h"

#include <algorithm>
#include <cmath>

#include "base/thread_pool.h"
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

}  // namespace

void DeltaNetToken(const DeltaNetConfig& c, const LayerWeights& L, float eps,
                   const DeltaNetInput& in, float* state, float* out, DeltaNetScratch* scratch,
                   ThreadPool& pool) {
  const int64_t C = c.conv_channels(), Ck = c.k_channels();
  const int32_t K = c.conv_kernel, dk = c.key_dim, dv = c.value_dim;
  scratch->conv_out.resize(static_cast<size_t>(C));
  const int32_t threads = std::max(1, std::min(pool.threads(), c.n_v_heads));  // Run's thread indices
  scratch->head_out.resize(static_cast<size_t>(2 * dv) * threads);
  float* y = scratch->conv_out.data();  // [C]
  // Conv: window = the channel's K−1 stored raw inputs (oldest first) then this token's; tap 0
  // multiplies the oldest. The window then drops its oldest sample and keeps the raw input.
  float* conv_state = state;  // [C][K−1]
  for (int64_t ch = 0; ch < C; ++ch) {
    float* window = conv_state + ch * (K - 1);
    const float* w = L.ssm_conv + ch * K;
    float u = 0.0f;
    for (int32_t j = 0; j < K - 1; ++j) u += w[j] * window[j];
    u += w[K - 1] * in.qkv[ch];
    for (int32_t j = 0; j + 1 < K - 1; ++j) window[j] = window[j + 1];
    if (K > 1) window[K - 2] = in.qkv[ch];
    y[ch] = Silu(u);  // every channel, q and k included
  }
  for (int32_t g = 0; g < c.n_k_heads; ++g) {  // per key head, before any sharing across v heads
    L2Normalize(y + int64_t{g} * dk, dk, eps);
    L2Normalize(y + Ck + int64_t{g} * dk, dk, eps);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
  float* S_all = state + c.conv_state_floats();  // [Hv][dk][dv]
  // Each value head owns its state and output: the heads split across threads.
  auto head = [&](int64_t h64, int32_t thread) {
    const auto h = static_cast<int32_t>(h64);
    float* o = scratch->head_out.data() + int64_t{thread} * 2 * dv;  // [dv] the read-out
    const int32_t g = c.KeyHeadOf(h);
    const float* q = y + int64_t{g} * dk;
    const float* k = y + Ck + int64_t{g} * dk;
    const float* v = y + 2 * Ck + int64_t{h} * dv;
    const float beta = Sigmoid(in.beta[h]);
    const float gamma = std::exp(L.ssm_a[h] * Softplus(in.alpha[h] + L.ssm_dt_bias[h]));  // g ≤ 0
    float* S = S_all + int64_t{h} * dk * dv;  // S[i][j] at i·dv + j
    float* u = o + dv;                        // [dv] S'ᵀ k, then δ
    // Row i of S scales and accumulates into every column j at once: each u[j] and o[j] still sums
    // over i in order (the scalar recurrence's bits), and the j loops vectorise.
    std::fill(u, u + dv, 0.0f);
    for (int32_t i = 0; i < dk; ++i) {
      float* row = S + int64_t{i} * dv;
      const float ki = k[i];
      for (int32_t j = 0; j < dv; ++j) {
        row[j] *= gamma;  // decay first
        u[j] += row[j] * ki;
      }
    }
    for (int32_t j = 0; j < dv; ++j) u[j] = beta * (v[j] - u[j]);  // δ: move towards v by β
    std::fill(o, o + dv, 0.0f);
    for (int32_t i = 0; i < dk; ++i) {
      float* row = S + int64_t{i} * dv;
      const float ki = k[i], qi = q[i];
      for (int32_t j = 0; j < dv; ++j) {
        row[j] += ki * u[j];  // rank-1 update, then read with the updated state
        o[j] += row[j] * qi;
      }
    }
    for (int32_t j = 0; j < dv; ++j) o[j] *= scale;
    // Gated RMSNorm: the norm over dv with the shared ssm_norm, then × silu(z), per head.
    float* out_h = out + int64_t{h} * dv;
    const float* z = in.z + int64_t{h} * dv;
    RmsNorm(out_h, o, L.ssm_norm, dv, eps);
    for (int32_t j = 0; j < dv; ++j) out_h[j] *= Silu(z[j]);
  };
  if (threads == 1) {
    for (int32_t h = 0; h < c.n_v_heads; ++h) head(h, 0);
  } else {
    pool.Run(c.n_v_heads, head);
  }
}

}  // namespace kvq
