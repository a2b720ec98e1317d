// ReadHybridConfig and LoadHybridLayer (see gguf_hybrid.h). Key and tensor names are llama.cpp's
// (src/llama-arch.cpp); the rules they follow are cited from docs/hybrid_models_spec.md by section.
#include "model/gguf_hybrid.h"

#include <fmt/format.h>

#include <cmath>

namespace kvq {
namespace {

// An unsigned key in 1..max, or `fallback` when absent and fallback ≥ 0 (required otherwise).
Result<int32_t> Count(const GgufFile& file, const std::string& key, int64_t fallback,
                      int64_t max = 1 << 24) {
  if (!file.Has(key)) {
    if (fallback >= 0) return static_cast<int32_t>(fallback);
    return Status::Error(
        fmt::format("{}: the hybrid architecture needs metadata key '{}'", file.path(), key));
  }
  Result<uint32_t> v = file.GetU32(key);
  if (!v.ok()) return v.status();
  if (*v == 0 || *v > max) {
    return Status::Error(fmt::format("{}: {} = {} is not in 1..{}", file.path(), key, *v, max));
  }
  return static_cast<int32_t>(*v);
}

}  // namespace

Status ReadHybridConfig(const GgufFile& file, const std::string& pre, const Architecture& arch,
                        DecoderConfig* c) {
  const std::string& path = file.path();
  c->qk_norm = true;
  c->attn_output_gate = true;
  // §1.2: MTP layers are appended to block_count; the main pass runs the others.
  int32_t nextn = 0;
  if (file.Has(pre + "nextn_predict_layers")) {
    Result<uint32_t> v = file.GetU32(pre + "nextn_predict_layers");
    if (!v.ok()) return v.status();
    if (*v >= static_cast<uint32_t>(c->n_layers)) {
      return Status::Error(
          fmt::format("{}: {}nextn_predict_layers = {} leaves no layers of block_count {}", path,
                      pre, *v, c->n_layers));
    }
    nextn = static_cast<int32_t>(*v);
  }
  const int32_t block_count = c->n_layers;
  c->n_layers -= nextn;
  // §1.1: an explicit per-layer array, else every interval-th layer is full attention.
  c->layer_kinds.assign(c->n_layers, LayerKind::kAttention);
  if (file.Has(pre + "attention.recurrent_layers")) {
    Result<const GgufArray*> a = file.GetArray(pre + "attention.recurrent_layers");
    if (!a.ok()) return a.status();
    if ((*a)->size != block_count && (*a)->size != c->n_layers) {
      return Status::Error(
          fmt::format("{}: {}attention.recurrent_layers has {} entries; expected one per layer "
                      "({})",
                      path, pre, (*a)->size, block_count));
    }
    for (int32_t l = 0; l < c->n_layers; ++l) {
      if ((*a)->NumberAt(l) != 0) c->layer_kinds[l] = LayerKind::kRecurrent;
    }
  } else {
    Result<int32_t> interval = Count(file, pre + "full_attention_interval", 4);
    if (!interval.ok()) return interval.status();
    for (int32_t l = 0; l < c->n_layers; ++l) {
      if ((l + 1) % *interval != 0) c->layer_kinds[l] = LayerKind::kRecurrent;
    }
  }
  if (c->n_attention_layers() == 0) {
    return Status::Error(fmt::format(
        "{}: every layer is recurrent; kvq needs at least one full-attention layer", path));
  }
  // §4.4: rope.dimension_count numbers of each head rotate (64 of 256), NEOX halves; text-only
  // IMROPE (rope.dimension_sections) is that same rotation.
  Result<int32_t> rot = Count(file, pre + "rope.dimension_count", c->head_dim());
  if (!rot.ok()) return rot.status();
  if (*rot % 2 != 0 || *rot > c->head_dim()) {
    return Status::Error(
        fmt::format("{}: {}rope.dimension_count = {} is not an even number of at most head_dim {}",
                    path, pre, *rot, c->head_dim()));
  }
  c->rope_dims = *rot == c->head_dim() ? 0 : *rot;
  // Qwen3.5's multimodal RoPE sections split the rotated pairs among positions (time, height,
  // width); text gives each the same position, so the rotation is the one above whatever the split,
  // but the sections must cover exactly the rotated pairs.
  if (file.Has(pre + "rope.dimension_sections")) {
    Result<const GgufArray*> a = file.GetArray(pre + "rope.dimension_sections");
    if (!a.ok()) return a.status();
    double pairs = 0;
    bool whole = (*a)->size >= 1 && (*a)->size <= 4 && (*a)->strings.empty() && (*a)->arrays.empty();
    for (int64_t i = 0; whole && i < (*a)->size; ++i) {
      const double v = (*a)->NumberAt(i);
      whole = v >= 0 && v == std::floor(v);
      pairs += v;
    }
    if (!whole || pairs != *rot / 2) {
      return Status::Error(fmt::format(
          "{}: {}rope.dimension_sections must be up to 4 non-negative integers that sum to the rotated "
          "pairs, rope.dimension_count / 2 = {} (Qwen3.5: [11, 11, 10, 0] of 64 rotated dims)",
          path, pre, *rot / 2));
    }
  }
  if (file.Has(pre + "attention.scale")) {
    Result<float> scale = file.GetF32(pre + "attention.scale");
    if (!scale.ok()) return scale.status();
    const float usual = 1.0f / std::sqrt(static_cast<float>(c->head_dim()));
    if (*scale != 0.0f && std::fabs(*scale - usual) > 1e-6f * usual) {
      return Status::Error(
          fmt::format("{}: {}attention.scale = {}; kvq supports only 1/sqrt(head_dim) = {}", path,
                      pre, *scale, usual));
    }
  }
  // §2: the Gated DeltaNet sizes, all required.
  DeltaNetConfig& d = c->delta_net;
  d.v_head_map = arch.v_heads_grouped ? VHeadMap::kDivide : VHeadMap::kModulo;
  const std::pair<const char*, int32_t*> ssm[] = {{"ssm.conv_kernel", &d.conv_kernel},
                                                  {"ssm.state_size", &d.key_dim},
                                                  {"ssm.group_count", &d.n_k_heads},
                                                  {"ssm.time_step_rank", &d.n_v_heads}};
  for (const auto& [key, field] : ssm) {
    Result<int32_t> v = Count(file, pre + key, -1, 4096);
    if (!v.ok()) return v.status();
    *field = *v;
  }
  Result<int32_t> inner = Count(file, pre + "ssm.inner_size", -1);
  if (!inner.ok()) return inner.status();
  if (*inner % d.n_v_heads != 0 || *inner / d.n_v_heads != d.key_dim) {
    return Status::Error(
        fmt::format("{}: {}ssm.inner_size = {} is not ssm.state_size {} x ssm.time_step_rank {}; "
                    "kvq (like llama.cpp) needs value heads as wide as key heads",
                    path, pre, *inner, d.key_dim, d.n_v_heads));
  }
  d.value_dim = *inner / d.n_v_heads;
  if (d.n_v_heads % d.n_k_heads != 0) {
    return Status::Error(
        fmt::format("{}: {}ssm.group_count = {} does not divide ssm.time_step_rank = {}", path, pre,
                    d.n_k_heads, d.n_v_heads));
  }
  if (!arch.moe) return Status::Ok();
  // §2, §3.7: experts; the shared expert's width becomes hidden_dim (its gate/up/down are
  // w1/w3/w2).
  MoeConfig& m = c->moe;
  Result<int32_t> n_experts = Count(file, pre + "expert_count", -1, 65536);
  if (!n_experts.ok()) return n_experts.status();
  Result<int32_t> used = Count(file, pre + "expert_used_count", -1, *n_experts);
  if (!used.ok()) return used.status();
  m.n_experts = *n_experts;
  m.n_experts_used = *used;
  const int64_t dense = c->hidden_dim;  // feed_forward_length, 0 when absent
  Result<int32_t> fe =
      Count(file, pre + "expert_feed_forward_length", dense > 0 ? dense / *used : -1);
  Result<int32_t> fs =
      Count(file, pre + "expert_shared_feed_forward_length", dense > 0 ? dense : -1);
  if (!fe.ok()) return fe.status();
  if (!fs.ok()) return fs.status();
  m.expert_hidden_dim = *fe;
  m.shared_hidden_dim = *fs;
  c->hidden_dim = *fs;
  return Status::Ok();
}

Status LoadHybridLayer(GgufTensorReader& t, const DecoderConfig& c, const Architecture& arch,
                       int32_t layer, LayerWeights* L) {
  const std::string blk = fmt::format("blk.{}.", layer);
  const int64_t E = c.dim;
  // Each entry: where a tensor goes, its GGUF dims. Norms and the small per-head vectors are F32.
  struct F32Spec {
    const char* name;
    std::vector<int64_t> dims;
    const float** out;
  };
  struct MatSpec {
    const char* name;
    std::vector<int64_t> dims;
    Matrix* out;
  };
  std::vector<F32Spec> vectors = {{"attn_norm.weight", {E}, &L->attn_norm},
                                  {"post_attention_norm.weight", {E}, &L->ffn_norm}};
  std::vector<MatSpec> matrices;
  if (c.is_recurrent(layer)) {
    const DeltaNetConfig& d = c.delta_net;
    const int64_t C = d.conv_channels(), Cv = d.v_channels(), Hv = d.n_v_heads;
    if (!t.Has(blk + "attn_qkv.weight") && t.Has(blk + "ssm_in.weight")) {
      return Status::Error(
          fmt::format("{}: layer {} holds the legacy fused '{}ssm_in.weight' (q, k, v, z "
                      "interleaved per key head); kvq reads attn_qkv + attn_gate, as current "
                      "llama.cpp converters write them: convert the model again",
                      t.path(), layer, blk));
    }
    matrices.push_back({"attn_qkv.weight", {E, C}, &L->ssm_qkv});
    matrices.push_back({"attn_gate.weight", {E, Cv}, &L->ssm_gate});
    if (arch.fused_ba) {
      matrices.push_back({"ssm_ba.weight", {E, 2 * Hv}, &L->ssm_ba});
    } else {
      matrices.push_back({"ssm_beta.weight", {E, Hv}, &L->ssm_beta});
      matrices.push_back({"ssm_alpha.weight", {E, Hv}, &L->ssm_alpha});
    }
    matrices.push_back({"ssm_out.weight", {Cv, E}, &L->ssm_out});
    vectors.push_back({"ssm_conv1d.weight", {d.conv_kernel, C}, &L->ssm_conv});
    vectors.push_back({"ssm_dt.bias", {Hv}, &L->ssm_dt_bias});
    vectors.push_back({"ssm_a", {Hv}, &L->ssm_a});
    vectors.push_back({"ssm_norm.weight", {d.value_dim}, &L->ssm_norm});
  } else {
    const int64_t D = c.head_dim(), q = c.q_dim(), kv = c.kv_dim();
    matrices.push_back({"attn_q.weight", {E, 2 * q}, &L->wq});  // per head [q, gate]
    matrices.push_back({"attn_k.weight", {E, kv}, &L->wk});
    matrices.push_back({"attn_v.weight", {E, kv}, &L->wv});
    matrices.push_back({"attn_output.weight", {q, E}, &L->wo});
    vectors.push_back({"attn_q_norm.weight", {D}, &L->q_norm});
    vectors.push_back({"attn_k_norm.weight", {D}, &L->k_norm});
  }
  const int64_t F = c.hidden_dim;  // dense FFN, or the shared expert
  const std::string ffn = c.moe.n_experts > 0 ? "_shexp" : "";
  matrices.push_back({nullptr, {E, F}, &L->w1});
  matrices.push_back({nullptr, {E, F}, &L->w3});
  matrices.push_back({nullptr, {F, E}, &L->w2});
  const std::string ffn_names[] = {"ffn_gate" + ffn + ".weight", "ffn_up" + ffn + ".weight",
                                   "ffn_down" + ffn + ".weight"};
  if (c.moe.n_experts > 0) {
    const int64_t NE = c.moe.n_experts, Fe = c.moe.expert_hidden_dim;
    matrices.push_back({"ffn_gate_inp.weight", {E, NE}, &L->router});
    matrices.push_back({"ffn_gate_exps.weight", {E, Fe, NE}, &L->gate_exps});
    matrices.push_back({"ffn_up_exps.weight", {E, Fe, NE}, &L->up_exps});
    matrices.push_back({"ffn_down_exps.weight", {Fe, E, NE}, &L->down_exps});
  }
  for (size_t i = 0, ffn_i = 0; i < matrices.size(); ++i) {
    const std::string name =
        blk + (matrices[i].name != nullptr ? matrices[i].name : ffn_names[ffn_i++]);
    Result<Matrix> m = t.Shaped(name, matrices[i].dims);
    if (!m.ok()) return m.status();
    *matrices[i].out = *m;
  }
  for (const F32Spec& v : vectors) {
    Result<const float*> f = t.F32(blk + v.name, v.dims);
    if (!f.ok()) return f.status();
    *v.out = *f;
  }
  if (c.moe.n_experts > 0) {
    if (L->router.type != WeightType::kF32) {
      return Status::Error(fmt::format("{}: tensor '{}ffn_gate_inp.weight' must be F32 (is {})",
                                       t.path(), blk, WeightTypeName(L->router.type)));
    }
    // The shared expert's gate: a vector [E], or a one-row matrix [E, 1].
    const std::string gate = blk + "ffn_gate_inp_shexp.weight";
    Result<Matrix> g = t.Shaped(gate, {E});
    if (!g.ok()) g = t.Shaped(gate, {E, 1});
    if (!g.ok()) return g.status();
    L->shared_gate = *g;
  }
  return Status::Ok();
}

}  // namespace kvq
