// The hybrid architectures' part of a synth file (see synth_tensors.h): tensor names and shapes
// as llama.cpp's converter writes qwen35, qwen35moe and qwen3next (docs/hybrid_models_spec.md §3),
// and their metadata keys (§2).
#include <fmt/format.h>

#include "gguf/architectures.h"
#include "synth/synth_tensors.h"

namespace kvq {

void AppendHybridLayer(const SynthSpec& s, int64_t l, std::vector<SynthTensorEntry>* out) {
  using E = SynthTensorEntry;
  using R = SynthTensorRole;
  const std::string b = fmt::format("blk.{}.", l);
  const int64_t d = s.dim, q = s.q_dim(), kv = s.kv_dim(), hd = s.head_dim();
  auto add = [&](E::Kind kind, const std::string& name, int64_t cols, int64_t rows, R role,
                 int64_t experts = 0, bool adds_to_residual = false) {
    out->push_back({kind, b + name, cols, rows, role, l, experts, adds_to_residual});
  };
  constexpr bool kAddsToResidual = true;  // an output projection (SynthTensorEntry)
  add(E::kOnes, "attn_norm.weight", d, 0, R::kTokenEmbd);
  if (s.is_recurrent(l)) {
    const int64_t C = s.ssm_conv_channels(), Cv = s.ssm_v_channels(), Hv = s.ssm_v_heads;
    add(E::kMatrix, "attn_qkv.weight", d, C, R::kAttnQ);
    add(E::kMatrix, "attn_gate.weight", d, Cv, R::kAttnQ);
    if (ArchitectureOf(s.arch).fused_ba) {
      add(E::kF32Matrix, "ssm_ba.weight", d, 2 * Hv, R::kAttnQ);
    } else {
      add(E::kF32Matrix, "ssm_beta.weight", d, Hv, R::kAttnQ);
      add(E::kF32Matrix, "ssm_alpha.weight", d, Hv, R::kAttnQ);
    }
    add(E::kF32Matrix, "ssm_conv1d.weight", s.ssm_conv_kernel, C, R::kAttnQ);
    add(E::kBias, "ssm_dt.bias", Hv, 0, R::kTokenEmbd);
    add(E::kSsmA, "ssm_a", Hv, 0, R::kTokenEmbd);
    add(E::kOnes, "ssm_norm.weight", s.ssm_key_dim, 0, R::kTokenEmbd);
    add(E::kMatrix, "ssm_out.weight", Cv, d, R::kAttnOutput, 0, kAddsToResidual);
  } else {
    add(E::kMatrix, "attn_q.weight", d, 2 * q, R::kAttnQ);  // per head [q, gate]
    add(E::kOnes, "attn_q_norm.weight", hd, 0, R::kTokenEmbd);
    add(E::kMatrix, "attn_k.weight", d, kv, R::kAttnK);
    add(E::kOnes, "attn_k_norm.weight", hd, 0, R::kTokenEmbd);
    add(E::kMatrix, "attn_v.weight", d, kv, R::kAttnV);
    add(E::kMatrix, "attn_output.weight", q, d, R::kAttnOutput, 0, kAddsToResidual);
  }
  add(E::kOnes, "post_attention_norm.weight", d, 0, R::kTokenEmbd);
  const int64_t f = s.hidden_dim;
  if (s.moe()) {
    const int64_t ne = s.n_experts, fe = s.expert_hidden_dim;
    add(E::kF32Matrix, "ffn_gate_inp.weight", d, ne, R::kFfnGate);
    add(E::kMatrix, "ffn_gate_exps.weight", d, fe, R::kFfnGate, ne);
    add(E::kMatrix, "ffn_up_exps.weight", d, fe, R::kFfnUp, ne);
    add(E::kMatrix, "ffn_down_exps.weight", fe, d, R::kFfnUp, ne,
        kAddsToResidual);  // not kFfnDown: that marks the layer's last tensor
    add(E::kF32Matrix, "ffn_gate_inp_shexp.weight", d, 0, R::kFfnGate);
    add(E::kMatrix, "ffn_gate_shexp.weight", d, f, R::kFfnGate);
    add(E::kMatrix, "ffn_up_shexp.weight", d, f, R::kFfnUp);
    add(E::kMatrix, "ffn_down_shexp.weight", f, d, R::kFfnDown, 0, kAddsToResidual);
  } else {
    add(E::kMatrix, "ffn_gate.weight", d, f, R::kFfnGate);
    add(E::kMatrix, "ffn_up.weight", d, f, R::kFfnUp);
    add(E::kMatrix, "ffn_down.weight", f, d, R::kFfnDown, 0, kAddsToResidual);
  }
}

namespace {

// The multimodal RoPE sections (temporal, height, width, extra) of the rotated dims' `pairs`
// frequencies, as Qwen3.5's config splits them — in three near-equal parts, the remainder to the
// first ([11, 11, 10] of 32 pairs for 64 rotated dims) — padded to 4 as llama.cpp's converter
// writes them. A text-only run gives every section the same position, so they rotate as one.
std::vector<int32_t> RopeSections(int64_t pairs) {
  std::vector<int32_t> sections(4, 0);
  for (int i = 0; i < 3; ++i) sections[i] = static_cast<int32_t>(pairs / 3 + (i < pairs % 3 ? 1 : 0));
  return sections;
}

}  // namespace

std::vector<Status> WriteHybridKeys(const SynthSpec& s, GgufWriter* w) {
  const std::string a = std::string(SynthGgufArch(s.arch)) + ".";
  const auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };
  std::vector<Status> st;
  // Qwen3.5 (qwen35, qwen35moe) is multimodal: llama.cpp's loader requires its RoPE sections.
  // Qwen3-Next is text only and has none.
  if (s.arch != SynthArch::kQwen3Next) {
    const int64_t rotated = s.rope_dims > 0 ? s.rope_dims : s.head_dim();
    st.push_back(w->SetI32Array(a + "rope.dimension_sections", RopeSections(rotated / 2)));
  }
  st.push_back(w->SetU32(a + "full_attention_interval", u32(s.full_attention_interval)));
  st.push_back(w->SetU32(a + "ssm.conv_kernel", u32(s.ssm_conv_kernel)));
  st.push_back(w->SetU32(a + "ssm.state_size", u32(s.ssm_key_dim)));
  st.push_back(w->SetU32(a + "ssm.group_count", u32(s.ssm_k_heads)));
  st.push_back(w->SetU32(a + "ssm.time_step_rank", u32(s.ssm_v_heads)));
  st.push_back(w->SetU32(a + "ssm.inner_size", u32(s.ssm_v_channels())));
  if (s.moe()) {
    st.push_back(w->SetU32(a + "expert_count", u32(s.n_experts)));
    st.push_back(w->SetU32(a + "expert_used_count", u32(s.n_experts_used)));
    st.push_back(w->SetU32(a + "expert_feed_forward_length", u32(s.expert_hidden_dim)));
    st.push_back(w->SetU32(a + "expert_shared_feed_forward_length", u32(s.hidden_dim)));
  }
  return st;
}

