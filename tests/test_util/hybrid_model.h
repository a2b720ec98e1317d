// Tiny hybrid models (qwen35, qwen35moe, qwen3next) written with kvq's own GGUF writer, and a
// scalar reference forward of them written from docs/hybrid_models_spec.md alone: it reads the
// tensors from the file by name (not through kvq's loader), sums in double, keeps the Gated
// DeltaNet state as S[h][i][j] and the conv input as a plain history, and computes softmax,
// top-k routing, partial NEOX RoPE and the gates with its own code. `HybridReading` lets a test
// get one detail wrong on purpose, to show the comparison would notice.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "weights/matvec.h"
#include "weights/weight_type.h"

namespace kvq::test {

// Shapes: q_dim 128 ≠ dim 64; 16 of 32 numbers per head rotate; 6 value heads on 2 key heads
// (r = 3, where h mod 2 and h div 3 disagree on 4 heads); 6 experts, 2 per token.
constexpr int kHDim = 64, kHHeads = 4, kHKvHeads = 2, kHHeadDim = 32, kHRot = 16, kHVocab = 40,
              kHContext = 64;
constexpr int kHQ = kHHeads * kHHeadDim, kHKv = kHKvHeads * kHHeadDim;
constexpr int kHConvK = 4, kHKeyDim = 16, kHKHeads = 2, kHVHeads = 6;
constexpr int kHCk = kHKHeads * kHKeyDim, kHCv = kHVHeads * kHKeyDim, kHC = 2 * kHCk + kHCv;
constexpr int kHFfn = 96, kHExperts = 6, kHUsed = 2, kHExpertFfn = 32, kHSharedFfn = 64;
constexpr float kHEps = 1e-6f, kHTheta = 10000.0f;

struct TinyHybrid {
  std::string arch = "qwen35";     // qwen35 | qwen35moe | qwen3next
  bool q8_0 = false;               // the big matrices in Q8_0, else F32
  int layers = 4;                  // run by the model (block_count adds nextn)
  int interval = 2;                // full_attention_interval
  std::vector<int32_t> recurrent;  // attention.recurrent_layers when not empty
  int nextn = 0;                   // nextn_predict_layers (qwen35*): extra blocks kvq skips
  std::string skip;                // a tensor left out
  std::string skip_key;            // a metadata key left out (without the arch prefix)
  int inner_size = kHCv;           // ssm.inner_size as written
  bool legacy_ssm_in = false;      // qwen3next: write ssm_in instead of attn_qkv + attn_gate
  std::vector<int32_t> kv_heads;   // attention.head_count_kv as a per-layer array when not empty
  bool moe() const { return arch != "qwen35"; }
};

inline bool HybridRecurrent(const TinyHybrid& s, int l) {
  return s.recurrent.empty() ? (l + 1) % s.interval != 0 : s.recurrent[l] != 0;
}

inline std::string WriteHybrid(const std::string& name, const TinyHybrid& s) {
  GgufWriter w;
  const std::string p = s.arch + ".";
  auto key = [&](const std::string& k) { return s.skip_key != k; };
  EXPECT_TRUE(w.SetString("general.architecture", s.arch).ok());
  const std::pair<std::string, uint32_t> keys[] = {{"embedding_length", kHDim},
                                                   {"block_count", s.layers + s.nextn},
                                                   {"attention.head_count", kHHeads},
                                                   {"context_length", kHContext},
                                                   {"attention.key_length", kHHeadDim},
                                                   {"attention.value_length", kHHeadDim},
                                                   {"rope.dimension_count", kHRot},
                                                   {"ssm.conv_kernel", kHConvK},
                                                   {"ssm.state_size", kHKeyDim},
                                                   {"ssm.group_count", kHKHeads},
                                                   {"ssm.time_step_rank", kHVHeads},
                                                   {"ssm.inner_size", s.inner_size},
                                                   {"full_attention_interval", s.interval}};
  for (const auto& [k, v] : keys) {
    if (key(k)) {
      EXPECT_TRUE(w.SetU32(p + k, v).ok());
    }
  }
  if (s.kv_heads.empty()) {
    EXPECT_TRUE(w.SetU32(p + "attention.head_count_kv", kHKvHeads).ok());
  } else {
    EXPECT_TRUE(w.SetI32Array(p + "attention.head_count_kv", s.kv_heads).ok());
  }
  if (s.moe()) {
    EXPECT_TRUE(w.SetU32(p + "expert_count", kHExperts).ok());
    EXPECT_TRUE(w.SetU32(p + "expert_used_count", kHUsed).ok());
    EXPECT_TRUE(w.SetU32(p + "expert_feed_forward_length", kHExpertFfn).ok());
    EXPECT_TRUE(w.SetU32(p + "expert_shared_feed_forward_length", kHSharedFfn).ok());
  } else {
    EXPECT_TRUE(w.SetU32(p + "feed_forward_length", kHFfn).ok());
  }
  if (s.nextn > 0) {
    EXPECT_TRUE(w.SetU32(p + "nextn_predict_layers", s.nextn).ok());
  }
  if (!s.recurrent.empty()) {
    EXPECT_TRUE(w.SetI32Array(p + "attention.recurrent_layers", s.recurrent).ok());
  }
  EXPECT_TRUE(w.SetF32(p + "rope.freq_base", kHTheta).ok());
  EXPECT_TRUE(w.SetF32(p + "attention.layer_norm_rms_epsilon", kHEps).ok());
  std::mt19937 rng(23);
  auto random = [&](int64_t n, float sd, float mean = 0.0f) {
    std::normal_distribution<float> dist(mean, sd);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
  };
  const WeightTypeDesc* q8 = *FindWeightTypeByName("q8_0");
  // F32 for vectors and the small matrices; the big ones in Q8_0 when asked (rows of 32k numbers).
  auto add = [&](const std::string& t, std::vector<int64_t> dims, const std::vector<float>& v,
                 bool big) {
    if (t == s.skip) return;
    if (big && s.q8_0) {
      const int64_t rows = static_cast<int64_t>(v.size()) / dims[0];
      const int64_t row_bytes = dims[0] / q8->block_elems * q8->block_bytes;
      std::vector<uint8_t> bytes(rows * row_bytes);
      for (int64_t r = 0; r < rows; ++r)
        QuantizeRowRef(*q8, v.data() + r * dims[0], dims[0], bytes.data() + r * row_bytes);
      EXPECT_TRUE(w.AddTensor(t, GgmlType::kQ8_0, dims, std::move(bytes)).ok()) << t;
      return;
    }
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    EXPECT_TRUE(w.AddTensor(t, GgmlType::kF32, dims, std::move(b)).ok()) << t;
  };
  // Weights ~ N(0, 1/cols) keep activations O(1); norm weights N(1, 0.3) (as the converter stores
  // them, +1 baked in), so an extra +1 or a skipped norm moves the logits.
  auto sd = [](int64_t cols) { return 1.0f / std::sqrt(static_cast<float>(cols)); };
  add("token_embd.weight", {kHDim, kHVocab}, random(int64_t{kHDim} * kHVocab, 1.0f), true);
  for (int l = 0; l < s.layers + s.nextn; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    if (l >= s.layers) {  // an MTP block: something kvq must not read
      add(b + "nextn.enorm.weight", {kHDim}, random(kHDim, 0.3f, 1.0f), false);
      continue;
    }
    add(b + "attn_norm.weight", {kHDim}, random(kHDim, 0.3f, 1.0f), false);
    if (HybridRecurrent(s, l)) {
      if (s.legacy_ssm_in) {
        add(b + "ssm_in.weight", {kHDim, kHC + kHCv},
            random(int64_t{kHDim} * (kHC + kHCv), sd(kHDim)), true);
      } else {
        add(b + "attn_qkv.weight", {kHDim, kHC}, random(int64_t{kHDim} * kHC, sd(kHDim)), true);
        add(b + "attn_gate.weight", {kHDim, kHCv}, random(int64_t{kHDim} * kHCv, sd(kHDim)), true);
      }
      if (s.arch == "qwen3next") {
        add(b + "ssm_ba.weight", {kHDim, 2 * kHVHeads}, random(kHDim * 2 * kHVHeads, sd(kHDim)),
            false);
      } else {
        add(b + "ssm_beta.weight", {kHDim, kHVHeads}, random(kHDim * kHVHeads, sd(kHDim)), false);
        add(b + "ssm_alpha.weight", {kHDim, kHVHeads}, random(kHDim * kHVHeads, sd(kHDim)), false);
      }
      add(b + "ssm_conv1d.weight", {kHConvK, kHC}, random(kHConvK * kHC, 0.5f), false);
      add(b + "ssm_dt.bias", {kHVHeads}, random(kHVHeads, 0.5f), false);
      std::vector<float> a = random(kHVHeads, 0.5f);
      for (float& x : a) x = -std::exp(x);  // the converter stores −exp(A_log)
      add(b + "ssm_a", {kHVHeads}, a, false);
      add(b + "ssm_norm.weight", {kHKeyDim}, random(kHKeyDim, 0.3f, 1.0f), false);
      add(b + "ssm_out.weight", {kHCv, kHDim}, random(int64_t{kHCv} * kHDim, sd(kHCv)), true);
    } else {
      add(b + "attn_q.weight", {kHDim, 2 * kHQ}, random(int64_t{kHDim} * 2 * kHQ, sd(kHDim)), true);
      add(b + "attn_k.weight", {kHDim, kHKv}, random(int64_t{kHDim} * kHKv, sd(kHDim)), true);
      add(b + "attn_v.weight", {kHDim, kHKv}, random(int64_t{kHDim} * kHKv, sd(kHDim)), true);
      add(b + "attn_q_norm.weight", {kHHeadDim}, random(kHHeadDim, 0.3f, 1.0f), false);
      add(b + "attn_k_norm.weight", {kHHeadDim}, random(kHHeadDim, 0.3f, 1.0f), false);
      add(b + "attn_output.weight", {kHQ, kHDim}, random(int64_t{kHQ} * kHDim, sd(kHQ)), true);
    }
    add(b + "post_attention_norm.weight", {kHDim}, random(kHDim, 0.3f, 1.0f), false);
    if (s.moe()) {
      add(b + "ffn_gate_inp.weight", {kHDim, kHExperts}, random(kHDim * kHExperts, 4 * sd(kHDim)),
          false);
      add(b + "ffn_gate_exps.weight", {kHDim, kHExpertFfn, kHExperts},
          random(int64_t{kHDim} * kHExpertFfn * kHExperts, sd(kHDim)), true);
      add(b + "ffn_up_exps.weight", {kHDim, kHExpertFfn, kHExperts},
          random(int64_t{kHDim} * kHExpertFfn * kHExperts, sd(kHDim)), true);
      add(b + "ffn_down_exps.weight", {kHExpertFfn, kHDim, kHExperts},
          random(int64_t{kHExpertFfn} * kHDim * kHExperts, sd(kHExpertFfn)), true);
      add(b + "ffn_gate_inp_shexp.weight", {kHDim}, random(kHDim, sd(kHDim)), false);
      add(b + "ffn_gate_shexp.weight", {kHDim, kHSharedFfn}, random(kHDim * kHSharedFfn, sd(kHDim)),
          true);
      add(b + "ffn_up_shexp.weight", {kHDim, kHSharedFfn}, random(kHDim * kHSharedFfn, sd(kHDim)),
          true);
      add(b + "ffn_down_shexp.weight", {kHSharedFfn, kHDim},
          random(kHSharedFfn * kHDim, sd(kHSharedFfn)), true);
    } else {
      add(b + "ffn_gate.weight", {kHDim, kHFfn}, random(kHDim * kHFfn, sd(kHDim)), true);
      add(b + "ffn_up.weight", {kHDim, kHFfn}, random(kHDim * kHFfn, sd(kHDim)), true);
      add(b + "ffn_down.weight", {kHFfn, kHDim}, random(kHFfn * kHDim, sd(kHFfn)), true);
    }
  }
  add("output_norm.weight", {kHDim}, random(kHDim, 0.3f, 1.0f), false);
  const std::string path =
      ::testing::TempDir() + "/hybrid_" + name + "_" + std::to_string(getpid()) + ".gguf";
  EXPECT_TRUE(w.Write(path).ok());
  return path;
}

// What the reference is told (the right reading by default; tests flip one field).
struct HybridReading {
  bool v_heads_modulo = true;  // v head h reads q/k head h mod Hk (qwen35*), else h div r
  int rot = kHRot;             // numbers rotated per attention head
  bool output_gate = true;     // attention output ⊙ σ(gate)
  bool renormalise = true;     // top-k expert weights renormalised to sum 1
  bool conv_state = true;      // the conv sees the previous K−1 tokens (else zeros)
};

class HybridReference {
 public:
  HybridReference(const GgufFile& f, const TinyHybrid& s, HybridReading r) : f_(f), s_(s), r_(r) {
    state_.assign(s.layers, std::vector<double>(int64_t{kHVHeads} * kHKeyDim * kHKeyDim, 0.0));
    history_.resize(s.layers);
    k_.resize(s.layers);
    v_.resize(s.layers);
  }

