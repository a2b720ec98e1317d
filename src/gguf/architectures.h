// The model architectures kvq runs, by the name a GGUF file gives in general.architecture (also
// the prefix of its metadata keys, "qwen2.embedding_length"): one table of what kvq does with each
// name. The GGUF loader (model/gguf_llama.cc, model/gguf_hybrid.cc) reads a file by its entry and
// kvq synth writes one file per entry; tests/gguf/architectures_test.cc walks the table through
// both. It sits with the GGUF reader and writer because both sides of a file read it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "kvq/architecture.h"
#include "kvq/rope.h"

namespace kvq {

/// What a layer stack is made of.
enum class ArchFamily : uint8_t {
  kDense,   ///< the Llama block in every layer (decoder.h), with the flags below
  kHybrid,  ///< Gated DeltaNet layers with a gated full-attention layer every few layers
};

struct Architecture {
  ArchId id;
  const char* name;        ///< general.architecture and the key prefix
  /// What kvq synth writes as general.architecture: the name itself, except "llama" for mistral
  /// (llama.cpp's converter writes Mistral checkpoints as "llama").
  const char* written_as;
  ArchFamily family;
  /// llama.cpp's converters permute llama/mistral Q, K rows to adjacent pairs; qwen* keep halves.
  RopePairing pairing;
  bool qkv_bias;  ///< q, k, v projections carry biases (qwen2)
  bool qk_norm;   ///< attn_q_norm / attn_k_norm, a per-head RMSNorm before RoPE (qwen3, hybrids)
  bool moe;       ///< hybrids: the FFN is experts plus a shared expert (qwen35moe, qwen3next)
  /// Hybrids: value head h reads q/k head h div r, HF's grouped order (qwen3next), instead of
  /// h mod Hk (the qwen35* converter tiles the V heads; docs/hybrid_models_spec.md §3.4).
  bool v_heads_grouped;
  bool fused_ba;  ///< hybrids: b and a in one tensor, ssm_ba, interleaved per key head (qwen3next)

  bool hybrid() const { return family == ArchFamily::kHybrid; }
};

/// Every architecture, in ArchId order.
std::span<const Architecture> Architectures();
/// The entry of `id`.
const Architecture& ArchitectureOf(ArchId id);
/// The entry named `name` (general.architecture), or null.
const Architecture* FindArchitecture(std::string_view name);
/// "llama, qwen2, ...": every name, for error messages.
std::string ArchitectureNames();

}  // namespace kvq