Status ValidateHybridSpec(const SynthSpec& s) {
  auto range = [](const char* what, int64_t v, int64_t lo, int64_t hi) {
    return v >= lo && v <= hi
               ? Status::Ok()
               : Status::Error(fmt::format("{} must be in {}..{} (got {})", what, lo, hi, v));
  };
  const Status checks[] = {
      range("full_attention_interval", s.full_attention_interval, 1, s.n_layers),
      range("the rotated dims (rope.dimension_count)", s.rope_dims, 0, s.head_dim()),
      range("ssm.conv_kernel", s.ssm_conv_kernel, 1, 64),
      range("ssm.state_size", s.ssm_key_dim, 1, 4096),
      range("ssm.group_count", s.ssm_k_heads, 1, 4096),
      range("ssm.time_step_rank", s.ssm_v_heads, 1, 4096),
      range("expert_count", s.n_experts, s.moe() ? 1 : 0, s.moe() ? 65536 : 0),
      range("expert_used_count", s.n_experts_used, s.moe() ? 1 : 0, s.n_experts),
      range("expert_feed_forward_length", s.expert_hidden_dim, s.moe() ? 1 : 0,
            s.moe() ? 1 << 20 : 0),
  };
  for (const Status& c : checks) {
    if (!c.ok()) return c;
  }
  if (s.rope_dims % 2 != 0)
    return Status::Error(fmt::format("the rotated dims {} must be even", s.rope_dims));
  if (s.ssm_v_heads % s.ssm_k_heads != 0) {
    return Status::Error(fmt::format("ssm.group_count {} does not divide ssm.time_step_rank {}",
                                     s.ssm_k_heads, s.ssm_v_heads));
  }
  if (FindTypeMix(s.type) != nullptr) {
    return Status::Error(
        fmt::format("--type {}: llama.cpp's type mixes are not written for the hybrid "
                    "architecture {} (give one weight type)",
                    s.type, SynthArchName(s.arch)));
  }
  return Status::Ok();
}

}  // namespace kvq