  std::vector<double> Forward(int32_t token) {
    std::vector<double> x = Row("token_embd.weight", token);
    for (int l = 0; l < s_.layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      std::vector<double> xn = Norm(x, Vec(b + "attn_norm.weight"));
      const std::vector<double> m =
          HybridRecurrent(s_, l) ? Recurrent(l, b, xn) : Attention(l, b, xn);
      for (int i = 0; i < kHDim; ++i) x[i] += m[i];
      xn = Norm(x, Vec(b + "post_attention_norm.weight"));
      const std::vector<double> f = s_.moe() ? Moe(b, xn)
                                             : SwiGlu(b + "ffn_gate.weight", b + "ffn_up.weight",
                                                      b + "ffn_down.weight", xn, 0, kHFfn);
      for (int i = 0; i < kHDim; ++i) x[i] += f[i];
    }
    ++pos_;
    return MatVec("token_embd.weight", Norm(x, Vec("output_norm.weight")));  // tied classifier
  }

 private:
  static double Sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
  static double Silu(double v) { return v * Sigmoid(v); }

  Matrix Tensor(const std::string& name) const {
    const GgufTensor* t = *f_.FindTensor(name);
    int64_t rows = 1;
    for (size_t i = 1; i < t->dims.size(); ++i) rows *= t->dims[i];
    return {FindWeightTypeByGgufId(static_cast<uint32_t>(t->type))->type, t->data, rows,
            t->dims[0]};
  }
  std::vector<double> Vec(const std::string& name) const {
    const Matrix m = Tensor(name);
    std::vector<double> v(m.rows * m.cols);
    for (int64_t i = 0; i < m.cols * m.rows; ++i) v[i] = DecodeWeight(m, i / m.cols, i % m.cols);
    return v;
  }
  std::vector<double> Row(const std::string& name, int64_t row) const {
    const Matrix m = Tensor(name);
    std::vector<double> v(m.cols);
    for (int64_t c = 0; c < m.cols; ++c) v[c] = DecodeWeight(m, row, c);
    return v;
  }
  // Rows [first, first + n) of W times x (n = 0: every row).
  std::vector<double> MatVec(const std::string& name, const std::vector<double>& x,
                             int64_t first = 0, int64_t n = 0) const {
    const Matrix m = Tensor(name);
    if (n == 0) n = m.rows;
    std::vector<double> y(n, 0.0);
    if (m.type == WeightType::kQ8_0) {
      // kvq quantises the activation for Q8_0 products (weights/matvec.h); the reference does
      // the same in plain C++ (MatVecQuantizedReference: exact per-block integer sums, in
      // double), or a rounding of the activation would dwarf everything else it checks.
      Matrix rows = m;
      rows.data = m.data + first * MatrixRowBytes(m.type, m.cols);
      rows.rows = n;
      const std::vector<float> xf(x.begin(), x.end());
      std::vector<QuantizedProductReference> q(n);
      MatVecQuantizedReference(rows, xf.data(), q.data());
      for (int64_t r = 0; r < n; ++r) y[r] = q[r].y;
      return y;
    }
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < m.cols; ++c) y[r] += DecodeWeight(m, first + r, c) * x[c];
    }
    return y;
  }
  static std::vector<double> Norm(const std::vector<double>& x, const std::vector<double>& w,
                                  size_t at = 0, size_t n = 0) {
    if (n == 0) n = x.size();
    double ss = 0;
    for (size_t i = 0; i < n; ++i) ss += x[at + i] * x[at + i];
    const double scale = 1.0 / std::sqrt(ss / n + kHEps);
    std::vector<double> y(n);
    for (size_t i = 0; i < n; ++i) y[i] = x[at + i] * scale * w[i];
    return y;
  }
  std::vector<double> SwiGlu(const std::string& gate, const std::string& up,
                             const std::string& down, const std::vector<double>& x, int64_t expert,
                             int64_t ffn) const {
    std::vector<double> g = MatVec(gate, x, expert * ffn, ffn),
                        u = MatVec(up, x, expert * ffn, ffn);
    for (int64_t i = 0; i < ffn; ++i) g[i] = Silu(g[i]) * u[i];
    return MatVec(down, g, expert * kHDim, kHDim);
  }

  // §4.2, per token, with the state as S[h][i][j] and the conv over the raw input history.
  std::vector<double> Recurrent(int l, const std::string& b, const std::vector<double>& x) {
    const std::vector<double> m = MatVec(b + "attn_qkv.weight", x),
                              z = MatVec(b + "attn_gate.weight", x);
    std::vector<double> beta(kHVHeads), alpha(kHVHeads);
    if (s_.arch == "qwen3next") {  // §3.6: per key head g, [b of heads g·r .. g·r+r−1][a of them]
      const std::vector<double> ba = MatVec(b + "ssm_ba.weight", x);
      const int r = kHVHeads / kHKHeads;
      for (int h = 0; h < kHVHeads; ++h) {
        beta[h] = ba[(h / r) * 2 * r + h % r];
        alpha[h] = ba[(h / r) * 2 * r + r + h % r];
      }
    } else {
      beta = MatVec(b + "ssm_beta.weight", x);
      alpha = MatVec(b + "ssm_alpha.weight", x);
    }
    history_[l].push_back(m);
    const std::vector<double> conv = Vec(b + "ssm_conv1d.weight"), dt = Vec(b + "ssm_dt.bias"),
                              a_log = Vec(b + "ssm_a"), norm = Vec(b + "ssm_norm.weight");
    std::vector<double> y(kHC);
    const int t = static_cast<int>(history_[l].size()) - 1;
    for (int c = 0; c < kHC; ++c) {
      double u = 0;
      for (int j = 0; j < kHConvK; ++j) {  // tap j reads token t − (K−1) + j; before the start: 0
        const int src = t - (kHConvK - 1) + j;
        if (src >= 0 && (r_.conv_state || src == t))
          u += conv[c * kHConvK + j] * history_[l][src][c];
      }
      y[c] = Silu(u);
    }
    auto l2 = [&](int at) {
      double ss = 0;
      for (int i = 0; i < kHKeyDim; ++i) ss += y[at + i] * y[at + i];
      const double d = std::max(std::sqrt(ss), static_cast<double>(kHEps));
      for (int i = 0; i < kHKeyDim; ++i) y[at + i] /= d;
    };
    for (int g = 0; g < kHKHeads; ++g) {
      l2(g * kHKeyDim);
      l2(kHCk + g * kHKeyDim);
    }
    std::vector<double> out(kHCv);
    for (int h = 0; h < kHVHeads; ++h) {
      const int g = r_.v_heads_modulo ? h % kHKHeads : h / (kHVHeads / kHKHeads);
      const double* q = &y[g * kHKeyDim];
      const double* k = &y[kHCk + g * kHKeyDim];
      const double* v = &y[2 * kHCk + h * kHKeyDim];
      const double sp =
          alpha[h] + dt[h] > 20 ? alpha[h] + dt[h] : std::log1p(std::exp(alpha[h] + dt[h]));
      const double gamma = std::exp(a_log[h] * sp), bt = Sigmoid(beta[h]);
      double* S = state_[l].data() + int64_t{h} * kHKeyDim * kHKeyDim;  // S[i][j] at i·dv + j
      std::vector<double> o(kHKeyDim);
      for (int i = 0; i < kHKeyDim * kHKeyDim; ++i) S[i] *= gamma;
      for (int j = 0; j < kHKeyDim; ++j) {
        double u = 0;
        for (int i = 0; i < kHKeyDim; ++i) u += S[i * kHKeyDim + j] * k[i];
        const double delta = bt * (v[j] - u);
        for (int i = 0; i < kHKeyDim; ++i) S[i * kHKeyDim + j] += k[i] * delta;
      }
      for (int j = 0; j < kHKeyDim; ++j) {
        for (int i = 0; i < kHKeyDim; ++i) o[j] += S[i * kHKeyDim + j] * q[i];
        o[j] /= std::sqrt(static_cast<double>(kHKeyDim));
      }
      const std::vector<double> n = Norm(o, norm);
      for (int j = 0; j < kHKeyDim; ++j) out[h * kHKeyDim + j] = n[j] * Silu(z[h * kHKeyDim + j]);
    }
    return MatVec(b + "ssm_out.weight", out);
  }

  // §4.4: q/gate interleaved per head, q/k norms, partial NEOX RoPE, GQA, σ(gate).
  std::vector<double> Attention(int l, const std::string& b, const std::vector<double>& x) {
    const std::vector<double> qg = MatVec(b + "attn_q.weight", x),
                              kr = MatVec(b + "attn_k.weight", x),
                              vr = MatVec(b + "attn_v.weight", x),
                              qn = Vec(b + "attn_q_norm.weight"),
                              kn = Vec(b + "attn_k_norm.weight");
    auto rope = [&](std::vector<double>& h) {
      const int half = r_.rot / 2;
      for (int m = 0; m < half; ++m) {
        const double angle = pos_ * std::pow(static_cast<double>(kHTheta), -2.0 * m / r_.rot);
        const double a = h[m], c = h[m + half];
        h[m] = a * std::cos(angle) - c * std::sin(angle);
        h[m + half] = a * std::sin(angle) + c * std::cos(angle);
      }
    };
    for (int j = 0; j < kHKvHeads; ++j) {
      std::vector<double> kh = Norm(kr, kn, j * kHHeadDim, kHHeadDim);
      rope(kh);
      k_[l].push_back(kh);
      v_[l].emplace_back(vr.begin() + j * kHHeadDim, vr.begin() + (j + 1) * kHHeadDim);
    }
    std::vector<double> y(kHQ);
    for (int h = 0; h < kHHeads; ++h) {
      std::vector<double> q = Norm(qg, qn, 2 * kHHeadDim * h, kHHeadDim);
      rope(q);
      const int j = h / (kHHeads / kHKvHeads);
      std::vector<double> score(pos_ + 1);
      for (int t = 0; t <= pos_; ++t) {
        const std::vector<double>& kt = k_[l][t * kHKvHeads + j];
        for (int i = 0; i < kHHeadDim; ++i) score[t] += q[i] * kt[i];
        score[t] /= std::sqrt(static_cast<double>(kHHeadDim));
      }
      const double top = *std::max_element(score.begin(), score.end());
      double sum = 0;
      for (double& e : score) sum += e = std::exp(e - top);
      for (int i = 0; i < kHHeadDim; ++i) {
        for (int t = 0; t <= pos_; ++t)
          y[h * kHHeadDim + i] += score[t] / sum * v_[l][t * kHKvHeads + j][i];
        const double gate = qg[2 * kHHeadDim * h + kHHeadDim + i];
        if (r_.output_gate) y[h * kHHeadDim + i] *= Sigmoid(gate);
      }
    }
    return MatVec(b + "attn_output.weight", y);
  }

  // §4.5: softmax over every expert, top k renormalised, plus the σ-gated shared expert.
  std::vector<double> Moe(const std::string& b, const std::vector<double>& x) const {
    std::vector<double> p = MatVec(b + "ffn_gate_inp.weight", x);
    const double top = *std::max_element(p.begin(), p.end());
    double sum = 0;
    for (double& e : p) sum += e = std::exp(e - top);
    for (double& e : p) e /= sum;
    std::vector<int> order(kHExperts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int c) { return p[a] > p[c]; });
    double chosen = 0;
    for (int i = 0; i < kHUsed; ++i) chosen += p[order[i]];
    const std::vector<double> gate = Vec(b + "ffn_gate_inp_shexp.weight");
    double g = 0;
    for (int i = 0; i < kHDim; ++i) g += gate[i] * x[i];
    std::vector<double> out = SwiGlu(b + "ffn_gate_shexp.weight", b + "ffn_up_shexp.weight",
                                     b + "ffn_down_shexp.weight", x, 0, kHSharedFfn);
    for (double& e : out) e *= Sigmoid(g);
    for (int i = 0; i < kHUsed; ++i) {
      const int e = order[i];
      const double weight = r_.renormalise ? p[e] / chosen : p[e];
      const std::vector<double> y = SwiGlu(b + "ffn_gate_exps.weight", b + "ffn_up_exps.weight",
                                           b + "ffn_down_exps.weight", x, e, kHExpertFfn);
      for (int j = 0; j < kHDim; ++j) out[j] += weight * y[j];
    }
    return out;
  }

  const GgufFile& f_;
  TinyHybrid s_;
  HybridReading r_;
  int pos_ = 0;
  std::vector<std::vector<double>> state_;                 // [layer][Hv][dk][dv]
  std::vector<std::vector<std::vector<double>>> history_;  // [layer][token][C] raw conv inputs
  std::vector<std::vector<std::vector<double>>> k_, v_;    // [layer][token·Hkv + head][D]
};

}  // namespace kvq::test
