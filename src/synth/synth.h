// Synthetic models: GGUF files at real models' shapes with random weights, for speed work on a
// machine that cannot download real weights (`kvq synth`). The files follow llama.cpp's GGUF
// conventions (metadata keys, tensor names and shapes, `general.file_type`), so kvq and llama.cpp
// load them alike; their vocabulary is copied from another GGUF file (padded with control tokens
// up to the shape's vocabulary size) or converted from a model's Hugging Face tokenizer.json, so
// text still tokenizes with real pieces.
//
// Weights (all drawn from a seeded PRNG; the same seed gives the same file byte for byte, for
// any thread count):
//   matrices [cols, rows]   uniform on (−a, a) with a = sqrt(3 / cols): variance 1 / cols, so a
//                           matrix keeps a unit-variance input at unit variance and the
//                           pre-norm residual stream grows only additively through the layers;
//                           the tied or separate classifier gives logits of variance ≈ 1.
//                           Stored in --type: any weight type with a reference quantiser in
//                           the registry, by name (weights/weight_type.h: F16/BF16 round to
//                           nearest even; Q8_0 / Q4_0 use ggml's reference rounding,
//                           quantize_row_q8_0_ref / quantize_row_q4_0_ref, see their folders),
//                           or a llama.cpp file-type mix (q4_k_m, ...: synth/type_mix.h) whose
//                           types are looked up there tensor by tensor.
//   norms                   1.0 (F32), qwen3's per-head q/k norms included.
//   Q/K/V biases (qwen2)    uniform with standard deviation 0.02 (F32).
//   rope_freqs.weight       Llama3RopeFreqFactors (F32), only with Llama 3.1 rope scaling.
//   hybrids (synth_hybrid.cc): expert tensors [cols, rows, n_experts] as matrices of
//                           n_experts·rows rows; ssm_conv1d, the router (ffn_gate_inp) and the
//                           shared expert's gate uniform like matrices but always F32 (as
//                           llama.cpp's converter stores them); ssm_dt.bias like a bias;
//                           ssm_a = −exp(u), u uniform on (−1, 1); ssm_norm 1.0. Type mixes are
//                           not offered for them.
// Randomness: a tensor's seed is splitmix64(seed ^ FNV-1a(name)); row r of it draws from its own
// splitmix64 stream started at splitmix64(tensor_seed + r · golden ratio), two 24-bit uniforms
// per 64-bit output. Rows are independent, so threads split rows without changing a byte; and a
// tensor's bytes depend on the seed, its name and its type only, so a --layers N file holds the
// first N layers, the embeddings, output norm and classifier of a deeper file of the same seed (for
// a single --type: a mix may choose a layer's types by the depth).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvq/architecture.h"
#include "kvq/rope.h"
#include "kvq/status.h"
#include "synth/type_mix.h"

