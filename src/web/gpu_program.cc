// BuildGpuProgram (gpu_program.h): DecoderModel::ForwardBatch's ops for one token, in its order.
#include "web/gpu_program.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "web/gpu_delta_net.h"
#include "web/gpu_moe.h"
#include "web/gpu_program_builder.h"

namespace kvq_web {

kvq::Result<GpuProgram> BuildGpuProgram(const kvq::DecoderWeights& w, const kvq::GgufFile* header) {
  const kvq::DecoderConfig& c = w.config;
  GpuProgram p;
  p.config = c;
  const int64_t dim = c.dim, q_dim = c.q_dim(), kv = c.kv_dim(), hidden = c.hidden_dim, hd = c.head_dim();
  // [f32 elements] each: the residual stream, the normed input / attention output (q_dim may
  // exceed dim), projections, the keys before RoPE, the feed-forward's gate and up, the logits.
  p.buffers = {{"x", dim}, {"xb", std::max(dim, q_dim)}, {"xb2", dim}, {"q", q_dim}, {"k", kv},
               {"k_pre", kv}, {"v", kv}, {"hb", hidden}, {"hb2", hidden}, {"logits", c.vocab_size}};
  AddHybridBuffers(c, &p);
  if (c.moe.n_experts > 0) AddMoeBuffers(c, &p);
  GpuProgramBuilder b(&p, header);
  b.Op({.kind = "embed", .w = b.Matrix("token_embd", w.token_embedding), .y = "x"});
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const kvq::LayerWeights& L = w.layers[l];
    const std::string blk = "blk." + std::to_string(l) + ".";
    b.Op({.kind = "rmsnorm", .w = b.Vector(blk + "attn_norm", L.attn_norm, dim), .x = "x", .y = "xb", .n = dim});
    if (c.is_recurrent(l)) {
      AddDeltaNetOps(b, c, L, l);  // xb -> xb2
    } else {
      b.Op({.kind = "matvec", .w = b.Matrix(blk + "attn_q", L.wq), .x = "xb", .y = c.attn_output_gate ? "qg" : "q"});
      if (c.attn_output_gate) AddAttentionGateSplit(b, c);
      b.Op({.kind = "matvec", .w = b.Matrix(blk + "attn_k", L.wk), .x = "xb", .y = "k"});
      b.Op({.kind = "matvec", .w = b.Matrix(blk + "attn_v", L.wv), .x = "xb", .y = "v"});
      if (L.bq != nullptr) b.Op({.kind = "bias", .w = b.Vector(blk + "attn_q.bias", L.bq, q_dim), .y = "q", .n = q_dim});
      if (L.bk != nullptr) b.Op({.kind = "bias", .w = b.Vector(blk + "attn_k.bias", L.bk, kv), .y = "k", .n = kv});
      if (L.bv != nullptr) b.Op({.kind = "bias", .w = b.Vector(blk + "attn_v.bias", L.bv, kv), .y = "v", .n = kv});
      if (c.qk_norm) {
        b.Op({.kind = "head_rmsnorm", .w = b.Vector(blk + "attn_q_norm", L.q_norm, hd), .y = "q",
              .heads = c.n_heads});
        b.Op({.kind = "head_rmsnorm", .w = b.Vector(blk + "attn_k_norm", L.k_norm, hd), .y = "k",
              .heads = c.n_kv_heads});
      }
      b.Op({.kind = "rope", .y = "q", .n = q_dim});
      b.Op({.kind = "copy", .x = "k", .y = "k_pre", .n = kv});
      b.Op({.kind = "rope", .y = "k", .n = kv});
      b.Op({.kind = "attention", .x = "q", .y = "xb", .k = "k", .k_pre = "k_pre", .v = "v",
            .layer = c.cache_layer(l)});
      if (c.attn_output_gate) AddAttentionGate(b, c);
      b.Op({.kind = "matvec", .w = b.Matrix(blk + "attn_output", L.wo), .x = "xb", .y = "xb2"});
    }
    b.Op({.kind = "add", .x = "xb2", .y = "x", .n = dim});
    b.Op({.kind = "rmsnorm", .w = b.Vector(blk + "ffn_norm", L.ffn_norm, dim), .x = "x", .y = "xb", .n = dim});
    if (c.moe.n_experts > 0) {
      AddMoeFfnOps(c, L, blk, &b);
      continue;
    }
    b.Op({.kind = "matvec", .w = b.Matrix(blk + "ffn_gate", L.w1), .x = "xb", .y = "hb"});
    b.Op({.kind = "matvec", .w = b.Matrix(blk + "ffn_up", L.w3), .x = "xb", .y = "hb2"});
    b.Op({.kind = "swiglu", .x = "hb2", .y = "hb", .n = hidden});
    b.Op({.kind = "matvec", .w = b.Matrix(blk + "ffn_down", L.w2), .x = "hb", .y = "xb"});
    b.Op({.kind = "add", .x = "xb", .y = "x", .n = dim});
  }
  b.Op({.kind = "rmsnorm", .w = b.Vector("output_norm", w.final_norm, dim), .x = "x", .y = "xb", .n = dim});
  b.Op({.kind = "matvec", .w = b.Matrix("output", w.classifier), .x = "xb", .y = "logits"});
  b.Op({.kind = "argmax", .x = "logits", .n = c.vocab_size});
  if (!b.status().ok()) return b.status();
  return p;
}

