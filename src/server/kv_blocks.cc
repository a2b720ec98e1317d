// Chained block hashes (see kv_blocks.h for the definition a router recomputes).
#include "server/kv_blocks.h"

namespace kvq::server {
namespace {

constexpr uint64_t kFnvOffset = 14695981039346656037ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

uint64_t MixLittleEndian(uint64_t h, uint64_t value, int bytes) {
  for (int b = 0; b < bytes; ++b) {
    h ^= (value >> (8 * b)) & 0xff;
    h *= kFnvPrime;
  }
  return h;
}

}  // namespace

uint64_t KvRootHash(uint64_t seed) { return MixLittleEndian(kFnvOffset, seed, 8); }

uint64_t KvBlockHash(uint64_t parent, std::span<const int32_t> block_ids) {
  uint64_t h = MixLittleEndian(kFnvOffset, parent, 8);
  for (int32_t id : block_ids) h = MixLittleEndian(h, static_cast<uint32_t>(id), 4);
  return h;
}

std::vector<uint64_t> KvBlockHashes(std::span<const int32_t> ids, const KvBlockOptions& options) {
  const size_t size = static_cast<size_t>(options.block_size);
  std::vector<uint64_t> hashes;
  if (size == 0) return hashes;
  hashes.reserve(ids.size() / size);
  uint64_t parent = KvRootHash(options.hash_seed);
  for (size_t start = 0; start + size <= ids.size(); start += size) {
    parent = KvBlockHash(parent, ids.subspan(start, size));
    hashes.push_back(parent);
  }
  return hashes;
}

}  // namespace kvq::server
