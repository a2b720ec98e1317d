// Synthetic models (see synth.h): validation, the vocabulary copy and the file layout (the presets
// are in synth_presets.cc, the hybrid layers in synth_hybrid.cc).
// Tensors go in the order llama.cpp's converter writes them (rope_freqs, token_embd, each
// block, output_norm, output); matrices are streamed row chunk by row chunk through the GGUF
// writer, so a 7B file needs a few MiB of memory, not its size.
#include "synth/synth.h"

#include <fmt/format.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>

#include "base/float_codes.h"
#include "base/thread_pool.h"
#include "gguf/architectures.h"
#include "gguf/gguf_writer.h"
#include "kvq/format.h"
#include "kvq/units.h"
#include "synth/synth_tensors.h"
#include "synth/synth_weight_type.h"
#include "text/hf_tokenizer_json.h"
#include "weights/weight_type.h"

namespace kvq {
namespace {

// Q/K/V biases: small against the unit-variance projections they are added to.
constexpr float kBiasStd = 0.02f;

// ---- little-endian appends for the padded vocabulary arrays ----

template <typename T>
void Append(std::vector<uint8_t>* out, T v) {
  const size_t at = out->size();
  out->resize(at + sizeof(T));
  std::memcpy(out->data() + at, &v, sizeof(T));
}

// `value` as one element of a numeric array of `type`.
Status AppendNumber(std::vector<uint8_t>* out, GgufValueType type, int32_t value) {
  switch (type) {
    case GgufValueType::kUint8: Append(out, static_cast<uint8_t>(value)); break;
    case GgufValueType::kInt8: Append(out, static_cast<int8_t>(value)); break;
    case GgufValueType::kUint16: Append(out, static_cast<uint16_t>(value)); break;
    case GgufValueType::kInt16: Append(out, static_cast<int16_t>(value)); break;
    case GgufValueType::kUint32: Append(out, static_cast<uint32_t>(value)); break;
    case GgufValueType::kInt32: Append(out, value); break;
    case GgufValueType::kUint64: Append(out, static_cast<uint64_t>(value)); break;
    case GgufValueType::kInt64: Append(out, static_cast<int64_t>(value)); break;
    case GgufValueType::kFloat32: Append(out, static_cast<float>(value)); break;
    case GgufValueType::kFloat64: Append(out, static_cast<double>(value)); break;
    default: return Status::Error(fmt::format("holds {}, not numbers", GgufValueTypeName(type)));
  }
  return Status::Ok();
}

// A numeric per-token array (scores, token types) of `n_tokens` entries, extended to
// `vocab_size` entries with `fill`, keeping its element type.
Result<GgufEncoded> PadNumbers(const GgufFile& vocab, const std::string& key, int64_t n_tokens,
                               int64_t vocab_size, int32_t fill) {
  auto bad = [&](std::string_view why) {
    return Status::Error(fmt::format("vocabulary '{}': {} {}", vocab.path(), key, why));
  };
  Result<const GgufArray*> a = vocab.GetArray(key);
  if (!a.ok()) return a.status();
  if ((*a)->size != n_tokens) {
    return bad(fmt::format("has {} entries for {} tokens", (*a)->size, n_tokens));
  }
  GgufEncoded e;
  e.type = GgufValueType::kArray;
  Append<uint32_t>(&e.bytes, static_cast<uint32_t>((*a)->element_type));
  Append<uint64_t>(&e.bytes, static_cast<uint64_t>(vocab_size));
  const int64_t element_bytes = GgufScalarBytes((*a)->element_type);
  if (element_bytes == 0 || (*a)->element_type == GgufValueType::kBool) {
    return bad(fmt::format("holds {}, not numbers", GgufValueTypeName((*a)->element_type)));
  }
  e.bytes.insert(e.bytes.end(), (*a)->raw, (*a)->raw + n_tokens * element_bytes);
  for (int64_t i = n_tokens; i < vocab_size; ++i) {
    if (Status s = AppendNumber(&e.bytes, (*a)->element_type, fill); !s.ok()) return bad(s.message());
  }
  return e;
}

// Every tokenizer.* key of `vocab`, in its order; with `vocab_size` above the vocabulary's own
// size, tokens/scores/token_type padded with control tokens "<|synth_pad_ID|>" of score 0.
Status CopyVocabulary(const GgufFile& vocab, int64_t n_tokens, int64_t vocab_size,
                      GgufWriter* w) {
  constexpr int32_t kControl = 3;  // llama_token_type LLAMA_TOKEN_TYPE_CONTROL
  for (const GgufKeyValue& kv : vocab.metadata()) {
    if (!kv.key.starts_with("tokenizer.")) continue;
    Status s;
    if (vocab_size > n_tokens && kv.key == "tokenizer.ggml.tokens") {
      Result<std::span<const std::string_view>> tokens = vocab.GetStringArray(kv.key);
      if (!tokens.ok()) return tokens.status();
      std::vector<std::string> padded(tokens->begin(), tokens->end());
      padded.reserve(static_cast<size_t>(vocab_size));
      for (int64_t id = n_tokens; id < vocab_size; ++id) {
        padded.push_back(fmt::format("<|synth_pad_{}|>", id));
      }
      s = w->SetStringArray(kv.key, padded);
    } else if (vocab_size > n_tokens &&
               (kv.key == "tokenizer.ggml.scores" || kv.key == "tokenizer.ggml.token_type")) {
      Result<GgufEncoded> e = PadNumbers(vocab, kv.key, n_tokens, vocab_size,
                                         kv.key == "tokenizer.ggml.scores" ? 0 : kControl);
      if (!e.ok()) return e.status();
      s = w->Set(kv.key, std::move(e).value());
    } else {
      s = w->Set(kv.key, GgufEncodeValue(kv.value));
    }
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

// The vocabulary a model carries: a GGUF file's tokenizer.* keys, copied, or a Hugging Face
// tokenizer.json, converted as llama.cpp's converter does (text/hf_tokenizer_json.h).
struct Vocabulary {
  std::string path;
  std::unique_ptr<GgufFile> file;        // a GGUF vocabulary, or
  std::optional<BpeVocabulary> imported;  // a tokenizer.json
  int64_t n_tokens = 0;
};

Result<Vocabulary> OpenVocabulary(const std::string& path) {
  if (std::filesystem::path(path).extension() == ".json") {
    Result<BpeVocabulary> v = ReadHfTokenizerJson(path);
    if (!v.ok()) return Status::Error("--vocab: " + v.status().message());
    const auto n = static_cast<int64_t>(v->tokens.size());
    return Vocabulary{path, nullptr, std::move(v).value(), n};
  }
  Result<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
  if (!f.ok()) return Status::Error("--vocab: " + f.status().message());
  if (!(*f)->Has("tokenizer.ggml.tokens")) {
    return Status::Error(fmt::format("--vocab: '{}' holds no vocabulary (no tokenizer.ggml.tokens)",
                                     path));
  }
  Result<std::span<const std::string_view>> tokens = (*f)->GetStringArray("tokenizer.ggml.tokens");
  if (!tokens.ok()) return Status::Error("--vocab: " + tokens.status().message());
  if (tokens->empty()) return Status::Error(fmt::format("--vocab: '{}' has no tokens", path));
  const auto n = static_cast<int64_t>(tokens->size());
  return Vocabulary{path, std::move(f).value(), std::nullopt, n};
}

// A row source for a matrix of rows `cols` long: rows drawn uniformly on (−a, a) with
// a = sqrt(3 / cols), multiplied by `scale` (--layer-output-scale; 1 leaves them as drawn) and
// encoded in `type` by its registry entry's reference quantiser, rows split across the pool's
// threads.
GgufRowSource MatrixSource(const WeightTypeDesc* desc, int64_t cols, uint64_t tensor_seed, float scale,
                           ThreadPool* pool) {
  const float amplitude = static_cast<float>(std::sqrt(3.0 / static_cast<double>(cols)));
  const int64_t row_bytes = cols / desc->block_elems * desc->block_bytes;
  return [=](int64_t first_row, int64_t n_rows, uint8_t* out) -> Status {
    std::vector<std::vector<float>> scratch(pool->threads(), std::vector<float>(cols));
    pool->Run(n_rows, [&](int64_t i, int32_t thread) {
      float* x = scratch[thread].data();  // [cols]
      SynthDrawRow(tensor_seed, first_row + i, amplitude, x, cols);
      if (scale != 1.0f) {
        for (int64_t c = 0; c < cols; ++c) x[c] *= scale;
      }
      QuantizeRowRef(*desc, x, cols, out + i * row_bytes);
    });
    return Status::Ok();
  };
}

std::vector<uint8_t> F32Bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

using TensorEntry = SynthTensorEntry;

std::vector<TensorEntry> TensorList(const SynthSpec& s) {
  using R = SynthTensorRole;
  std::vector<TensorEntry> t;
  const int64_t d = s.dim, q = s.q_dim(), kv = s.kv_dim(), ffn = s.hidden_dim, hd = s.head_dim();
  // attn_output and ffn_down are the dense block's output projections (SynthTensorEntry).
  auto matrix = [&](std::string name, R role, int64_t cols, int64_t rows, int64_t layer) {
    t.push_back({TensorEntry::kMatrix, std::move(name), cols, rows, role, layer, 0,
                 role == R::kAttnOutput || role == R::kFfnDown});
  };
  auto vec = [&](TensorEntry::Kind kind, std::string name, int64_t n, int64_t layer) {
    t.push_back({kind, std::move(name), n, 0, R::kTokenEmbd, layer});
  };
  if (s.rope_scaling) vec(TensorEntry::kRopeFreqs, "rope_freqs.weight", hd / 2, -1);
  matrix("token_embd.weight", R::kTokenEmbd, d, s.vocab_size, -1);
  for (int64_t l = 0; l < s.n_layers; ++l) {
    if (s.is_hybrid()) {
      AppendHybridLayer(s, l, &t);
      continue;
    }
    const std::string b = fmt::format("blk.{}.", l);
    vec(TensorEntry::kOnes, b + "attn_norm.weight", d, l);
    matrix(b + "attn_q.weight", R::kAttnQ, d, q, l);
    if (s.qkv_bias) vec(TensorEntry::kBias, b + "attn_q.bias", q, l);
    if (s.qk_norm()) vec(TensorEntry::kOnes, b + "attn_q_norm.weight", hd, l);
    matrix(b + "attn_k.weight", R::kAttnK, d, kv, l);
    if (s.qkv_bias) vec(TensorEntry::kBias, b + "attn_k.bias", kv, l);
    if (s.qk_norm()) vec(TensorEntry::kOnes, b + "attn_k_norm.weight", hd, l);
    matrix(b + "attn_v.weight", R::kAttnV, d, kv, l);
    if (s.qkv_bias) vec(TensorEntry::kBias, b + "attn_v.bias", kv, l);
    matrix(b + "attn_output.weight", R::kAttnOutput, q, d, l);
    vec(TensorEntry::kOnes, b + "ffn_norm.weight", d, l);
    matrix(b + "ffn_gate.weight", R::kFfnGate, d, ffn, l);
    matrix(b + "ffn_up.weight", R::kFfnUp, d, ffn, l);
    matrix(b + "ffn_down.weight", R::kFfnDown, ffn, d, l);
  }
  vec(TensorEntry::kOnes, "output_norm.weight", d, -1);
  if (s.embeddings == SynthEmbeddings::kSeparate) matrix("output.weight", R::kOutput, d, s.vocab_size, -1);
  return t;
}

// The registry type of a matrix: --type itself, or the mix's choice for it; its rows must be
// whole blocks. Errors name --type, the tensor and the type.
Result<const WeightTypeDesc*> MatrixType(const SynthSpec& s, const TensorEntry& e) {
  std::string name = s.type;
  if (const TypeMix* mix = FindTypeMix(s.type)) {
    name = MixTensorTypeName(*mix, e.role, e.layer, e.cols,
                             {.n_layers = s.n_layers, .n_heads = s.n_heads, .n_kv_heads = s.kv_heads(),
                              .tied_embeddings = s.embeddings == SynthEmbeddings::kTied});
  }
  Result<const WeightTypeDesc*> d = SynthWeightTypeByName(name);
  if (!d.ok()) {
    return Status::Error(fmt::format("--type {}: tensor '{}': {}", s.type, e.name, d.status().message()));
  }
  if (e.cols % (*d)->block_elems != 0) {
    // The flag that sets the row length: ffn_down's rows are --ffn long, attn_output's
    // n_heads · head_dim, every other matrix's --dim.
    const std::string flag =
        e.role == SynthTensorRole::kFfnDown ? fmt::format("--ffn {}", e.cols)
        : e.role == SynthTensorRole::kAttnOutput && e.cols != s.dim
            ? fmt::format("--heads {} x head_dim {} = {}", s.n_heads, s.head_dim(), e.cols)
            : fmt::format("--dim {}", e.cols);
    return Status::Error(fmt::format("{} is not a multiple of {}: {} rows are whole blocks of {} (tensor '{}', "
                                     "--type {})", flag, (*d)->block_elems, (*d)->label, (*d)->block_elems,
                                     e.name, s.type));
  }
  return *d;
}

// The writer for a resolved spec, and for each tensor the number of whole layers in the file
// once that tensor is written (for progress).
struct Layout {
  GgufWriter writer;
  std::vector<int64_t> layers_after;
};

// `pool` runs the row sources; null when the layout is only measured (its sources never run).
Result<Layout> BuildLayout(const SynthSpec& s, const Vocabulary& vocab, ThreadPool* pool) {
  Layout out;
  GgufWriter& w = out.writer;
  const std::string a = SynthGgufArch(s.arch);
  Result<uint32_t> file_type = SynthFileType(s);
  if (!file_type.ok()) return file_type.status();
  std::vector<Status> st;
  st.push_back(w.SetString("general.architecture", a));
  st.push_back(w.SetString("general.name", s.name.empty() ? fmt::format("synth-{}-{}x{}",
                                                                        SynthArchName(s.arch),
                                                                        s.dim, s.n_layers)
                                                          : s.name));
  std::string description = fmt::format("random weights written by kvq synth (seed {}): a {} model "
                                        "of this shape for speed work, not a trained model",
                                        s.seed, SynthArchName(s.arch));
  if (s.layer_output_scale) {
    description += fmt::format("; the output projections of layers {}.. scaled by {} (--layer-output-scale)",
                               s.layer_output_scale->from_layer, s.layer_output_scale->scale);
  }
  st.push_back(w.SetString("general.description", description));
  st.push_back(w.SetU32("general.file_type", *file_type));
  if (s.type != "f16") st.push_back(w.SetU32("general.quantization_version", 2));
  const auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };
  st.push_back(w.SetU32(a + ".vocab_size", u32(s.vocab_size)));
  st.push_back(w.SetU32(a + ".context_length", u32(s.context)));
  st.push_back(w.SetU32(a + ".embedding_length", u32(s.dim)));
  st.push_back(w.SetU32(a + ".block_count", u32(s.n_layers)));
  if (!s.moe()) st.push_back(w.SetU32(a + ".feed_forward_length", u32(s.hidden_dim)));
  st.push_back(w.SetU32(a + ".attention.head_count", u32(s.n_heads)));
  st.push_back(w.SetU32(a + ".attention.head_count_kv", u32(s.kv_heads())));
  st.push_back(w.SetF32(a + ".rope.freq_base", s.rope_theta));
  st.push_back(w.SetF32(a + ".attention.layer_norm_rms_epsilon", s.norm_eps));
  st.push_back(
      w.SetU32(a + ".rope.dimension_count", u32(s.rope_dims > 0 ? s.rope_dims : s.head_dim())));
  if (s.is_hybrid()) {
    for (Status& x : WriteHybridKeys(s, &w)) st.push_back(std::move(x));
  }
  // llama.cpp's converter writes the head size when the checkpoint's config names one (Qwen3
  // always does); a head size other than dim / n_heads needs it.
  if (s.qk_norm() || s.head_dim_override > 0) {
    st.push_back(w.SetU32(a + ".attention.key_length", u32(s.head_dim())));
    st.push_back(w.SetU32(a + ".attention.value_length", u32(s.head_dim())));
  }
  for (const Status& x : st) {
    if (!x.ok()) return x;
  }
  if (Status x = vocab.imported ? WriteBpeVocabularyGguf(*vocab.imported, s.vocab_size, &w)
                                : CopyVocabulary(*vocab.file, vocab.n_tokens, s.vocab_size, &w);
      !x.ok()) {
    return x;
  }

  for (const TensorEntry& e : TensorList(s)) {
    Status x;
    if (e.kind == TensorEntry::kMatrix) {
      Result<const WeightTypeDesc*> type = MatrixType(s, e);
      if (!type.ok()) return type.status();
      x = w.AddStreamedTensor(e.name, static_cast<GgmlType>((*type)->gguf_type), e.dims(),
                              MatrixSource(*type, e.cols, SynthTensorSeed(s.seed, e.name), SynthOutputScale(s, e), pool));
    } else if (e.kind == TensorEntry::kF32Matrix) {  // drawn as a matrix, kept F32 (small)
      const float amplitude = static_cast<float>(std::sqrt(3.0 / static_cast<double>(e.cols)));
      std::vector<float> v(static_cast<size_t>(e.cols * e.total_rows()));
      for (int64_t r = 0; r < e.total_rows(); ++r) {
        SynthDrawRow(SynthTensorSeed(s.seed, e.name), r, amplitude, v.data() + r * e.cols, e.cols);
      }
      x = w.AddTensor(e.name, GgmlType::kF32, e.dims(), F32Bytes(v));
    } else {
      std::vector<float> v(static_cast<size_t>(e.cols), 1.0f);
      if (e.kind ==
          TensorEntry::kSsmA) {  // −exp(u): a decay rate per head, as the converter stores it
        SynthDrawRow(SynthTensorSeed(s.seed, e.name), 0, 1.0f, v.data(), e.cols);
        for (float& rate : v) rate = -std::exp(rate);
      } else if (e.kind == TensorEntry::kBias) {
        SynthDrawRow(SynthTensorSeed(s.seed, e.name), 0, kBiasStd * std::sqrt(3.0f), v.data(), e.cols);
      } else if (e.kind == TensorEntry::kRopeFreqs) {
        v = Llama3RopeFreqFactors(static_cast<int32_t>(s.head_dim()), s.rope_theta, *s.rope_scaling);
      }
      x = w.AddTensor(e.name, GgmlType::kF32, {e.cols}, F32Bytes(v));
    }
    if (!x.ok()) return x;
    // A block's last tensor (ffn_down) completes it; the file's last completes every layer.
    out.layers_after.push_back(e.role == SynthTensorRole::kFfnDown && e.kind == TensorEntry::kMatrix ? e.layer + 1
                                                                                                   : -1);
  }
  out.layers_after.back() = s.n_layers;
  return out;
}

Result<SynthSummary> Summarize(const SynthSpec& spec, const Vocabulary& vocab) {
  if (Status s = ValidateSynthSpec(spec); !s.ok()) return s;
  SynthSpec resolved = spec;
  if (resolved.vocab_size == 0) resolved.vocab_size = vocab.n_tokens;
  if (resolved.vocab_size < vocab.n_tokens) {
    return Status::Error(fmt::format("--vocab-size {} is smaller than the vocabulary '{}' ({} "
                                     "tokens); it may only pad it",
                                     resolved.vocab_size, vocab.path, vocab.n_tokens));
  }
  Result<Layout> layout = BuildLayout(resolved, vocab, nullptr);
  if (!layout.ok()) return layout.status();
  return SynthSummary{resolved, vocab.n_tokens, SynthParameterCount(resolved),
                      layout->writer.FileBytes()};
}

}  // namespace

const char* SynthArchName(SynthArch arch) { return ArchitectureOf(arch).name; }

const char* SynthGgufArch(SynthArch arch) { return ArchitectureOf(arch).written_as; }

Result<SynthArch> ParseSynthArch(std::string_view name) {
  if (const Architecture* a = FindArchitecture(name)) return a->id;
  return Status::Error(
      fmt::format("unknown architecture '{}' (expected one of {})", name, ArchitectureNames()));
}

std::string SynthArchNameList() { return ArchitectureNames(); }

bool SynthSpec::is_hybrid() const { return ArchitectureOf(arch).hybrid(); }
bool SynthSpec::moe() const { return ArchitectureOf(arch).moe; }
bool SynthSpec::qk_norm() const { return ArchitectureOf(arch).qk_norm; }

void SetSynthArch(SynthSpec* spec, SynthArch arch) {
  spec->arch = arch;
  spec->qkv_bias = ArchitectureOf(arch).qkv_bias;
  spec->norm_eps = arch == SynthArch::kQwen2 || arch == SynthArch::kQwen3 || spec->is_hybrid() ? 1e-6f : 1e-5f;
}

const WeightTypeDesc* SynthWeightType(GgmlType type) {
  const WeightTypeDesc* d = FindWeightTypeByGgufId(static_cast<uint32_t>(type));
  return d != nullptr && d->quantize_block_ref != nullptr ? d : nullptr;
}

std::string SynthTypeNameList() {
  std::string out;
  for (const WeightTypeDesc& d : WeightTypes()) {
    if (d.quantize_block_ref == nullptr) continue;
    out += out.empty() ? d.name : fmt::format(", {}", d.name);
  }
  return out;
}

Result<const WeightTypeDesc*> SynthWeightTypeByName(std::string_view name) {
  Result<const WeightTypeDesc*> d = FindWeightTypeByName(name);
  if (!d.ok()) {
    return Status::Error(fmt::format("weight type {} is not registered in kvq's weight registry (synth writes: {})",
                                     name, SynthTypeNameList()));
  }
  if ((*d)->quantize_block_ref == nullptr) {
    return Status::Error(fmt::format("weight type {} has no reference quantiser in the registry (synth writes: {})",
                                     name, SynthTypeNameList()));
  }
  return *d;
}

Result<std::string> ParseSynthType(std::string_view name) {
  if (const TypeMix* mix = FindTypeMix(name)) return std::string(mix->name);
  Result<const WeightTypeDesc*> d = SynthWeightTypeByName(name);
  if (d.ok()) return std::string((*d)->name);
  return Status::Error(fmt::format("{}; or a llama.cpp mix: {}", d.status().message(), TypeMixNameList()));
}

Result<uint32_t> SynthFileType(const SynthSpec& s) {
  if (const TypeMix* mix = FindTypeMix(s.type)) return mix->file_type;
  Result<const WeightTypeDesc*> d = SynthWeightTypeByName(s.type);
  if (!d.ok()) return Status::Error(fmt::format("--type {}: {}", s.type, d.status().message()));
  return (*d)->gguf_file_type;
}

Status ValidateSynthSpec(const SynthSpec& s) {
  auto range = [](const char* flag, int64_t v, int64_t lo, int64_t hi) {
    return v >= lo && v <= hi ? Status::Ok()
                              : Status::Error(fmt::format("{} must be in {}..{} (got {})", flag, lo,
                                                          hi, v));
  };
  // Plausible bounds: past the largest published models' shapes, and inside what kvq's loader
  // accepts for metadata (2^24) and its KV cache for head_dim (kMaxHeadDim).
  const Status checks[] = {
      range("--dim", s.dim, 1, 65536),
      range("--layers", s.n_layers, 1, 1024),
      range("--heads", s.n_heads, 1, 1024),
      range("--kv-heads", s.n_kv_heads, 0, 1024),
      range("--ffn", s.hidden_dim, 1, 1 << 20),
      range("--vocab-size", s.vocab_size, 0, 1 << 24),
      range("--context", s.context, 1, 1 << 24),
      range("--threads", s.threads, 1, 1024),
  };
  for (const Status& c : checks) {
    if (!c.ok()) return c;
  }
  if (s.head_dim_override < 0 || s.head_dim_override > kMaxHeadDim) {
    return Status::Error(fmt::format("--head-dim must be in 0..{} (got {})", kMaxHeadDim, s.head_dim_override));
  }
  const std::string head_dim_text = s.head_dim_override > 0
                                        ? fmt::format("--head-dim {}", s.head_dim())
                                        : fmt::format("head_dim = --dim {} / --heads {} = {}", s.dim, s.n_heads,
                                                      s.head_dim());
  if (s.head_dim_override == 0 && s.dim % s.n_heads != 0) {
    return Status::Error(fmt::format("--heads {} does not divide --dim {} (give --head-dim for heads of "
                                     "another size)", s.n_heads, s.dim));
  }
  if (s.head_dim() % 2 != 0) {
    return Status::Error(fmt::format("{} is odd; RoPE rotates pairs, so it must be even", head_dim_text));
  }
  if (s.head_dim() > kMaxHeadDim) {
    return Status::Error(fmt::format("{} is larger than kvq's limit of {}", head_dim_text, kMaxHeadDim));
  }
  if (s.n_heads % s.kv_heads() != 0) {
    return Status::Error(fmt::format("--kv-heads {} does not divide --heads {}", s.kv_heads(),
                                     s.n_heads));
  }
  if (s.is_hybrid()) {
    if (Status h = ValidateHybridSpec(s); !h.ok()) return h;
  }
  if (!FindTypeMix(s.type) && !SynthWeightTypeByName(s.type).ok()) {
    return Status::Error(fmt::format("--type {}: {}; or a llama.cpp mix: {}", s.type,
                                     SynthWeightTypeByName(s.type).status().message(), TypeMixNameList()));
  }
  // Every matrix's type (a mix chooses per tensor) registered, its rows whole blocks of it.
  for (const TensorEntry& e : TensorList(s)) {
    if (e.kind != TensorEntry::kMatrix) continue;
    if (Result<const WeightTypeDesc*> d = MatrixType(s, e); !d.ok()) return d.status();
  }
  if (!std::isfinite(s.rope_theta) || s.rope_theta <= 1.0f) {
    return Status::Error(fmt::format("--rope-theta must be a finite number above 1 (got {})",
                                     s.rope_theta));
  }
  if (!std::isfinite(s.norm_eps) || s.norm_eps <= 0.0f || s.norm_eps >= 1.0f) {
    return Status::Error(fmt::format("the RMS norm epsilon must be in (0, 1) (got {})", s.norm_eps));
  }
  if (Status o = ValidateLayerOutputScale(s); !o.ok()) return o;
  if (s.rope_scaling) {
    const Llama3RopeScaling& r = *s.rope_scaling;
    if (!(r.factor >= 1.0f) || !(r.low_freq_factor > 0.0f) ||
        !(r.high_freq_factor > r.low_freq_factor) || r.original_context <= 0) {
      return Status::Error("Llama 3.1 rope scaling needs factor >= 1, 0 < low_freq_factor < "
                           "high_freq_factor and a positive original context");
    }
  }
  return Status::Ok();
}

int64_t SynthParameterCount(const SynthSpec& s) {
  if (s.is_hybrid()) {  // every tensor of the list, as the checkpoint counts them
    int64_t n = 0;
    for (const TensorEntry& e : TensorList(s))
      n += e.kind == TensorEntry::kRopeFreqs ? 0 : e.cols * e.total_rows();
    return n;
  }
  const int64_t d = s.dim, q = s.q_dim(), kv = s.kv_dim(), ffn = s.hidden_dim;
  const int64_t per_layer = 2 * d                       // attn_norm, ffn_norm
                            + d * q + 2 * d * kv + q * d  // attn_q, attn_k, attn_v, attn_output
                            + 3 * d * ffn                 // ffn_gate, ffn_up, ffn_down
                            + (s.qkv_bias ? q + 2 * kv : 0)
                            + (s.qk_norm() ? 2 * s.head_dim() : 0);  // attn_q_norm, attn_k_norm
  const int64_t embeddings = s.vocab_size * d * (s.embeddings == SynthEmbeddings::kTied ? 1 : 2);
  return embeddings + s.n_layers * per_layer + d;  // + output_norm
}

Result<std::vector<SynthTensorPlan>> PlanSynthTensors(const SynthSpec& s) {
  if (Status v = ValidateSynthSpec(s); !v.ok()) return v;
  if (s.vocab_size <= 0) return Status::Error("PlanSynthTensors: the vocabulary size must be resolved");
  std::vector<SynthTensorPlan> plan;
  for (const TensorEntry& e : TensorList(s)) {
    if (e.kind != TensorEntry::kMatrix) {
      plan.push_back({e.name, "f32", e.dims(), e.cols * e.total_rows() * 4});
      continue;
    }
    Result<const WeightTypeDesc*> d = MatrixType(s, e);
    if (!d.ok()) return d.status();
    plan.push_back({e.name, (*d)->name, e.dims(),
                    e.cols / (*d)->block_elems * (*d)->block_bytes * e.total_rows()});
  }
  return plan;
}

Result<SynthSummary> SummarizeSynthModel(const SynthSpec& spec, const std::string& vocab_path) {
  if (Status s = ValidateSynthSpec(spec); !s.ok()) return s;
  Result<Vocabulary> vocab = OpenVocabulary(vocab_path);
  if (!vocab.ok()) return vocab.status();
  return Summarize(spec, *vocab);
}

Status WriteSynthModel(const SynthSpec& spec, const std::string& vocab_path,
                       const std::string& out_path, const SynthProgressFn& progress) {
  if (Status s = ValidateSynthSpec(spec); !s.ok()) return s;
  Result<Vocabulary> vocab = OpenVocabulary(vocab_path);
  if (!vocab.ok()) return vocab.status();
  Result<SynthSummary> summary = Summarize(spec, *vocab);
  if (!summary.ok()) return summary.status();

  // The folder's problems, named before any work: a missing or read-only folder, too little space.
  namespace fs = std::filesystem;
  const fs::path parent = fs::path(out_path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return Status::Error(fmt::format("cannot write '{}': the folder '{}' does not exist", out_path,
                                     dir));
  }
  if (::access(dir.c_str(), W_OK) != 0) {
    return Status::Error(fmt::format("cannot write '{}': the folder '{}' is not writable: {}",
                                     out_path, dir, std::strerror(errno)));
  }
  struct statvfs fsinfo {};
  if (::statvfs(dir.c_str(), &fsinfo) == 0) {
    const auto free_bytes = static_cast<int64_t>(
        std::min<uint64_t>(static_cast<uint64_t>(fsinfo.f_bavail) * fsinfo.f_frsize, INT64_MAX));
    if (free_bytes < summary->file_bytes) {
      return Status::Error(fmt::format("cannot write '{}': it needs {} ({} bytes) but the folder "
                                       "'{}' has {} free", out_path,
                                       FormatBytesIec(summary->file_bytes),
                                       FormatCount(summary->file_bytes), dir,
                                       FormatBytesIec(free_bytes)));
    }
  }

  ThreadPool pool(summary->spec.threads);
  Result<Layout> layout = BuildLayout(summary->spec, *vocab, &pool);
  if (!layout.ok()) return layout.status();
  const std::vector<int64_t>& layers_after = layout->layers_after;
  const int64_t n_layers = summary->spec.n_layers;
  return layout->writer.Write(
      out_path, [&](size_t tensor, int64_t written, int64_t total) {
        if (progress && layers_after[tensor] >= 0) {
          progress(SynthProgress{.layers_written = layers_after[tensor], .n_layers = n_layers,
                                 .bytes_written = written, .file_bytes = total});
        }
      });
}

}  // namespace kvq
