// Fuzz target: snapshots and prompt caches (KvCache::Load: ReadSnapshot's validation, then
// KvCache::Import), loaded into each cache of snapshot_caches.h. Byte 0 is a mode: odd, the rest
// is loaded as it is (a mutation almost always breaks a 64-bit section checksum, so this mostly
// tests the refusals); even, its checksums are first recomputed where the lengths it declares
// allow (RepairChecksums, from the layout at the top of cache/snapshot.cc), so mutations reach
// the checks behind them: formats, transforms, counts, Import. A file a cache accepts must be a
// whole cache: it saves and loads back with the same token ids and positions.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/checksum.h"
#include "cache/snapshot.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/snapshot_caches.h"

namespace kvq::fuzz {

namespace {

uint64_t U64At(const std::vector<uint8_t>& b, uint64_t at) {
  uint64_t v = 0;
  std::memcpy(&v, b.data() + at, 8);
  return v;
}

void PutChecksum(std::vector<uint8_t>& b, uint64_t begin, uint64_t end, uint64_t seed) {
  const uint64_t sum = Checksum64(b.data() + begin, end - begin, seed);
  std::memcpy(b.data() + end, &sum, 8);
}

// The writer's side of the checksums: the header's, then each section's in order, then the
// tokens'; it stops where a declared length runs past the file (the reader refuses that anyway).
void RepairChecksums(std::vector<uint8_t>& b) {
  constexpr uint64_t kFixed = 52, kEntry = 79, kLengthsAt = 31;
  if (b.size() < kFixed) return;
  const uint64_t n_layers = U64At(b, 12);
  if (n_layers > 64) return;
  uint64_t at = kFixed + kEntry * n_layers;
  if (at + 8 > b.size()) return;
  PutChecksum(b, 0, at, 0);
  at += 8;
  for (uint64_t layer = 0; layer < n_layers; ++layer) {
    for (uint64_t s = 0; s < 6; ++s) {
      const uint64_t count = U64At(b, kFixed + kEntry * layer + kLengthsAt + 8 * s);
      const uint64_t bytes = s < 2 ? count : count * 4;
      if ((s >= 2 && count > (uint64_t{1} << 40)) || bytes > b.size() || at + bytes + 8 > b.size()) return;
      PutChecksum(b, at, at + bytes, 6 * layer + s + 1);
      at += bytes + 8;
    }
  }
  if (at + 8 > b.size()) return;
  const uint64_t n_tokens = U64At(b, at);
  if (n_tokens > b.size() || at + 8 + 4 * n_tokens + 8 > b.size()) return;
  PutChecksum(b, at, at + 8 + 4 * n_tokens, 6 * n_layers + 1);
}

}  // namespace

int FuzzSnapshot(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::vector<uint8_t> file(data + 1, data + size);  // the snapshot file
  if ((data[0] & 1) == 0) RepairChecksums(file);
  const std::string path = WriteInput(file.data(), file.size(), "input.kvqs");
  for (size_t i = 0; i < kSnapshotSpecs.size(); ++i) {
    Result<KvCacheConfig> config = SnapshotCacheConfig(i);
    if (!config.ok()) Fail("snapshot", config.status().message());
    Result<std::unique_ptr<KvCache>> cache = KvCache::Create(*config);
    if (!cache.ok()) Fail("snapshot", cache.status().message());
    Result<std::vector<int32_t>> tokens = (*cache)->Load(path, kSnapshotModel);
    if (!tokens.ok()) continue;
    const std::string again = WriteInput(nullptr, 0, "again.kvqs");
    const Status saved = (*cache)->Save(again, kSnapshotModel, *tokens);
    if (!saved.ok()) Fail("snapshot", "a loaded snapshot does not save: " + saved.message());
    Result<std::unique_ptr<KvCache>> fresh = KvCache::Create(*config);
    if (!fresh.ok()) Fail("snapshot", fresh.status().message());
    Result<std::vector<int32_t>> reloaded = (*fresh)->Load(again, kSnapshotModel);
    if (!reloaded.ok()) Fail("snapshot", "a re-saved snapshot does not load: " + reloaded.status().message());
    if (*reloaded != *tokens) Fail("snapshot", "a re-saved snapshot holds other token ids");
    for (int64_t layer = 0; layer < kSnapshotModel.n_layers; ++layer) {
      if ((*fresh)->positions(layer) != (*cache)->positions(layer)) {
        Fail("snapshot", "a re-saved snapshot holds another number of positions");
      }
    }
  }
  return 0;
}

}  // namespace kvq::fuzz

KVQ_FUZZ_TARGET(FuzzSnapshot)
