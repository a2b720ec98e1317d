// kvq serve's prefix cache on disk (--prefix-cache DIR): prompts saved as verified KV snapshots
// (Session::SavePrefix: checksummed, written to a temporary file and renamed), so a request whose
// prompt extends a saved one skips that prefill, also after a restart.
//
// Layout: DIR/<kv>/prefix-<hash>.kvqs (the snapshot, which holds its token ids) beside
// prefix-<hash>.ids (the same ids as text, "kvq-prefix-ids 1 <count> <id>...", read at start so a
// lookup needs no snapshot opened). <kv> names the K/V specs, so a restart with another --kv keeps
// the first one's snapshots apart. A snapshot that fails to load (damaged, another model or
// format) or whose ids disagree with its sidecar is refused, deleted with its sidecar, and never
// used. Oldest files go first when the folder would pass its byte limit.
//
// Not thread-safe: the engine's scheduler thread owns it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvq/model.h"
#include "kvq/session.h"
#include "kvq/status.h"

namespace kvq::server {

class PrefixStore {
 public:
  /// Opens (creating) DIR/<kv_name>, indexes its sidecars and deletes orphans and malformed ones.
  static Result<std::unique_ptr<PrefixStore>> Open(const std::string& dir, const std::string& kv_name,
                                                   int64_t max_bytes);

  struct Entry {
    std::string snapshot;       ///< path of the .kvqs file
    std::vector<int32_t> ids;   ///< the tokens it holds
    int64_t bytes = 0;          ///< snapshot file size
    int64_t sequence = 0;       ///< larger: newer (eviction order)
  };
  /// The entry sharing the longest common prefix with `prompt`, and that length; nullopt if none
  /// shares any token.
  std::optional<std::pair<const Entry*, size_t>> Find(std::span<const int32_t> prompt) const;
  /// The entry of this snapshot file, or null.
  const Entry* Find(const std::string& snapshot) const;
  /// Up to `n` entries, newest first.
  std::vector<const Entry*> Newest(size_t n) const;
  /// Loads `entry` into `session` and checks the ids it restored. On any failure the files are
  /// deleted, the session is cleared, and the error says why.
  Status Load(const Entry& entry, Session& session);
  /// Saves what `session` holds (its tokens) unless an entry already holds those tokens or more of
  /// them; evicts the oldest entries beyond the byte limit. Returns whether it saved.
  Result<bool> Save(const Session& session);

  size_t size() const { return entries_.size(); }
  int64_t version() const { return version_; }  ///< changes whenever an entry comes or goes
  int64_t bytes() const;                          ///< the snapshot files' sizes, summed
  int64_t max_bytes() const { return max_bytes_; }
  const std::string& folder() const { return folder_; }
  int64_t refused() const { return refused_; }  ///< snapshots deleted as damaged since Open

 private:
  PrefixStore() = default;
  void Remove(const std::string& snapshot);
  void Evict();

  std::string folder_;
  int64_t max_bytes_ = 0;
  int64_t next_sequence_ = 0;
  int64_t refused_ = 0;
  int64_t version_ = 0;
  std::vector<Entry> entries_;
};

/// How many leading ids `a` and `b` share.
size_t CommonPrefix(std::span<const int32_t> a, std::span<const int32_t> b);

/// The folder name of a cache's specs: "f16", "int8_int4-kivi" (K_V), or for a per-layer plan
/// "plan-<hash of its specs>" — safe as a file name, different for different specs.
std::string KvFolderName(const KvOptions& kv);

}  // namespace kvq::server
