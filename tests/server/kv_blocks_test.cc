// Chained block hashes (server/kv_blocks.h): the definition written in the header, recomputed here
// byte by byte from its text, so a router that follows the header gets the same numbers; chaining
// (a block's hash depends on every block before it), full blocks only, and the seed.
#include "server/kv_blocks.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace kvq::server {
namespace {

// The header's definition, written out independently of kv_blocks.cc.
uint64_t Fnv1a(const std::vector<uint8_t>& bytes) {
  uint64_t h = 14695981039346656037ull;
  for (uint8_t b : bytes) {
    h ^= b;
    h *= 1099511628211ull;
  }
  return h;
}
void PutLe(std::vector<uint8_t>& out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
std::vector<uint64_t> Reference(const std::vector<int32_t>& ids, size_t block, uint64_t seed) {
  std::vector<uint8_t> root;
  PutLe(root, seed, 8);
  uint64_t parent = Fnv1a(root);
  std::vector<uint64_t> out;
  for (size_t s = 0; s + block <= ids.size(); s += block) {
    std::vector<uint8_t> bytes;
    PutLe(bytes, parent, 8);
    for (size_t i = s; i < s + block; ++i) PutLe(bytes, static_cast<uint32_t>(ids[i]), 4);
    parent = Fnv1a(bytes);
    out.push_back(parent);
  }
  return out;
}

std::vector<int32_t> Ids(size_t n, int32_t first = 1) {
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), first);
  return ids;
}

TEST(KvBlocks, MatchesTheDocumentedDefinition) {
  for (int32_t block : {1, 3, 16}) {
    for (uint64_t seed : {uint64_t{0}, uint64_t{42}, ~uint64_t{0}}) {
      const std::vector<int32_t> ids = Ids(50, 100000);
      EXPECT_EQ(KvBlockHashes(ids, {.block_size = block, .hash_seed = seed}), Reference(ids, block, seed))
          << "block " << block << " seed " << seed;
    }
  }
}

TEST(KvBlocks, OnlyFullBlocksAreNamed) {
  const KvBlockOptions o{.block_size = 16};
  EXPECT_TRUE(KvBlockHashes(Ids(15), o).empty());
  EXPECT_EQ(KvBlockHashes(Ids(16), o).size(), 1u);
  EXPECT_EQ(KvBlockHashes(Ids(47), o).size(), 2u);
  // The trailing partial block does not change the full blocks' hashes.
  const std::vector<uint64_t> a = KvBlockHashes(Ids(32), o);
  const std::vector<uint64_t> b = KvBlockHashes(Ids(40), o);
  EXPECT_EQ(a, b);
}

TEST(KvBlocks, AHashNamesEveryBlockBeforeIt) {
  const KvBlockOptions o{.block_size = 4};
  std::vector<int32_t> a = Ids(16), b = Ids(16);
  b[1] = 999;  // differs in block 0 only
  const std::vector<uint64_t> ha = KvBlockHashes(a, o), hb = KvBlockHashes(b, o);
  for (size_t i = 0; i < ha.size(); ++i) EXPECT_NE(ha[i], hb[i]) << "block " << i;
  // Same ids in block 2 alone, different prefixes: different hashes; shared prefix: same.
  std::vector<int32_t> c = a;
  c[13] = 7;  // block 3 differs
  const std::vector<uint64_t> hc = KvBlockHashes(c, o);
  EXPECT_EQ(hc[0], ha[0]);
  EXPECT_EQ(hc[2], ha[2]);
  EXPECT_NE(hc[3], ha[3]);
  EXPECT_EQ(ha[1], KvBlockHash(ha[0], std::span<const int32_t>(a).subspan(4, 4)));
}

TEST(KvBlocks, TheSeedChangesEveryHash) {
  const std::vector<int32_t> ids = Ids(32);
  const std::vector<uint64_t> h0 = KvBlockHashes(ids, {.block_size = 16, .hash_seed = 0});
  const std::vector<uint64_t> h1 = KvBlockHashes(ids, {.block_size = 16, .hash_seed = 1});
  for (size_t i = 0; i < h0.size(); ++i) EXPECT_NE(h0[i], h1[i]);
  EXPECT_NE(KvRootHash(0), KvRootHash(1));
}

}  // namespace
}  // namespace kvq::server
