// The architecture table (see architectures.h).
#include "gguf/architectures.h"

#include <iterator>

namespace kvq {
namespace {

using enum ArchId;
using enum ArchFamily;
constexpr RopePairing kAdjacent = RopePairing::kAdjacent, kHalves = RopePairing::kHalves;

// id, name, written_as, family, pairing, qkv_bias, qk_norm, moe, v_heads_grouped, fused_ba
constexpr Architecture kArchitectures[] = {
    {kLlama, "llama", "llama", kDense, kAdjacent, false, false, false, false, false},
    {kQwen2, "qwen2", "qwen2", kDense, kHalves, true, false, false, false, false},
    {kMistral, "mistral", "llama", kDense, kAdjacent, false, false, false, false, false},
    {kQwen3, "qwen3", "qwen3", kDense, kHalves, false, true, false, false, false},
    {kQwen35, "qwen35", "qwen35", kHybrid, kHalves, false, true, false, false, false},
    {kQwen35Moe, "qwen35moe", "qwen35moe", kHybrid, kHalves, false, true, true, false, false},
    {kQwen3Next, "qwen3next", "qwen3next", kHybrid, kHalves, false, true, true, true, true},
};

// ArchitectureOf indexes the table by id.
constexpr bool InIdOrder() {
  for (size_t i = 0; i < std::size(kArchitectures); ++i) {
    if (static_cast<size_t>(kArchitectures[i].id) != i) return false;
  }
  return true;
}
static_assert(InIdOrder(), "kArchitectures must list the ArchIds in order");

}  // namespace

std::span<const Architecture> Architectures() { return kArchitectures; }

const Architecture& ArchitectureOf(ArchId id) { return kArchitectures[static_cast<size_t>(id)]; }

const Architecture* FindArchitecture(std::string_view name) {
  for (const Architecture& a : kArchitectures) {
    if (name == a.name) return &a;
  }
  return nullptr;
}

std::string ArchitectureNames() {
  std::string out;
  for (const Architecture& a : kArchitectures) {
    if (!out.empty()) out += ", ";
    out += a.name;
  }
  return out;
}

}  // namespace kvq