std::string GpuProgramJson(const GpuProgram& p) {
  const kvq::DecoderConfig& c = p.config;
  nlohmann::json tensors = nlohmann::json::array();
  for (const GpuTensor& t : p.tensors) {
    tensors.push_back({{"name", t.name}, {"type", t.type}, {"layout", t.layout},
                       {"address", static_cast<double>(t.address)}, {"bytes", t.bytes}, {"rows", t.rows},
                       {"cols", t.cols}});
    if (t.file_offset >= 0) tensors.back()["file_offset"] = static_cast<double>(t.file_offset);
  }
  nlohmann::json buffers = nlohmann::json::object();
  for (const auto& [name, n] : p.buffers) buffers[name] = n;
  nlohmann::json states = nlohmann::json::object();
  for (const auto& [name, n] : p.states) states[name] = n;
  nlohmann::json ops = nlohmann::json::array();
  for (const GpuOp& o : p.ops) {
    nlohmann::json j{{"kind", o.kind}};
    if (o.w >= 0) j["w"] = o.w;
    if (!o.x.empty()) j["x"] = o.x;
    if (!o.y.empty()) j["y"] = o.y;
    if (!o.k.empty()) j["k"] = o.k;
    if (!o.k_pre.empty()) j["k_pre"] = o.k_pre;
    if (!o.v.empty()) j["v"] = o.v;
    if (!o.state.empty()) j["state"] = o.state;
    if (!o.gates.empty()) j["gates"] = o.gates;
    if (o.y_offset > 0) j["y_offset"] = o.y_offset;
    if (!o.sel.empty()) j["sel"] = o.sel;
    if (!o.gate.empty()) j["gate"] = o.gate;
    if (o.n > 0) j["n"] = o.n;
    if (o.x_stride > 0) j["x_stride"] = o.x_stride;
    if (o.top_k > 0) j["top_k"] = o.top_k;
    if (o.heads > 0) j["heads"] = o.heads;
    if (o.layer >= 0) j["layer"] = o.layer;
    ops.push_back(std::move(j));
  }
  const int32_t rot = c.rope_dims > 0 ? c.rope_dims : c.head_dim();
  nlohmann::json config{{"arch", c.arch}, {"dim", c.dim}, {"hidden_dim", c.hidden_dim}, {"n_layers", c.n_layers},
                        {"n_heads", c.n_heads}, {"n_kv_heads", c.n_kv_heads}, {"head_dim", c.head_dim()},
                        {"q_dim", c.q_dim()}, {"kv_dim", c.kv_dim()}, {"vocab_size", c.vocab_size},
                        {"norm_eps", c.norm_eps},
                        {"rope_pairing", c.rope_pairing == kvq::RopePairing::kAdjacent ? "adjacent" : "halves"},
                        {"rotary_dims", rot}, {"n_cache_layers", c.n_attention_layers()}};
  if (!p.states.empty()) {
    const kvq::DeltaNetConfig& d = c.delta_net;
    config["delta_net"] = {{"conv_kernel", d.conv_kernel}, {"key_dim", d.key_dim}, {"n_k_heads", d.n_k_heads},
                           {"n_v_heads", d.n_v_heads}, {"value_dim", d.value_dim},
                           {"v_head_map", d.v_head_map == kvq::VHeadMap::kModulo ? "modulo" : "grouped"}};
  }
  config["moe"] = {{"n_experts", c.moe.n_experts}, {"n_experts_used", c.moe.n_experts_used},
                   {"expert_hidden_dim", c.moe.expert_hidden_dim}};
  return nlohmann::json{{"config", config}, {"tensors", tensors}, {"buffers", buffers}, {"states", states},
                        {"ops", ops}}.dump();
}

}  // namespace kvq_web
