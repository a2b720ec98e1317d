// Token blocks and their chained hashes: the names under which kvq serve shares prefixes with
// other replicas (the Redis prefix store's keys) and announces them to a router (KV events).
//
// A prompt is cut into blocks of `block_size` token ids (--kv-block-size, default 16); only full
// blocks are named, a trailing partial block never is. Block i's hash chains over its parent's:
//
//   root     = FNV-1a-64( seed as 8 bytes, little-endian )                 (--kv-hash-seed)
//   hash[0]  = FNV-1a-64( root as 8 bytes LE, then each id of block 0 as 4 bytes LE (uint32) )
//   hash[i]  = FNV-1a-64( hash[i-1] as 8 bytes LE, then each id of block i as 4 bytes LE )
//
// FNV-1a-64: h = 14695981039346656037; for each byte b: h ^= b; h *= 1099511628211 (mod 2^64).
// So a block's hash names every token before it too: two prompts share hash[i] only when they
// share blocks 0..i (up to a 64-bit collision; whoever restores a prefix compares the ids). A
// router recomputes these from the token ids alone, given the block size and seed.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kvq::server {

struct KvBlockOptions {
  int32_t block_size = 16;  ///< token ids per block, ≥ 1
  uint64_t hash_seed = 0;   ///< what the chain starts from
};

/// The hash a chain of blocks starts from (the parent of block 0).
uint64_t KvRootHash(uint64_t seed);
/// The hash of one block of ids after a block whose hash is `parent`.
uint64_t KvBlockHash(uint64_t parent, std::span<const int32_t> block_ids);
/// The hashes of every full block of `ids`, in order: [ids.size() / block_size].
std::vector<uint64_t> KvBlockHashes(std::span<const int32_t> ids, const KvBlockOptions& options);

}  // namespace kvq::server
