// The Hugging Face cache on disk, in the layout huggingface_hub and llama.cpp share, so a model
// another tool fetched is reused and one kvq fetched is theirs too:
//   <cache>/models--<user>--<name>/blobs/<sha256>            the file's bytes, named by content
//   <cache>/models--<user>--<name>/blobs/<sha256>.incomplete  a download in progress (resumed)
//   <cache>/models--<user>--<name>/snapshots/<commit>/<path>  a relative symlink to the blob
//   <cache>/models--<user>--<name>/refs/main                  the commit main pointed at
//   <cache>/.locks/models--<user>--<name>/<sha256>.lock        held while the blob is fetched
// <cache> is $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvq/status.h"

namespace kvq::hub {

/// The cache folder the environment names (it need not exist yet).
std::string CacheDirFromEnv();

/// One repository's folder in a cache.
class RepoCache {
 public:
  RepoCache(std::string cache_dir, const std::string& repo);

  /// <cache>/models--user--name
  const std::string& dir() const { return dir_; }
  std::string BlobPath(const std::string& sha256) const;
  std::string IncompletePath(const std::string& sha256) const;
  /// <cache>/.locks/models--user--name/<sha256>.lock: huggingface_hub's lock for that blob (an
  /// flock), so kvq and Python tools never download into one .incomplete file at once.
  std::string LockPath(const std::string& sha256) const;
  std::string SnapshotPath(const std::string& commit, const std::string& file) const;
  /// The commit refs/main holds; empty when there is none.
  std::string MainCommit() const;
  /// Files (relative paths) under snapshots/<commit>/ whose link resolves; empty when none.
  std::vector<std::string> SnapshotFiles(const std::string& commit) const;
  /// Links snapshots/<commit>/<file> to blobs/<sha256> (relative, as huggingface_hub does) and
  /// writes refs/main = commit. The blob must exist.
  Status Link(const std::string& commit, const std::string& file, const std::string& sha256) const;

 private:
  std::string cache_dir_, folder_, dir_;
};

/// A GGUF file in the cache.
struct CachedGguf {
  std::string repo;    // "user/name"
  std::string file;    // path inside the repository
  std::string quant;   // QuantTag(file)
  std::string commit;  // the snapshot holding it
  std::string path;    // the snapshot link: what a loader opens
  int64_t bytes = 0;   // the blob's size
};

/// Every GGUF in every model snapshot of the cache at `cache_dir`, sorted by repository and file
/// (a file in several snapshots of one repository is listed once, for refs/main's when it has
/// it). A cache folder that does not exist holds none.
std::vector<CachedGguf> ListCachedGgufs(const std::string& cache_dir);

/// The lowercase hex SHA-256 of the file at `path` (OpenSSL's), read in 1 MiB pieces.
Result<std::string> FileSha256(const std::string& path);

}  // namespace kvq::hub