namespace kvq {

/// The model families synth writes: one per entry of the architecture table
/// (kvq/architecture.h; what each is: gguf/architectures.h). kMistral is Llama's architecture in GGUF
/// (llama.cpp's converter writes Mistral checkpoints as "llama"), so its files say
/// general.architecture "llama". The hybrids (docs/hybrid_models_spec.md): Gated DeltaNet layers
/// with a gated full-attention layer every full_attention_interval; kQwen35 a dense FFN, kQwen35Moe
/// and kQwen3Next experts plus a shared expert (kQwen3Next: b and a fused in ssm_ba).
using SynthArch = ArchId;

/// The table's name: "llama", "qwen2", "mistral", "qwen3", "qwen35", "qwen35moe", "qwen3next".
const char* SynthArchName(SynthArch arch);
/// The general.architecture a file of `arch` carries (the table's written_as): "llama" (llama,
/// mistral), else its name.
const char* SynthGgufArch(SynthArch arch);
/// One of SynthArchName's names; the error lists them.
Result<SynthArch> ParseSynthArch(std::string_view name);
/// "llama, qwen2, ...": every SynthArchName, for help text.
std::string SynthArchNameList();
/// The --type value checked: a registry type's CLI name (any case) whose entry has a reference
/// quantiser ("f16", "q4_0", ...), or a mix name (type_mix.h). Returned lower case. The error
/// says when the name is a known ggml type that is not registered ("q1_0 is not registered").
Result<std::string> ParseSynthType(std::string_view name);
/// "f32, f16, bf16, q8_0, q4_0": the registry names ParseSynthType takes, for help text.
std::string SynthTypeNameList();

enum class SynthEmbeddings { kSeparate, kTied };  ///< an output.weight, or the classifier = token_embd

/// --layer-output-scale FROM:SCALE: the output projections of layers from_layer.. (attention's
/// attn_output, the FFN's ffn_down; in the hybrids also the Gated DeltaNet's ssm_out and the
/// experts' and shared expert's down projections) are drawn as usual, then multiplied by `scale`
/// before they are encoded, so those layers add `scale` times their usual contribution to the
/// residual stream. Every other tensor keeps its bytes, and a tensor's values depend on the seed
/// and its name only, so the first from_layer layers, embeddings, output norm and classifier are
/// those of the same seed's `--layers from_layer` file: that file is a draft model that agrees with
/// this one as closely as `scale` makes it. Scale 0 writes zero blocks (scale 0 in every type), the
/// later layers add exactly 0.0, and the logits are the cut's bit for bit.
struct SynthLayerOutputScale {
  int64_t from_layer = 0;  ///< the first layer scaled, 0..n_layers − 1
  float scale = 1.0f;      ///< finite, ≥ 0
};
/// "FROM:SCALE" ("2:0.05") read; the error names --layer-output-scale and says what is wrong (the
/// syntax, a negative or non-integer FROM, a negative, NaN or infinite SCALE). FROM's upper bound is
/// ValidateSynthSpec's (it needs --layers).
Result<SynthLayerOutputScale> ParseSynthLayerOutputScale(std::string_view value);

/// A model shape and how to fill it. Names follow llama2.c (dim, hidden_dim, ...).
struct SynthSpec {
  std::string name;  ///< general.name
  SynthArch arch = SynthArch::kLlama;
  int64_t dim = 0;         ///< embedding width (--dim)
  int64_t n_layers = 0;    ///< (--layers)
  int64_t n_heads = 0;     ///< (--heads)
  int64_t head_dim_override = 0;  ///< (--head-dim); 0: dim / n_heads. Written as attention.key_length
  int64_t n_kv_heads = 0;  ///< (--kv-heads); 0: n_heads
  int64_t hidden_dim = 0;  ///< FFN width (--ffn)
  int64_t vocab_size = 0;  ///< (--vocab-size); 0: the vocabulary's own size
  int64_t context = 4096;  ///< (--context)
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  SynthEmbeddings embeddings = SynthEmbeddings::kSeparate;
  bool qkv_bias = false;                       ///< qwen2's attn_q/k/v biases
  std::optional<Llama3RopeScaling> rope_scaling;  ///< Llama 3.1 scaling: a rope_freqs.weight tensor
  /// --type: a registry type name for every matrix (token_embd included), or a mix name.
  std::string type = "q4_0";
  // Hybrids only (is_hybrid()). hidden_dim is the dense FFN (qwen35) or the shared expert's width.
  int64_t full_attention_interval = 4;  ///< layer l is full attention when (l + 1) % interval == 0
  int64_t rope_dims = 0;                ///< numbers rotated per head (rope.dimension_count); 0: all
  int64_t ssm_conv_kernel = 4;          ///< K
  int64_t ssm_key_dim = 128;            ///< dk = dv
  int64_t ssm_k_heads = 16;             ///< Hk
  int64_t ssm_v_heads = 32;             ///< Hv
  int64_t n_experts = 0;                ///< NE (qwen35moe, qwen3next)
  int64_t n_experts_used = 0;           ///< k
  int64_t expert_hidden_dim = 0;        ///< Fe
  uint64_t seed = 1;
  int32_t threads = 1;  ///< threads drawing and quantising rows; never changes the bytes
  /// --layer-output-scale; none: every layer's output projections as drawn.
  std::optional<SynthLayerOutputScale> layer_output_scale;

