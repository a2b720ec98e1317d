// MixTensorTypeName (see type_mix.h): llama.cpp's rules for the five file types synth writes,
// restated (llama-quant.cpp as of PrismML-Eng/llama.cpp 05008ff, the same rules as upstream's
// llama_tensor_get_type). Rules that need what a synth model never has (an imatrix, experts,
// Falcon, llama.cpp's "70B" model-type check) are left out; docs/weight-types.md lists them.
#include "synth/type_mix.h"

#include <cctype>

namespace kvq {
namespace {

constexpr TypeMix kMixes[] = {
    {"q2_k", "Q2_K", 10, "q2_k"},     {"q3_k_m", "Q3_K_M", 12, "q3_k"}, {"q4_k_m", "Q4_K_M", 15, "q4_k"},
    {"q5_k_m", "Q5_K_M", 17, "q5_k"}, {"q6_k", "Q6_K", 18, "q6_k"},
};

bool SameName(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

// Elements per block of the types the rules can choose (ggml's blck_size): K-quants 256, the
// 32-element fallbacks 32, F16 1.
int64_t BlockElems(std::string_view type) {
  if (type == "f16") return 1;
  return type.ends_with("_k") ? 256 : 32;
}

// tensor_type_fallback: a row length the chosen type's blocks do not divide takes a 32-block type,
// and F16 when 32 does not divide it either.
std::string Fallback(std::string type, int64_t cols) {
  if (cols % BlockElems(type) == 0) return type;
  if (type == "q2_k" || type == "q3_k") type = "q4_0";
  else if (type == "q4_k") type = "q5_0";
  else if (type == "q5_k") type = "q5_1";
  else if (type == "q6_k") type = "q8_0";
  return cols % BlockElems(type) == 0 ? type : "f16";
}

}  // namespace

std::span<const TypeMix> TypeMixes() { return kMixes; }

const TypeMix* FindTypeMix(std::string_view name) {
  for (const TypeMix& m : kMixes) {
    if (SameName(name, m.name)) return &m;
  }
  return nullptr;
}

std::string TypeMixNameList() {
  std::string out;
  for (const TypeMix& m : kMixes) out += (out.empty() ? "" : ", ") + std::string(m.name);
  return out;
}

bool TypeMixUseMoreBits(int64_t layer, int64_t n_layers) {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

std::string MixTensorTypeName(const TypeMix& mix, SynthTensorRole role, int64_t layer, int64_t cols,
                              const TypeMixModel& m) {
  const std::string_view f = mix.name;
  const std::string base = mix.base;
  std::string type = base;
  using R = SynthTensorRole;
  const bool output = role == R::kOutput || (role == R::kTokenEmbd && m.tied_embeddings);
  if (output) {
    // The classifier (or the tied embedding that serves as it): Q6_K, or Q8_0 when the mix's own
    // blocks do not divide its rows. No fallback afterwards in llama.cpp for Q8_0 either.
    type = cols % BlockElems(base) != 0 ? "q8_0" : "q6_k";
  } else if (role == R::kAttnV) {
    const int64_t n_gqa = m.n_kv_heads > 0 ? m.n_heads / m.n_kv_heads : 1;
    if (f == "q2_k") type = n_gqa >= 4 ? "q4_k" : "q3_k";
    else if (f == "q3_k_m") type = layer < 2 ? "q5_k" : "q4_k";
    else if ((f == "q4_k_m" || f == "q5_k_m") && TypeMixUseMoreBits(layer, m.n_layers)) type = "q6_k";
  } else if (role == R::kFfnDown) {
    if (f == "q2_k") type = "q3_k";
    else if (f == "q3_k_m") type = layer < m.n_layers / 16 ? "q5_k" : "q4_k";
    else if ((f == "q4_k_m" || f == "q5_k_m") && TypeMixUseMoreBits(layer, m.n_layers)) type = "q6_k";
  } else if (role == R::kAttnOutput) {
    if (f == "q2_k") type = "q3_k";
    else if (f == "q3_k_m") type = "q4_k";
  }
  return Fallback(type, cols);
}

}  // namespace kvq
