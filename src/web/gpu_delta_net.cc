// The hybrid layers' step-program ops (gpu_delta_net.h), one token's worth, in
// DecoderModel::RecurrentMixer's and DeltaNetBlock's order.
#include "web/gpu_delta_net.h"

#include <string>

namespace kvq_web {

void AddHybridBuffers(const kvq::DecoderConfig& c, GpuProgram* p) {
  if (c.attn_output_gate) {
    // [f32 elements]: attn_q's per head [q, gate] rows, and the gates apart.
    p->buffers.push_back({"qg", 2 * c.q_dim()});
    p->buffers.push_back({"attn_gate", c.q_dim()});
  }
  if (c.n_attention_layers() == c.n_layers) return;
  const kvq::DeltaNetConfig& d = c.delta_net;
  const int64_t C = d.conv_channels(), Cv = d.v_channels(), Hv = d.n_v_heads;
  // [f32 elements]: the raw q, k, v channels; after the conv, SiLU and L2 norms; the output gate
  // z; [b: Hv][a: Hv] then [β: Hv][γ: Hv] in place; a fused ssm_ba's rows as stored; the read-out.
  p->buffers.insert(p->buffers.end(), {{"dn_qkv", C}, {"dn_conv", C}, {"dn_z", Cv}, {"dn_ba", 2 * Hv},
                                       {"dn_ba_fused", 2 * Hv}, {"dn_out", Cv}});
  for (int32_t l = 0; l < c.n_layers; ++l) {
    if (!c.is_recurrent(l)) continue;
    const std::string slot = std::to_string(c.cache_layer(l));
    p->states.push_back({"conv_state." + slot, d.conv_state_floats()});                // [C][K−1]
    p->states.push_back({"delta_state." + slot, int64_t{Hv} * d.key_dim * d.value_dim});  // [Hv][dk][dv]
  }
}

void AddDeltaNetOps(GpuProgramBuilder& b, const kvq::DecoderConfig& c, const kvq::LayerWeights& L, int32_t layer) {
  const kvq::DeltaNetConfig& d = c.delta_net;
  const int64_t C = d.conv_channels(), Hv = d.n_v_heads;
  const std::string blk = "blk." + std::to_string(layer) + ".";
  const std::string slot = std::to_string(c.cache_layer(layer));
  b.Op({.kind = "matvec", .w = b.Matrix(blk + "attn_qkv", L.ssm_qkv), .x = "xb", .y = "dn_qkv"});
  b.Op({.kind = "matvec", .w = b.Matrix(blk + "attn_gate", L.ssm_gate), .x = "xb", .y = "dn_z"});
  if (L.ssm_ba.data != nullptr) {
    b.Op({.kind = "matvec", .w = b.Matrix(blk + "ssm_ba", L.ssm_ba), .x = "xb", .y = "dn_ba_fused"});
    b.Op({.kind = "ba_order", .x = "dn_ba_fused", .y = "dn_ba"});
  } else {
    b.Op({.kind = "matvec", .w = b.Matrix(blk + "ssm_beta", L.ssm_beta), .x = "xb", .y = "dn_ba"});
    b.Op({.kind = "matvec", .w = b.Matrix(blk + "ssm_alpha", L.ssm_alpha), .x = "xb", .y = "dn_ba", .y_offset = Hv});
  }
  b.Op({.kind = "dn_gate_bias", .w = b.Vector(blk + "ssm_dt.bias", L.ssm_dt_bias, Hv), .y = "dn_ba"});
  b.Op({.kind = "dn_gate_decay", .w = b.Vector(blk + "ssm_a", L.ssm_a, Hv), .y = "dn_ba"});
  b.Op({.kind = "conv_silu", .w = b.Vector(blk + "ssm_conv1d", L.ssm_conv, C * d.conv_kernel), .x = "dn_qkv",
        .y = "dn_conv", .state = "conv_state." + slot});
  b.Op({.kind = "l2norm", .y = "dn_conv", .n = d.key_dim, .heads = 2 * d.n_k_heads});  // q heads, then k heads
  b.Op({.kind = "delta_rule", .x = "dn_conv", .y = "dn_out", .state = "delta_state." + slot, .gates = "dn_ba"});
  b.Op({.kind = "gated_rmsnorm", .w = b.Vector(blk + "ssm_norm", L.ssm_norm, d.value_dim), .x = "dn_z",
        .y = "dn_out", .n = d.value_dim, .heads = d.n_v_heads});
  b.Op({.kind = "matvec", .w = b.Matrix(blk + "ssm_out", L.ssm_out), .x = "dn_out", .y = "xb2"});
}

void AddAttentionGateSplit(GpuProgramBuilder& b, const kvq::DecoderConfig& c) {
  b.Op({.kind = "head_slice", .x = "qg", .y = "q", .n = 0, .heads = c.n_heads});
  b.Op({.kind = "head_slice", .x = "qg", .y = "attn_gate", .n = c.head_dim(), .heads = c.n_heads});
}

void AddAttentionGate(GpuProgramBuilder& b, const kvq::DecoderConfig& c) {
  b.Op({.kind = "sigmoid_mul", .x = "attn_gate", .y = "xb", .n = c.q_dim()});
}

}  // namespace kvq_web
