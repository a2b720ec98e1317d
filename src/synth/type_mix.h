// llama.cpp's per-tensor weight types for its K-quant file types (Q4_K_M and friends), as a pure
// function of the tensor's role, layer and row length, so `kvq synth --type q4_k_m` writes the
// mix a downloaded Q4_K_M file has. Types are named as the weight registry names them ("q6_k");
// synth looks each name up there, so a mix works once its types are registered.
// Source: llama.cpp src/llama-quant.cpp, llama_tensor_get_type(_impl) and tensor_type_fallback.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace kvq {

/// The matrices of a Llama-family block (norms and biases stay F32 in every mix).
enum class SynthTensorRole { kTokenEmbd, kOutput, kAttnQ, kAttnK, kAttnV, kAttnOutput, kFfnGate, kFfnUp, kFfnDown };

/// A llama.cpp file type synth can write.
struct TypeMix {
  const char* name;     ///< the --type name: "q4_k_m"
  const char* label;    ///< llama.cpp's: "Q4_K_M"
  uint32_t file_type;   ///< llama_ftype, written as general.file_type
  const char* base;     ///< the type of every matrix no rule changes: "q4_k"
};

/// q2_k, q3_k_m, q4_k_m, q5_k_m, q6_k.
std::span<const TypeMix> TypeMixes();
/// By name or label, any case; null when `name` is no mix.
const TypeMix* FindTypeMix(std::string_view name);
/// "q2_k, q3_k_m, q4_k_m, q5_k_m, q6_k".
std::string TypeMixNameList();

/// What the choice depends on besides the tensor.
struct TypeMixModel {
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  bool tied_embeddings = false;  ///< no output.weight: token_embd is quantised as the output
};

/// llama.cpp's use_more_bits: the first and last eighth of the layers and every third between.
bool TypeMixUseMoreBits(int64_t layer, int64_t n_layers);

/// The registry name of the type llama.cpp's quantizer gives the matrix `role` of layer `layer`
/// (ignored for token_embd / output) whose rows are `cols` long, in a file of type `mix`.
std::string MixTensorTypeName(const TypeMix& mix, SynthTensorRole role, int64_t layer, int64_t cols,
                              const TypeMixModel& model);

}  // namespace kvq
