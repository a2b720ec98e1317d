// AddMoeFfnOps (gpu_moe.h): DecoderModel::ForwardBatch's MoE branch for one token, in its order.
#include "web/gpu_moe.h"

namespace kvq_web {

void AddMoeBuffers(const kvq::DecoderConfig& c, GpuProgram* p) {
  const int64_t k = c.moe.n_experts_used, fe = c.moe.expert_hidden_dim;
  // The router's logits (then softmax) [n_experts]; the chosen [k] ids and [k] weights; the
  // shared expert's gate logit [1]; the chosen experts' gate and up [k][Fe] (gate then their
  // SwiGLU) and down outputs [k][dim].
  p->buffers.insert(p->buffers.end(), {{"moe_logits", c.moe.n_experts}, {"moe_sel", 2 * k}, {"moe_gate_logit", 1},
                                       {"moe_gate", k * fe}, {"moe_up", k * fe}, {"moe_down", k * c.dim}});
}

void AddMoeFfnOps(const kvq::DecoderConfig& c, const kvq::LayerWeights& L, const std::string& blk,
                  GpuProgramBuilder* b) {
  const int32_t k = c.moe.n_experts_used;
  const int64_t fe = c.moe.expert_hidden_dim, hidden = c.hidden_dim, dim = c.dim;
  // The shared expert (the layer's w1/w3/w2: ffn_*_shexp in the file) into xb2.
  b->Op({.kind = "matvec", .w = b->Matrix(blk + "ffn_gate_shexp", L.w1), .x = "xb", .y = "hb"});
  b->Op({.kind = "matvec", .w = b->Matrix(blk + "ffn_up_shexp", L.w3), .x = "xb", .y = "hb2"});
  b->Op({.kind = "swiglu", .x = "hb2", .y = "hb", .n = hidden});
  b->Op({.kind = "matvec", .w = b->Matrix(blk + "ffn_down_shexp", L.w2), .x = "hb", .y = "xb2"});
  // MoeRows: the router and the shared gate over the normed input, the routing, then the chosen
  // experts' SwiGLUs (gate and up read one input, down each rank's own), then the sum.
  b->Op({.kind = "matvec", .w = b->Matrix(blk + "ffn_gate_inp", L.router), .x = "xb", .y = "moe_logits"});
  b->Op({.kind = "matvec", .w = b->Matrix(blk + "ffn_gate_inp_shexp", L.shared_gate), .x = "xb",
         .y = "moe_gate_logit"});
  b->Op({.kind = "moe_route", .x = "moe_logits", .sel = "moe_sel", .n = c.moe.n_experts, .top_k = k});
  b->Op({.kind = "expert_matvec", .w = b->Matrix(blk + "ffn_gate_exps", L.gate_exps), .x = "xb", .y = "moe_gate",
         .sel = "moe_sel", .n = fe, .top_k = k});
  b->Op({.kind = "expert_matvec", .w = b->Matrix(blk + "ffn_up_exps", L.up_exps), .x = "xb", .y = "moe_up",
         .sel = "moe_sel", .n = fe, .top_k = k});
  b->Op({.kind = "swiglu", .x = "moe_up", .y = "moe_gate", .n = k * fe});
  b->Op({.kind = "expert_matvec", .w = b->Matrix(blk + "ffn_down_exps", L.down_exps), .x = "moe_gate",
         .y = "moe_down", .sel = "moe_sel", .n = dim, .x_stride = fe, .top_k = k});
  b->Op({.kind = "moe_combine", .x = "moe_down", .y = "xb2", .sel = "moe_sel", .gate = "moe_gate_logit", .n = dim,
         .top_k = k});
  b->Op({.kind = "add", .x = "xb2", .y = "x", .n = dim});
}

kvq::Result<GpuProgram> BuildMoeFfnProgram(const kvq::DecoderWeights& w, int32_t layer) {
  const kvq::DecoderConfig& c = w.config;
  if (c.moe.n_experts <= 0) return kvq::Status::Error("this " + c.arch + " model has no mixture-of-experts layers");
  if (layer < 0 || layer >= c.n_layers) {
    return kvq::Status::Error("layer " + std::to_string(layer) + " is outside the model's " +
                              std::to_string(c.n_layers) + " layers");
  }
  GpuProgram p;
  p.config = c;
  // [f32 elements]: the residual, the normed input, the shared expert's output, its gate and up.
  p.buffers = {{"x", c.dim}, {"xb", c.dim}, {"xb2", c.dim}, {"hb", c.hidden_dim}, {"hb2", c.hidden_dim}};
  AddMoeBuffers(c, &p);
  GpuProgramBuilder b(&p, nullptr);
  AddMoeFfnOps(c, w.layers[layer], "blk." + std::to_string(layer) + ".", &b);
  if (!b.status().ok()) return b.status();
  return p;
}

}  // namespace kvq_web
