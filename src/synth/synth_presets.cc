// The presets of `kvq synth` (see synth.h): published models' shapes, and small hybrids for tests.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "synth/synth.h"

namespace kvq {
namespace {

struct Preset {
  const char* name;
  SynthSpec spec;
};

SynthSpec TinyHybrid(const char* name, SynthArch arch) {
  const bool moe = arch != SynthArch::kQwen35;
  return {.name = name,
          .arch = arch,
          .dim = 64,
          .n_layers = 4,
          .n_heads = 4,
          .head_dim_override = 32,
          .n_kv_heads = 2,
          .hidden_dim = moe ? 64 : 96,
          .vocab_size = 0,
          .context = 512,
          .rope_theta = 10000.0f,
          .norm_eps = 1e-6f,
          .embeddings = SynthEmbeddings::kTied,
          .type = "q8_0",
          .full_attention_interval = 2,
          .rope_dims = 16,
          .ssm_conv_kernel = 4,
          .ssm_key_dim = 16,
          .ssm_k_heads = 2,
          .ssm_v_heads = 6,
          .n_experts = moe ? 6 : 0,
          .n_experts_used = moe ? 2 : 0,
          .expert_hidden_dim = moe ? 32 : 0};
}

// The published shapes (the models' config.json): hidden_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, intermediate_size, vocab_size,
// max_position_embeddings, rope_theta, rms_norm_eps, tie_word_embeddings, rope_scaling.
std::vector<Preset> Presets() {
  return {
      {"llama-3.2-1b", SynthSpec{.name = "llama-3.2-1b",
                                 .arch = SynthArch::kLlama,
                                 .dim = 2048,
                                 .n_layers = 16,
                                 .n_heads = 32,
                                 .n_kv_heads = 8,
                                 .hidden_dim = 8192,
                                 .vocab_size = 128256,
                                 .context = 131072,
                                 .rope_theta = 500000.0f,
                                 .norm_eps = 1e-5f,
                                 .embeddings = SynthEmbeddings::kTied,
                                 .rope_scaling = Llama3RopeScaling{.factor = 32.0f,
                                                                   .low_freq_factor = 1.0f,
                                                                   .high_freq_factor = 4.0f,
                                                                   .original_context = 8192}}},
      {"qwen2.5-0.5b", SynthSpec{.name = "qwen2.5-0.5b",
                                 .arch = SynthArch::kQwen2,
                                 .dim = 896,
                                 .n_layers = 24,
                                 .n_heads = 14,
                                 .n_kv_heads = 2,
                                 .hidden_dim = 4864,
                                 .vocab_size = 151936,
                                 .context = 32768,
                                 .rope_theta = 1000000.0f,
                                 .norm_eps = 1e-6f,
                                 .embeddings = SynthEmbeddings::kTied,
                                 .qkv_bias = true}},
      {"llama-2-7b", SynthSpec{.name = "llama-2-7b",
                               .arch = SynthArch::kLlama,
                               .dim = 4096,
                               .n_layers = 32,
                               .n_heads = 32,
                               .n_kv_heads = 32,
                               .hidden_dim = 11008,
                               .vocab_size = 32000,
                               .context = 4096,
                               .rope_theta = 10000.0f,
                               .norm_eps = 1e-5f,
                               .embeddings = SynthEmbeddings::kSeparate}},
      // Qwen3-0.6B: head_dim 128 (config "head_dim"), so 16 query heads span 2048 numbers of a
      // 1024-wide stream; max_position_embeddings 40960.
      {"qwen3-0.6b", SynthSpec{.name = "qwen3-0.6b",
                               .arch = SynthArch::kQwen3,
                               .dim = 1024,
                               .n_layers = 28,
                               .n_heads = 16,
                               .head_dim_override = 128,
                               .n_kv_heads = 8,
                               .hidden_dim = 3072,
                               .vocab_size = 151936,
                               .context = 40960,
                               .rope_theta = 1000000.0f,
                               .norm_eps = 1e-6f,
                               .embeddings = SynthEmbeddings::kTied}},
      // PrismML's Bonsai 1.7B: Qwen3-1.7B's shape, every matrix (token_embd, the tied classifier,
      // included) in Q1_0, context 32768 (its model card); the ternary model the same in Q2_0.
      {"bonsai-1.7b", SynthSpec{.name = "bonsai-1.7b",
                                .arch = SynthArch::kQwen3,
                                .dim = 2048,
                                .n_layers = 28,
                                .n_heads = 16,
                                .head_dim_override = 128,
                                .n_kv_heads = 8,
                                .hidden_dim = 6144,
                                .vocab_size = 151936,
                                .context = 32768,
                                .rope_theta = 1000000.0f,
                                .norm_eps = 1e-6f,
                                .embeddings = SynthEmbeddings::kTied,
                                .type = "q1_0"}},
      // Qwen3.5-35B-A3B (qwen35moe; docs/hybrid_models_spec.md §5.2): 40 layers, full attention every
      // 4th (10), Gated DeltaNet Hk 16 / Hv 32 of 128, 256 experts of 512 (8 per token) + a shared
      // expert of 512, head_dim 256 of which 64 rotate, base 1e7.
      {"qwen3.5-35b-a3b", SynthSpec{.name = "qwen3.5-35b-a3b",
                                    .arch = SynthArch::kQwen35Moe,
                                    .dim = 2048,
                                    .n_layers = 40,
                                    .n_heads = 16,
                                    .head_dim_override = 256,
                                    .n_kv_heads = 2,
                                    .hidden_dim = 512,
                                    .vocab_size = 248320,
                                    .context = 262144,
                                    .rope_theta = 1e7f,
                                    .norm_eps = 1e-6f,
                                    .embeddings = SynthEmbeddings::kSeparate,
                                    .full_attention_interval = 4,
                                    .rope_dims = 64,
                                    .ssm_conv_kernel = 4,
                                    .ssm_key_dim = 128,
                                    .ssm_k_heads = 16,
                                    .ssm_v_heads = 32,
                                    .n_experts = 256,
                                    .n_experts_used = 8,
                                    .expert_hidden_dim = 512}},
      // Small hybrids for tests: 4 layers (full attention at 1 and 3), 3 value heads per key head.
      {"tiny-qwen35", TinyHybrid("tiny-qwen35", SynthArch::kQwen35)},
      {"tiny-qwen35moe", TinyHybrid("tiny-qwen35moe", SynthArch::kQwen35Moe)},
      {"tiny-qwen3next", TinyHybrid("tiny-qwen3next", SynthArch::kQwen3Next)},
      {"bonsai-ternary-1.7b", SynthSpec{.name = "bonsai-ternary-1.7b",
                                        .arch = SynthArch::kQwen3,
                                        .dim = 2048,
                                        .n_layers = 28,
                                        .n_heads = 16,
                                        .head_dim_override = 128,
                                        .n_kv_heads = 8,
                                        .hidden_dim = 6144,
                                        .vocab_size = 151936,
                                        .context = 32768,
                                        .rope_theta = 1000000.0f,
                                        .norm_eps = 1e-6f,
                                        .embeddings = SynthEmbeddings::kTied,
                                        .type = "q2_0"}},
  };
}

}  // namespace

std::vector<std::string> SynthPresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : Presets()) names.emplace_back(p.name);
  return names;
}

Result<SynthSpec> SynthPreset(std::string_view name) {
  for (const Preset& p : Presets()) {
    if (name == p.name) return p.spec;
  }
  return Status::Error(
      fmt::format("unknown preset '{}' (presets: {})", name, fmt::join(SynthPresetNames(), ", ")));
}

}  // namespace kvq
