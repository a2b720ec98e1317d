// THE weight-type table. Adding a type: a folder under src/weights/<name>/ (layout, scalar
// reference, kernels), one WeightType value in weights/matrix.h, one entry here. MatVec, the
// decoders, the GGUF loader, synth, the benches and the tests all iterate or query this table.
#include <fmt/format.h>

#include <array>
#include <cctype>

#include "weights/bf16/bf16.h"
#include "weights/f16/f16.h"
#include "weights/f32/f32.h"
#include "weights/q1_0/q1_0.h"
#include "weights/q2_0/q2_0.h"
#include "weights/q2_k/q2_k.h"
#include "weights/q3_k/q3_k.h"
#include "weights/q4_0/q4_0.h"
#include "weights/q4_1/q4_1.h"
#include "weights/q4_k/q4_k.h"
#include "weights/q5_0/q5_0.h"
#include "weights/q5_1/q5_1.h"
#include "weights/q5_k/q5_k.h"
#include "weights/q6_k/q6_k.h"
#include "weights/q8_0/q8_0.h"
#include "weights/weight_type.h"

namespace kvq {
namespace {

// GGUF ids are ggml.h's enum ggml_type; file types are llama.h's enum llama_ftype
// (LLAMA_FTYPE_ALL_F32 = 0, MOSTLY_F16 = 1, MOSTLY_Q4_0 = 2, MOSTLY_Q4_1 = 3, MOSTLY_Q8_0 = 7,
// MOSTLY_Q5_0 = 8, MOSTLY_Q5_1 = 9, MOSTLY_BF16 = 32;
// K-quants: MOSTLY_Q2_K = 10, Q3_K_S = 11, Q4_K_S = 14, Q5_K_S = 16, Q6_K = 18, the _S variant
// being the one whose matrices are (almost) all that type).
constexpr std::array<WeightTypeDesc, 15> kWeightTypes = {{
    {.type = WeightType::kF32, .name = "f32", .label = "F32", .gguf_type = 0, .gguf_file_type = 0,
     .block_elems = 1, .block_bytes = 4, .quantized_activation = false,
     .dequantize_block_ref = weights_f32::DequantizeBlock, .exact_block_ref = nullptr, .matvec_roundings = 0, .quantize_block_ref = weights_f32::QuantizeBlock,
     .code_ref = nullptr, .scale_ref = nullptr, .kernels = weights_f32::Kernels},
    {.type = WeightType::kF16, .name = "f16", .label = "F16", .gguf_type = 1, .gguf_file_type = 1,
     .block_elems = 1, .block_bytes = 2, .quantized_activation = false,
     .dequantize_block_ref = weights_f16::DequantizeBlock, .exact_block_ref = nullptr, .matvec_roundings = 0, .quantize_block_ref = weights_f16::QuantizeBlock,
     .code_ref = nullptr, .scale_ref = nullptr, .kernels = weights_f16::Kernels},
    {.type = WeightType::kBf16, .name = "bf16", .label = "BF16", .gguf_type = 30, .gguf_file_type = 32,
     .block_elems = 1, .block_bytes = 2, .quantized_activation = false,
     .dequantize_block_ref = weights_bf16::DequantizeBlock, .exact_block_ref = nullptr, .matvec_roundings = 0, .quantize_block_ref = weights_bf16::QuantizeBlock,
     .code_ref = nullptr, .scale_ref = nullptr, .kernels = weights_bf16::Kernels},
    {.type = WeightType::kQ8_0, .name = "q8_0", .label = "Q8_0", .gguf_type = 8, .gguf_file_type = 7,
     .block_elems = 32, .block_bytes = 34, .quantized_activation = true,
     .dequantize_block_ref = weights_q8_0::DequantizeBlock, .exact_block_ref = weights_q8_0::ExactBlock, .matvec_roundings = 4, .quantize_block_ref = weights_q8_0::QuantizeBlock,
     .code_ref = weights_q8_0::Code, .scale_ref = weights_q8_0::Scale, .kernels = weights_q8_0::Kernels},
    {.type = WeightType::kQ4_0, .name = "q4_0", .label = "Q4_0", .gguf_type = 2, .gguf_file_type = 2,
     .block_elems = 32, .block_bytes = 18, .quantized_activation = true,
     .dequantize_block_ref = weights_q4_0::DequantizeBlock, .exact_block_ref = weights_q4_0::ExactBlock, .matvec_roundings = 4, .quantize_block_ref = weights_q4_0::QuantizeBlock,
     .code_ref = weights_q4_0::Code, .scale_ref = weights_q4_0::Scale, .kernels = weights_q4_0::Kernels},
    {.type = WeightType::kQ4_1, .name = "q4_1", .label = "Q4_1", .gguf_type = 3, .gguf_file_type = 3,
     .block_elems = 32, .block_bytes = 20, .quantized_activation = true,
     .dequantize_block_ref = weights_q4_1::DequantizeBlock, .exact_block_ref = weights_q4_1::ExactBlock, .matvec_roundings = 5, .quantize_block_ref = weights_q4_1::QuantizeBlock,
     .code_ref = nullptr, .scale_ref = nullptr, .kernels = weights_q4_1::Kernels},
    {.type = WeightType::kQ5_0, .name = "q5_0", .label = "Q5_0", .gguf_type = 6, .gguf_file_type = 8,
     .block_elems = 32, .block_bytes = 22, .quantized_activation = true,
     .dequantize_block_ref = weights_q5_0::DequantizeBlock, .exact_block_ref = weights_q5_0::ExactBlock, .matvec_roundings = 4, .quantize_block_ref = weights_q5_0::QuantizeBlock,
     .code_ref = weights_q5_0::Code, .scale_ref = weights_q5_0::Scale, .kernels = weights_q5_0::Kernels},
    {.type = WeightType::kQ5_1, .name = "q5_1", .label = "Q5_1", .gguf_type = 7, .gguf_file_type = 9,
     .block_elems = 32, .block_bytes = 24, .quantized_activation = true,
     .dequantize_block_ref = weights_q5_1::DequantizeBlock, .exact_block_ref = weights_q5_1::ExactBlock, .matvec_roundings = 5, .quantize_block_ref = weights_q5_1::QuantizeBlock,
     .code_ref = nullptr, .scale_ref = nullptr, .kernels = weights_q5_1::Kernels},
    // PrismML's fork (Bonsai): ggml ids 41/42, LLAMA_FTYPE_MOSTLY_Q1_0 = 40, MOSTLY_Q2_0 = 41.
    {.type = WeightType::kQ1_0, .name = "q1_0", .label = "Q1_0", .gguf_type = 41, .gguf_file_type = 40,
     .block_elems = 128, .block_bytes = 18, .quantized_activation = true,
     .dequantize_block_ref = weights_q1_0::DequantizeBlock, .exact_block_ref = weights_q1_0::ExactBlock, .matvec_roundings = 4, .quantize_block_ref = weights_q1_0::QuantizeBlock,
     .code_ref = nullptr, .scale_ref = nullptr, .kernels = weights_q1_0::Kernels},
    {.type = WeightType::kQ2_0, .name = "q2_0", .label = "Q2_0", .gguf_type = 42, .gguf_file_type = 41,
     .block_elems = 64, .block_bytes = 18, .quantized_activation = true,
     .dequantize_block_ref = weights_q2_0::DequantizeBlock, .exact_block_ref = weights_q2_0::ExactBlock, .matvec_roundings = 4, .quantize_block_ref = weights_q2_0::QuantizeBlock,
     .code_ref = nullptr, .scale_ref = nullptr, .kernels = weights_q2_0::Kernels},
    {.type = WeightType::kQ4_K, .name = "q4_k", .label = "Q4_K", .gguf_type = 12, .gguf_file_type = 14,
     .block_elems = 256, .block_bytes = 144, .quantized_activation = true,
     .dequantize_block_ref = weights_q4_k::DequantizeBlock, .exact_block_ref = weights_q4_k::ExactBlock, .matvec_roundings = 5, .quantize_block_ref = weights_q4_k::QuantizeBlock,
     .code_ref = nullptr, .scale_ref = nullptr, .kernels = weights_q4_k::Kernels},
    {.type = WeightType::kQ6_K, .name = "q6_k", .label = "Q6_K", .gguf_type = 14, .gguf_file_type = 18,
     .block_elems = 256, .block_bytes = 210, .quantized_activation = true,
     .dequantize_block_ref = weights_q6_k::DequantizeBlock, .exact_block_ref = weights_q6_k::ExactBlock, .matvec_roundings = 5, .quantize_block_ref = weights_q6_k::QuantizeBlock,
     .code_ref = nullptr, .scale_ref = nullptr, .kernels = weights_q6_k::Kernels},
    {.type = WeightType::kQ5_K, .name = "q5_k", .label = "Q5_K", .gguf_type = 13, .gguf_file_type = 16,
     .block_elems = 256, .block_bytes = 176, .quantized_activation = true,
     .dequantize_block_ref = weights_q5_k::DequantizeBlock, .exact_block_ref = weights_q5_k::ExactBlock, .matvec_roundings = 5, .quantize_block_ref = weights_q5_k::QuantizeBlock,
     .code_ref = nullptr, .scale_ref = nullptr, .kernels = weights_q5_k::Kernels},
    {.type = WeightType::kQ3_K, .name = "q3_k", .label = "Q3_K", .gguf_type = 11, .gguf_file_type = 11,
     .block_elems = 256, .block_bytes = 110, .quantized_activation = true,
     .dequantize_block_ref = weights_q3_k::DequantizeBlock, .exact_block_ref = weights_q3_k::ExactBlock, .matvec_roundings = 5, .quantize_block_ref = weights_q3_k::QuantizeBlock,
     .code_ref = nullptr, .scale_ref = nullptr, .kernels = weights_q3_k::Kernels},
    {.type = WeightType::kQ2_K, .name = "q2_k", .label = "Q2_K", .gguf_type = 10, .gguf_file_type = 10,
     .block_elems = 256, .block_bytes = 84, .quantized_activation = true,
     .dequantize_block_ref = weights_q2_k::DequantizeBlock, .exact_block_ref = weights_q2_k::ExactBlock, .matvec_roundings = 5, .quantize_block_ref = weights_q2_k::QuantizeBlock,
     .code_ref = nullptr, .scale_ref = nullptr, .kernels = weights_q2_k::Kernels},
}};

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::span<const WeightTypeDesc> WeightTypes() { return kWeightTypes; }

const WeightTypeDesc* FindWeightType(WeightType type) {
  for (const WeightTypeDesc& d : kWeightTypes) {
    if (d.type == type) return &d;
  }
  return nullptr;
}

Result<const WeightTypeDesc*> FindWeightTypeByName(std::string_view name) {
  const std::string lower = Lower(name);
  for (const WeightTypeDesc& d : kWeightTypes) {
    if (lower == d.name) return &d;
  }
  return Status::Error(fmt::format("unknown weight type '{}' (known: {})", name, WeightTypeNameList()));
}

const WeightTypeDesc* FindWeightTypeByGgufId(uint32_t gguf_type) {
  for (const WeightTypeDesc& d : kWeightTypes) {
    if (d.gguf_type == gguf_type) return &d;
  }
  return nullptr;
}

std::string WeightTypeLabelList() {
  std::string out;
  for (const WeightTypeDesc& d : kWeightTypes) out += out.empty() ? d.label : fmt::format(", {}", d.label);
  return out;
}

std::string WeightTypeNameList() {
  std::string out;
  for (const WeightTypeDesc& d : kWeightTypes) out += out.empty() ? d.name : fmt::format(", {}", d.name);
  return out;
}

void QuantizeRowRef(const WeightTypeDesc& type, const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / type.block_elems; ++b) {
    type.quantize_block_ref(x + b * type.block_elems, out + b * type.block_bytes);
  }
}

const char* WeightTypeName(WeightType type) {
  const WeightTypeDesc* d = FindWeightType(type);
  return d != nullptr ? d->label : "?";
}

}  // namespace kvq
