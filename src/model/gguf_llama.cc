// LoadGgufLlama (see gguf_llama.h). GGUF stores a matrix with ne[0] = its row length, so a
// tensor of dims [cols, rows] is a Matrix of `rows` rows of `cols` numbers. The rotary layout
// needs no change: llama.cpp's converters already arrange Q and K for adjacent-pair rotation,
// which is what the forward pass (llama2.c's layout) applies.
#include "model/gguf_llama.h"

#include <fmt/format.h>

#include "cache/snapshot.h"
#include "model/matvec.h"

namespace kvq {
namespace {

Result<WeightType> ToWeightType(const GgufTensor& t, const std::string& path) {
  switch (t.type) {
    case GgmlType::kF32: return WeightType::kF32;
    case GgmlType::kF16: return WeightType::kF16;
    case GgmlType::kBF16: return WeightType::kBf16;
    case GgmlType::kQ8_0: return WeightType::kQ8_0;
    case GgmlType::kQ4_0: return WeightType::kQ4_0;
    default:
      return Status::Error(fmt::format("{}: tensor '{}' has type {}, which kvq does not support "
                                       "(supported: F32, F16, BF16, Q8_0, Q4_0)", path, t.name,
                                       GgmlTypeName(t.type)));
  }
}

}  // namespace

Result<LlamaWeights> LoadGgufLlama(std::shared_ptr<GgufFile> file) {
  const std::string& path = file->path();
  Result<std::string> arch = file->GetString("general.architecture");
  if (!arch.ok()) return arch.status();
  if (*arch != "llama") {
    return Status::Error(fmt::format("{}: architecture '{}' is not supported (supported: llama)", path, *arch));
  }
  auto u32 = [&](const char* key) { return file->GetU32(key); };
  LlamaConfig c;
  const std::pair<const char*, int32_t*> required[] = {
      {"llama.embedding_length", &c.dim}, {"llama.feed_forward_length", &c.hidden_dim},
      {"llama.block_count", &c.n_layers}, {"llama.attention.head_count", &c.n_heads},
      {"llama.context_length", &c.seq_len}};
  for (const auto& [key, field] : required) {
    Result<uint32_t> v = u32(key);
    if (!v.ok()) return v.status();
    if (*v == 0 || *v > (1u << 24)) return Status::Error(fmt::format("{}: {} = {} is not plausible", path, key, *v));
    *field = static_cast<int32_t>(*v);
  }
  c.n_kv_heads = c.n_heads;
  if (file->Has("llama.attention.head_count_kv")) {
    Result<uint32_t> v = u32("llama.attention.head_count_kv");
    if (!v.ok()) return v.status();
    c.n_kv_heads = static_cast<int32_t>(*v);
  }
  if (file->Has("llama.rope.freq_base")) {
    Result<float> v = file->GetF32("llama.rope.freq_base");
    if (!v.ok()) return v.status();
    c.rope_theta = *v;
  }
  if (file->Has("llama.attention.layer_norm_rms_epsilon")) {
    Result<float> v = file->GetF32("llama.attention.layer_norm_rms_epsilon");
    if (!v.ok()) return v.status();
    c.norm_eps = *v;
  }
  if (c.n_kv_heads <= 0 || c.dim % c.n_heads != 0 || c.n_heads % c.n_kv_heads != 0) {
    return Status::Error(fmt::format("{}: {} heads and {} KV heads do not divide dim {}", path, c.n_heads,
                                     c.n_kv_heads, c.dim));
  }
  if (file->Has("llama.rope.scaling.type")) {
    return Status::Error(fmt::format("{}: RoPE scaling (llama.rope.scaling.*) is not supported yet", path));
  }

  LlamaWeights w;
  uint64_t hash = Checksum64(path.data(), 0);
  // A tensor by name, checked to be [cols, rows] (rows = 0: a vector of cols numbers).
  auto tensor = [&](const std::string& name, int64_t cols, int64_t rows) -> Result<Matrix> {
    Result<const GgufTensor*> t = file->FindTensor(name);
    if (!t.ok()) return t.status();
    const std::vector<int64_t> want = rows == 0 ? std::vector<int64_t>{cols} : std::vector<int64_t>{cols, rows};
    if ((*t)->dims != want) {
      return Status::Error(fmt::format("{}: tensor '{}' has shape [{}]; the metadata implies [{}]", path, name,
                                       fmt::join((*t)->dims, ", "), fmt::join(want, ", ")));
    }
    Result<WeightType> type = ToWeightType(**t, path);
    if (!type.ok()) return type.status();
    hash = Checksum64((*t)->data, static_cast<size_t>((*t)->n_bytes), hash);
    const Matrix matrix{*type, (*t)->data, rows == 0 ? 1 : rows, cols};
    if (Status s = CheckMatrix(matrix); !s.ok()) {
      return Status::Error(fmt::format("{}: tensor '{}': {}", path, name, s.message()));
    }
    return matrix;
  };
  auto norm = [&](const std::string& name) -> Result<const float*> {
    Result<Matrix> m = tensor(name, c.dim, 0);
    if (!m.ok()) return m.status();
    if (m->type != WeightType::kF32) {
      return Status::Error(fmt::format("{}: norm tensor '{}' must be F32 (is {})", path, name, WeightTypeName(m->type)));
    }
    return reinterpret_cast<const float*>(m->data);
  };
  Result<const GgufTensor*> embd = file->FindTensor("token_embd.weight");
  if (!embd.ok()) return embd.status();
  if ((*embd)->dims.size() != 2) return Status::Error(fmt::format("{}: token_embd.weight must be 2-D", path));
  c.vocab_size = static_cast<int32_t>((*embd)->dims[1]);
  Result<Matrix> m = tensor("token_embd.weight", c.dim, c.vocab_size);
  if (!m.ok()) return m.status();
  w.token_embedding = *m;
  const int64_t d = c.dim, kv = c.kv_dim(), hd = c.hidden_dim;
  w.layers.resize(c.n_layers);
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const std::string blk = fmt::format("blk.{}.", l);
    LayerWeights& L = w.layers[l];
    Result<const float*> an = norm(blk + "attn_norm.weight");
    Result<const float*> fn = norm(blk + "ffn_norm.weight");
    if (!an.ok()) return an.status();
    if (!fn.ok()) return fn.status();
    L.attn_norm = *an;
    L.ffn_norm = *fn;
    const struct { const char* name; int64_t cols, rows; Matrix* out; } mats[] = {
        {"attn_q.weight", d, d, &L.wq},       {"attn_k.weight", d, kv, &L.wk},
        {"attn_v.weight", d, kv, &L.wv},      {"attn_output.weight", d, d, &L.wo},
        {"ffn_gate.weight", d, hd, &L.w1},    {"ffn_down.weight", hd, d, &L.w2},
        {"ffn_up.weight", d, hd, &L.w3}};
    for (const auto& spec : mats) {
      Result<Matrix> t = tensor(blk + spec.name, spec.cols, spec.rows);
      if (!t.ok()) return t.status();
      *spec.out = *t;
    }
  }
  Result<const float*> fin = norm("output_norm.weight");
  if (!fin.ok()) return fin.status();
  w.final_norm = *fin;
  bool has_output = false;
  for (const GgufTensor& t : file->tensors()) has_output = has_output || t.name == "output.weight";
  if (has_output) {
    Result<Matrix> cls = tensor("output.weight", c.dim, c.vocab_size);
    if (!cls.ok()) return cls.status();
    w.classifier = *cls;
  } else {
    w.classifier = w.token_embedding;  // tied embeddings
  }
  w.config = c;
  w.source = path;
  w.fingerprint_hash = hash;
  w.storage = file;
  return w;
}

}  // namespace kvq
