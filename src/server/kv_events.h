// kvq serve's KV events (--kv-events tcp://*:PORT): which token blocks this replica holds, published
// over ZeroMQ for a prefix-aware router (llm-d's KV-cache indexer, the Gateway API Inference
// Extension's endpoint picker) in the wire format vLLM's publisher uses, so such a router reads
// kvq as it reads vLLM:
//
//   PUB socket (an XPUB: the same to a subscriber, and it counts subscriptions) — bound when the
//   endpoint is a wildcard ("tcp://*:5557") or ipc://, else connected to a subscriber that binds
//   (vLLM's rule) — one message per batch, three frames: topic (--kv-events-topic, default empty),
//   the batch's sequence number (8 bytes, big-endian, from 0), the msgpack payload.
//   Payload: KVEventBatch as msgspec encodes an array_like struct: [ts (float64 seconds since the
//   epoch), [event, ...]]. Each event is array_like with its tag first:
//     ["BlockStored", [block_hash, ...], parent_block_hash | nil, [token_id, ...], block_size,
//      lora_id (nil), medium]
//     ["BlockRemoved", [block_hash, ...], medium]
//     ["AllBlocksCleared"]
//   Hashes are the chained block hashes of server/kv_blocks.h (unsigned 64-bit integers); a
//   BlockStored holds a run of consecutive blocks, parent_block_hash the block before the run (nil
//   for a run from the prompt's start). medium: "CPU" for sessions' caches in host RAM ("DISK"
//   with a disk master), "DISK" for the snapshots in the --prefix-cache folder (BlockRemoved when
//   one is evicted, saved over or refused), "REMOTE" for the shared prefix store (which evicts on
//   its own: no BlockRemoved follows for REMOTE).
//   Replay (--kv-events-replay tcp://*:PORT): a ROUTER socket; a REQ (or DEALER) client sends one
//   frame, the first sequence number it missed (8 bytes, big-endian), and gets every buffered batch
//   from there as [seq, payload], then [seq = -1, empty payload] as the end.
// (Matched against vLLM's vllm/distributed/kv_events.py: EventBatch/KVCacheEvent declared as
// msgspec.Struct(array_like=True, omit_defaults=True, tag=True), ZmqEventPublisher's
// send_multipart((topic, seq.to_bytes(8, "big"), payload)) and its replay service answering
// (client_id, b"", seq, payload) ... then END_SEQ = (-1).to_bytes(8, "big", signed=True) with b"".)
//
// Thread-safety: the engine's scheduler thread calls the event methods and Flush; a thread of the
// publisher's own owns the sockets.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kvq/status.h"
#include "server/kv_blocks.h"
#include "server/metrics.h"

namespace kvq::server {

struct KvEventsOptions {
  std::string endpoint;         ///< the PUB socket's: "tcp://*:5557" binds, "tcp://HOST:PORT" connects
  std::string replay_endpoint;  ///< "": no replay socket; else where the ROUTER binds
  std::string topic;            ///< first frame of every message
  size_t replay_batches = 10000;  ///< batches kept for replay (oldest dropped first)
};

class KvEventPublisher {
 public:
  /// Binds the sockets (errors name --kv-events / --kv-events-replay) and starts the sending thread.
  static Result<std::unique_ptr<KvEventPublisher>> Open(const KvEventsOptions& options, Metrics* metrics);
  ~KvEventPublisher();  ///< sends what was flushed, then closes

  /// Events gathered for the next batch.
  void BlockStored(std::span<const uint64_t> hashes, std::optional<uint64_t> parent,
                   std::span<const int32_t> token_ids, int32_t block_size, const std::string& medium);
  void BlockRemoved(std::span<const uint64_t> hashes, const std::string& medium);
  void AllBlocksCleared();
  /// Sends the events gathered since the last Flush as one batch (none: nothing is sent).
  void Flush();

 private:
  struct Impl;
  explicit KvEventPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Which blocks a set of holders (the engine's sessions) hold together, announcing a block when the
/// first holder gets it and its removal when the last one drops it.
class KvBlockLedger {
 public:
  KvBlockLedger(KvBlockOptions blocks, std::string medium) : blocks_(blocks), medium_(std::move(medium)) {}
  /// Holder `holder` now holds `tokens` (its session's ids): events for what changed.
  void Sync(size_t holder, std::span<const int32_t> tokens, KvEventPublisher& out);
  /// Forgets every holder's blocks without events (after AllBlocksCleared).
  void Reset();

 private:
  struct Held {
    std::vector<int32_t> ids;      // the full blocks' ids
    std::vector<uint64_t> hashes;  // [ids.size() / block_size]
  };
  KvBlockOptions blocks_;
  std::string medium_;
  std::vector<Held> holders_;
  std::unordered_map<uint64_t, int32_t> refs_;  // block hash → holders holding it
};

}  // namespace kvq::server
