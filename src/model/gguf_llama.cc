// LoadGgufLlama (see gguf_llama.h). GGUF stores a matrix with ne[0] = its row length, so a
// tensor of dims [cols, rows] is a Matrix of `rows` rows of `cols` numbers. Metadata keys are
// prefixed by the architecture ("qwen2.embedding_length"). The rotary pairing follows llama.cpp:
// its converters permute llama/mistral Q and K rows for adjacent-pair rotation (llama2.c's layout)
// and leave qwen2's and qwen3's as trained (halves, "NeoX"). The head size is
// attention.key_length where the file has it (any architecture), else dim / n_heads.
#include "model/gguf_llama.h"

#include <fmt/format.h>

#include <cmath>

#include "base/checksum.h"
#include "gguf/architectures.h"
#include "kvq/format.h"
#include "model/gguf_hybrid.h"
#include "model/gguf_tensors.h"

namespace kvq {

Result<DecoderWeights> LoadGgufLlama(std::shared_ptr<GgufFile> file) {
  const std::string& path = file->path();
  Result<std::string> arch_name = file->GetString("general.architecture");
  if (!arch_name.ok()) return arch_name.status();
  const Architecture* arch = FindArchitecture(*arch_name);
  if (arch == nullptr) {
    return Status::Error(fmt::format("{}: architecture '{}' is not supported (supported: {})", path,
                                     *arch_name, ArchitectureNames()));
  }
  const Architecture* hybrid = arch->hybrid() ? arch : nullptr;
  const std::string pre = std::string(arch->name) + ".";
  // A count, or a per-layer array of it (some hybrid GGUFs store head counts per layer, 0 for the
  // layers without attention): the array's non-zero entries must agree, and are the count.
  auto u32 = [&](const std::string& key) -> Result<uint32_t> {
    Result<const GgufArray*> a = file->GetArray(pre + key);
    if (!a.ok()) return file->GetU32(pre + key);
    uint32_t value = 0;
    for (int64_t i = 0; i < (*a)->size; ++i) {
      const double x = (*a)->NumberAt(i);
      if (x == 0) continue;
      if (value != 0 && x != value) {
        return Status::Error(
            fmt::format("{}: {}{} holds {} and {} for different layers; kvq needs one value for "
                        "every layer",
                        path, pre, key, value, x));
      }
      value = static_cast<uint32_t>(x);
    }
    return value;
  };
  DecoderConfig c;
  c.arch = arch->name;
  c.rope_pairing = arch->pairing;
  c.qkv_bias = arch->qkv_bias;
  c.qk_norm = arch->qk_norm;
  const std::pair<const char*, int32_t*> required[] = {
      {"embedding_length", &c.dim}, {"feed_forward_length", &c.hidden_dim},
      {"block_count", &c.n_layers}, {"attention.head_count", &c.n_heads},
      {"context_length", &c.seq_len}};
  for (const auto& [key, field] : required) {
    // An experts model needs no dense FFN width (llama.cpp reads it only as a default).
    const bool optional =
        hybrid != nullptr && hybrid->moe && key == std::string("feed_forward_length");
    if (optional && !file->Has(pre + key)) continue;
    Result<uint32_t> v = u32(key);
    if (!v.ok()) return v.status();
    if (*v == 0 || *v > (1u << 24)) return Status::Error(fmt::format("{}: {}{} = {} is not plausible", path, pre, key, *v));
    *field = static_cast<int32_t>(*v);
  }
  // Every block has tensors of its own, so a file cannot hold more blocks than tensors: checked
  // before anything is sized by the count (a 30 KB file declaring 100,000 blocks asked for 50 MB
  // of layer views; fuzz finding). Not before the metadata checks, which a file without tensors
  // can still fail on.
  const auto check_block_count = [&]() -> Status {
    if (static_cast<uint64_t>(c.n_layers) <= file->tensors().size()) return Status::Ok();
    return Status::Error(fmt::format("{}: {}block_count = {}, but the file holds only {} tensors (each block has "
                                     "its own)", path, pre, c.n_layers, file->tensors().size()));
  };
  c.n_kv_heads = c.n_heads;
  if (file->Has(pre + "attention.head_count_kv")) {
    Result<uint32_t> v = u32("attention.head_count_kv");
    if (!v.ok()) return v.status();
    c.n_kv_heads = static_cast<int32_t>(*v);
  }
  const std::pair<const char*, float*> optional_floats[] = {
      {"rope.freq_base", &c.rope_theta}, {"attention.layer_norm_rms_epsilon", &c.norm_eps}};
  for (const auto& [key, field] : optional_floats) {
    if (!file->Has(pre + key)) continue;
    Result<float> v = file->GetF32(pre + key);
    if (!v.ok()) return v.status();
    *field = *v;
  }
  // A zero, negative or non-finite base makes every rotation angle inf or NaN (a fuzz finding); an
  // epsilon likewise every norm.
  if (!(c.rope_theta > 0.0f && std::isfinite(c.rope_theta))) {
    return Status::Error(fmt::format("{}: {}rope.freq_base = {} must be a positive finite number (e.g. 10000)", path,
                                     pre, c.rope_theta));
  }
  if (!(c.norm_eps >= 0.0f && std::isfinite(c.norm_eps))) {
    return Status::Error(fmt::format("{}: {}attention.layer_norm_rms_epsilon = {} must be a finite number >= 0",
                                     path, pre, c.norm_eps));
  }
  // The head size: key_length when the file gives it (Qwen3: 128 with dim 1024 and 16 heads), which
  // kvq's cache and attention need equal to value_length.
  if (file->Has(pre + "attention.key_length")) {
    Result<uint32_t> key = u32("attention.key_length");
    if (!key.ok()) return key.status();
    uint32_t value = *key;
    if (file->Has(pre + "attention.value_length")) {
      Result<uint32_t> v = u32("attention.value_length");
      if (!v.ok()) return v.status();
      value = *v;
    }
    if (*key != value) {
      return Status::Error(fmt::format("{}: {}attention.key_length = {} differs from {}attention.value_length = {}; "
                                       "kvq supports K and V heads of one size only", path, pre, *key, pre, value));
    }
    if (*key == 0 || *key > static_cast<uint32_t>(kMaxHeadDim) || *key % 2 != 0) {
      return Status::Error(fmt::format("{}: {}attention.key_length = {} is not an even head size in 2..{}", path,
                                       pre, *key, kMaxHeadDim));
    }
    c.head_dim_override = static_cast<int32_t>(*key);
  } else if (file->Has(pre + "attention.value_length")) {
    return Status::Error(fmt::format("{}: {}attention.value_length without attention.key_length", path, pre));
  }
  if (c.n_kv_heads <= 0 || c.n_heads % c.n_kv_heads != 0) {
    return Status::Error(fmt::format("{}: {} KV heads do not divide {} heads", path, c.n_kv_heads, c.n_heads));
  }
  if (c.head_dim_override == 0 && (c.dim % c.n_heads != 0 || c.head_dim() % 2 != 0)) {
    return Status::Error(fmt::format("{}: {} heads do not divide dim {} into even head rows (and the file gives no "
                                     "{}attention.key_length)", path, c.n_heads, c.dim, pre));
  }
  if (hybrid != nullptr) {  // partial RoPE, layer kinds, DeltaNet and expert sizes
    if (Status s = check_block_count(); !s.ok()) return s;  // before layer_kinds is sized
    if (Status s = ReadHybridConfig(*file, pre, *hybrid, &c); !s.ok()) return s;
  } else if (file->Has(pre + "rope.dimension_count")) {
    Result<uint32_t> v = u32("rope.dimension_count");
    if (!v.ok()) return v.status();
    if (static_cast<int64_t>(*v) != c.head_dim()) {
      return Status::Error(fmt::format("{}: {}rope.dimension_count = {} rotates part of a head (head_dim {}); kvq "
                                       "supports rotating whole heads only", path, pre, *v, c.head_dim()));
    }
  }
  // RoPE scaling: linear (positions divided by the factor) or none; Llama 3.1's scaling arrives as
  // the rope_freqs.weight tensor (read below). YaRN and others change attention itself: refused.
  if (file->Has(pre + "rope.scaling.type")) {
    Result<std::string> type = file->GetString(pre + "rope.scaling.type");
    if (!type.ok()) return type.status();
    if (*type == "linear") {
      Result<float> factor = file->GetF32(pre + "rope.scaling.factor");
      if (!factor.ok()) return factor.status();
      if (!(*factor >= 1.0f && *factor <= 1024.0f)) {
        return Status::Error(fmt::format("{}: {}rope.scaling.factor = {} is not in [1, 1024]", path, pre, *factor));
      }
      c.rope_position_scale = 1.0f / *factor;
    } else if (*type != "none") {
      return Status::Error(fmt::format("{}: {}rope.scaling.type '{}' is not supported (supported: none, linear, and "
                                       "Llama 3.1 frequency factors in rope_freqs.weight)", path, pre, *type));
    }
  }
  // Mistral's sliding window: kvq attends to every position, which is the same thing while the
  // context is within the window, so the usable context stops at the window.
  if (file->Has(pre + "attention.sliding_window")) {
    Result<uint32_t> v = u32("attention.sliding_window");
    if (!v.ok()) return v.status();
    if (*v > 0 && static_cast<int32_t>(*v) < c.seq_len) c.seq_len = static_cast<int32_t>(*v);
  }

  DecoderWeights w;
  w.fingerprint_seed = Checksum64(path.data(), 0);  // the hash of no bytes, as snapshots have always used
  GgufTensorReader reader(*file, &w);
  auto tensor = [&](const std::string& name, int64_t cols, int64_t rows) {
    return reader.Get(name, cols, rows);
  };
  // An F32 vector of n numbers (norm weights, biases, frequency factors).
  auto vector = [&](const std::string& name, int64_t n) { return reader.F32(name, {n}); };
  auto norm = [&](const std::string& name) { return vector(name, c.dim); };
  if (reader.Has("rope_freqs.weight")) {
    Result<const float*> f = vector("rope_freqs.weight", c.head_dim() / 2);
    if (!f.ok()) return f.status();
    if (*f == nullptr) {  // GgufFile::OpenHeader: the factors are read at load, so the bytes are needed
      return Status::Error(fmt::format("{}: rope_freqs.weight is read at load and only the file's header was given",
                                       path));
    }
    c.rope_freq_factors.assign(*f, *f + c.head_dim() / 2);
    for (float factor : c.rope_freq_factors) {
      if (!(factor > 0.0f && std::isfinite(factor))) {
        return Status::Error(fmt::format("{}: rope_freqs.weight holds {}; frequency factors must be positive", path,
                                         factor));
      }
    }
  }
  Result<const GgufTensor*> embd = file->FindTensor("token_embd.weight");
  if (!embd.ok()) return embd.status();
  if ((*embd)->dims.size() != 2) return Status::Error(fmt::format("{}: token_embd.weight must be 2-D", path));
  c.vocab_size = static_cast<int32_t>((*embd)->dims[1]);
  Result<Matrix> m = tensor("token_embd.weight", c.dim, c.vocab_size);
  if (!m.ok()) return m.status();
  w.token_embedding = *m;
  const int64_t d = c.dim, q = c.q_dim(), kv = c.kv_dim(), hd = c.hidden_dim;
  if (Status s = check_block_count(); !s.ok()) return s;
  w.layers.resize(c.n_layers);
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const std::string blk = fmt::format("blk.{}.", l);
    LayerWeights& L = w.layers[l];
    if (hybrid != nullptr) {
      if (Status s = LoadHybridLayer(reader, c, *hybrid, l, &L); !s.ok()) return s;
      continue;
    }
    Result<const float*> an = norm(blk + "attn_norm.weight");
    Result<const float*> fn = norm(blk + "ffn_norm.weight");
    if (!an.ok()) return an.status();
    if (!fn.ok()) return fn.status();
    L.attn_norm = *an;
    L.ffn_norm = *fn;
    if (c.qkv_bias) {
      const struct { const char* name; int64_t n; const float** out; } biases[] = {
          {"attn_q.bias", q, &L.bq}, {"attn_k.bias", kv, &L.bk}, {"attn_v.bias", kv, &L.bv}};
      for (const auto& b : biases) {
        Result<const float*> t = vector(blk + b.name, b.n);
        if (!t.ok()) return t.status();
        *b.out = *t;
      }
    }
    if (c.qk_norm) {
      Result<const float*> qn = vector(blk + "attn_q_norm.weight", c.head_dim());
      if (!qn.ok()) return qn.status();
      Result<const float*> kn = vector(blk + "attn_k_norm.weight", c.head_dim());
      if (!kn.ok()) return kn.status();
      L.q_norm = *qn;
      L.k_norm = *kn;
    }
    const struct { const char* name; int64_t cols, rows; Matrix* out; } mats[] = {
        {"attn_q.weight", d, q, &L.wq},       {"attn_k.weight", d, kv, &L.wk},
        {"attn_v.weight", d, kv, &L.wv},      {"attn_output.weight", q, d, &L.wo},
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
  if (reader.Has("output.weight")) {
    Result<Matrix> cls = tensor("output.weight", c.dim, c.vocab_size);
    if (!cls.ok()) return cls.status();
    w.classifier = *cls;
  } else {
    w.classifier = w.token_embedding;  // tied embeddings
  }
  w.config = c;
  w.source = path;
  w.storage = file;
  return w;
}

}  // namespace kvq
