// kvq serve's shared prefix store (--prefix-store redis://HOST:PORT[/DB]): prefix snapshots in a
// Redis (or Valkey) server that every replica of a model reads and writes, so a prompt one replica
// prefilled is restored by another that never saw it.
//
// Keys (NS = "kvq:<model fingerprint>:<KV specs>:b<block size>:s<hash seed>"):
//   NS:snap:<hash>  the session's snapshot in kvq's own verified format (Session::SavePrefix: magic,
//                   version, model fingerprint, formats, a checksum per section), saved after a
//                   request; <hash> is the chained hash (server/kv_blocks.h) of its last full block.
//   NS:blk:<hash>   for every full block of that snapshot: "<snapshot hash> <blocks> <tokens>", the
//                   snapshot that holds this block and everything before it.
// A new prompt's full blocks are hashed and their index keys read in one MGET; the longest present
// names the snapshot to fetch, even when it holds more than the prompt shares (it is truncated to
// the shared blocks after loading). What is loaded is verified twice: the snapshot format refuses
// a damaged value or one of another model or KV format, and its token ids must equal the prompt's
// over the shared blocks; a refused value is deleted (and replaced when the request saves again).
//
// Size: Redis bounds it (maxmemory with maxmemory-policy allkeys-lru evicts the least recently
// used keys; kvq writes no TTLs). An index entry whose snapshot was evicted is a miss.
// Outages: every call is bounded by a short timeout; a failure logs once, marks the store down
// (a metric), and the request goes on with local caches; a reconnect is tried at most once a
// second, and logged when it succeeds.
// Hybrid models: a recurrent state cannot be cut, so only a snapshot whose tokens are all a
// prefix of the prompt is restored (the index says how many tokens each holds).
//
// Not thread-safe: the engine's scheduler thread owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvq/model.h"
#include "kvq/session.h"
#include "kvq/status.h"
#include "server/kv_blocks.h"
#include "server/metrics.h"

struct redisContext;

namespace kvq::server {

struct RedisAddress {
  std::string host;
  int port = 6379;
  int db = 0;
};
/// Parses "redis://HOST:PORT[/DB]" (PORT defaults to 6379); errors name --prefix-store.
Result<RedisAddress> ParseRedisUrl(const std::string& url);

class RemotePrefixStore {
 public:
  /// Connects (a server that is down now is not an error: the store starts down and retries).
  /// `ns` is the key namespace (RemotePrefixNamespace).
  static Result<std::unique_ptr<RemotePrefixStore>> Open(const std::string& url, std::string ns,
                                                         const KvBlockOptions& blocks, Metrics* metrics);
  ~RemotePrefixStore();

  struct Match {
    size_t blocks = 0;          ///< full blocks of the prompt the snapshot holds
    uint64_t snapshot = 0;      ///< its key's hash
    size_t snapshot_blocks = 0;  ///< full blocks the snapshot holds in all
    int64_t tokens = 0;         ///< positions the snapshot holds in all
  };
  /// The stored snapshot holding the most leading full blocks of `prompt`; nullopt when none (or
  /// the store is down).
  std::optional<Match> Find(std::span<const int32_t> prompt);
  /// Fetches the snapshot into `session` and checks its ids over the matched blocks. On failure
  /// the session is cleared; a damaged or foreign value (not an outage) is deleted and counted.
  Status Load(const Match& match, std::span<const int32_t> prompt, Session& session);
  /// Stores what `session` holds unless a stored snapshot already holds its blocks. Returns the
  /// hashes of the blocks it stored (empty when it stored nothing).
  std::vector<uint64_t> Save(const Session& session);

  bool up() const { return context_ != nullptr; }
  const KvBlockOptions& blocks() const { return blocks_; }

 private:
  RemotePrefixStore() = default;
  bool Connect();                       // false: still down (logged on the first failure)
  void Down(const std::string& why);    // drops the connection, logs once, counts
  std::string Key(const char* kind, uint64_t hash) const;

  RedisAddress address_;
  std::string url_;
  std::string ns_;
  KvBlockOptions blocks_;
  Metrics* metrics_ = nullptr;
  // Snapshots pass through files (Session's format): scratch_ + "load.kvqs" / "save.kvqs" in the
  // temporary folder, each removed once read, so a server killed between requests leaves nothing.
  std::string scratch_;
  redisContext* context_ = nullptr;
  bool logged_down_ = false;
  std::chrono::steady_clock::time_point next_retry_{};
};

/// The key namespace of a model, its KV specs (KvFolderName) and the block rules.
std::string RemotePrefixNamespace(const ModelFingerprint& model, const std::string& kv_name,
                                  const KvBlockOptions& blocks);

}  // namespace kvq::server