  int64_t kv_heads() const { return n_kv_heads == 0 ? n_heads : n_kv_heads; }
  int64_t head_dim() const { return head_dim_override > 0 ? head_dim_override : dim / n_heads; }
  int64_t q_dim() const { return n_heads * head_dim(); }
  int64_t kv_dim() const { return head_dim() * kv_heads(); }
  // What the architecture table says of `arch` (synth.cc).
  bool is_hybrid() const;
  bool moe() const;
  bool qk_norm() const;
  bool is_recurrent(int64_t layer) const {
    return is_hybrid() && (layer + 1) % full_attention_interval != 0;
  }
  int64_t ssm_k_channels() const { return ssm_k_heads * ssm_key_dim; }
  int64_t ssm_v_channels() const { return ssm_v_heads * ssm_key_dim; }
  int64_t ssm_conv_channels() const { return 2 * ssm_k_channels() + ssm_v_channels(); }
};

/// Sets `spec->arch` and the conventions that come with it: Q/K/V biases as the architecture
/// table says (qwen2), RMSNorm epsilon 1e-6 for qwen2, qwen3 and the hybrids, else 1e-5.
void SetSynthArch(SynthSpec* spec, SynthArch arch);

/// "llama-3.2-1b", "qwen2.5-0.5b", "llama-2-7b", "qwen3-0.6b", "bonsai-1.7b",
/// "bonsai-ternary-1.7b", "qwen3.5-35b-a3b", and the small hybrids for tests "tiny-qwen35",
/// "tiny-qwen35moe", "tiny-qwen3next".
std::vector<std::string> SynthPresetNames();
/// A preset: the published shape of that model (see synth.cc for the numbers).
Result<SynthSpec> SynthPreset(std::string_view name);

/// Checks a spec (vocab_size 0 allowed): positive, plausible sizes; heads divide dim (unless
/// head_dim is given), KV heads divide heads, head_dim even; every matrix's type registered and
/// its rows whole blocks of it. Errors name the flag.
Status ValidateSynthSpec(const SynthSpec& spec);

/// One tensor of a synth file, in file order: what the writer will write.
struct SynthTensorPlan {
  std::string name;
  std::string type;           ///< registry name ("q4_0", "f32")
  std::vector<int64_t> dims;  ///< GGUF order: [cols] or [cols, rows]
  int64_t bytes = 0;          ///< data bytes in that type (unpadded)
};
/// The tensor table of `spec` (vocab_size must be resolved, non-zero), without writing anything;
/// fails as ValidateSynthSpec does (e.g. a type not registered).
Result<std::vector<SynthTensorPlan>> PlanSynthTensors(const SynthSpec& spec);
/// general.file_type of `spec`: the mix's llama_ftype, or the registry's for a single type.
Result<uint32_t> SynthFileType(const SynthSpec& spec);

/// Parameters as a checkpoint counts them: embeddings (and output.weight when separate), every
/// matrix, norm and bias. rope_freqs.weight is a constant of the scaling, not a parameter.
/// `spec.vocab_size` must be resolved (non-zero).
int64_t SynthParameterCount(const SynthSpec& spec);

/// What a spec writes, known before writing.
struct SynthSummary {
  SynthSpec spec;             ///< vocab_size resolved
  int64_t vocabulary_tokens;  ///< tokens in the vocabulary file (the rest are padding)
  int64_t parameters;         ///< SynthParameterCount
  int64_t file_bytes;         ///< the exact size of the GGUF file
};
/// Validates `spec` and reads the vocabulary at `vocab_path`: a GGUF file with
/// tokenizer.ggml.tokens (its tokenizer.* keys are copied), or a Hugging Face tokenizer.json
/// (a name ending in .json; written as llama.cpp's converter writes it, padded with "[PAD<id>]"
/// UNUSED tokens: text/bpe_vocabulary.h). A vocab size smaller than the vocabulary is an error.
Result<SynthSummary> SummarizeSynthModel(const SynthSpec& spec, const std::string& vocab_path);

/// Progress of WriteSynthModel: called after each layer's last tensor and once at the end
/// (layers_written == n_layers, bytes_written == file_bytes).
struct SynthProgress {
  int64_t layers_written = 0;
  int64_t n_layers = 0;
  int64_t bytes_written = 0;
  int64_t file_bytes = 0;
};
using SynthProgressFn = std::function<void(const SynthProgress&)>;

/// Writes the model to `out_path` (through the GGUF writer's temporary file and rename; an
/// existing file is replaced: refusing is the caller's choice). Fails before writing when the
/// folder is missing or not writable or has less free space than the file needs; on any failure
/// nothing is left at `out_path`'s temporary name.
Status WriteSynthModel(const SynthSpec& spec, const std::string& vocab_path,
                       const std::string& out_path, const SynthProgressFn& progress = {});

// ---- the pieces, for tests ----

/// The seed of tensor `name` under `seed` (see the header comment).
uint64_t SynthTensorSeed(uint64_t seed, std::string_view name);
/// Row `row` of a tensor: n uniform values on (−amplitude, amplitude).
void SynthDrawRow(uint64_t tensor_seed, int64_t row, float amplitude, float* out, int64_t n);

}  // namespace kvq
