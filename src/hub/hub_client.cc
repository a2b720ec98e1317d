#include "hub/hub_client.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

namespace kvq::hub {
namespace fs = std::filesystem;

namespace {

// One file of the hub's tree listing.
struct HubFile {
  std::string path;
  int64_t bytes = 0;
  std::string sha256;  // lfs.oid; empty for a file not stored with LFS
};

bool IsHex(const std::string& s, size_t n) {
  return s.size() == n && std::all_of(s.begin(), s.end(), [](char c) {
           return std::isxdigit(static_cast<unsigned char>(c)) != 0;
         });
}

// A path the server gave, safe to place under snapshots/<commit>/: relative, no "." or "..".
bool SafeRelativePath(const std::string& p) {
  if (p.empty() || p.front() == '/') return false;
  for (size_t start = 0; start <= p.size();) {
    const size_t end = std::min(p.find('/', start), p.size());
    const std::string part = p.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

// Percent-encodes what a URL path may not hold as is; '/' separates the file's folders.
std::string UrlPath(const std::string& path) {
  std::string out;
  for (unsigned char c : path) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

// The message for an API reply that is not 200.
std::string HubRefusal(const RepoRef& ref, const HubOptions& o, const std::string& what,
                       long status) {
  // huggingface.co answers 401 for a repository that does not exist too, so that a private
  // one's existence does not leak.
  if (status == 401 || status == 403) {
    return fmt::format(
        "{}: {} refused {} (HTTP {}): no such repository, or a private or gated one, which "
        "needs a token with access in HF_TOKEN{}",
        ref.Text(), o.endpoint, what, status,
        o.token.empty() ? "" : " (the one given was refused)");
  }
  if (status == 404)
    return fmt::format("{}: no such model repository on {} (HTTP 404 for {})", ref.Text(),
                       o.endpoint, what);
  return fmt::format("{}: {} answered HTTP {} for {}", ref.Text(), o.endpoint, status, what);
}

Result<nlohmann::json> GetJson(const RepoRef& ref, const HubOptions& o, const std::string& url) {
  Result<HttpReply> reply = HttpGet(url, o.token);
  if (!reply.ok()) return reply.status();
  if (reply->status != 200) return Status::Error(HubRefusal(ref, o, url, reply->status));
  nlohmann::json doc = nlohmann::json::parse(reply->body, nullptr, false);
  if (doc.is_discarded())
    return Status::Error(fmt::format("{}: {} did not answer JSON", ref.Text(), url));
  return doc;
}

// The commit main points at, and its files.
struct HubListing {
  std::string commit;
  std::vector<HubFile> files;
};

// *reached: whether the hub answered at all (then an error is its answer, not the network's).
Result<HubListing> ListOnHub(const RepoRef& ref, const HubOptions& o, bool* reached) {
  *reached = false;
  const std::string api = o.endpoint + "/api/models/" + ref.repo;
  Result<HttpReply> probe = HttpGet(api, o.token);
  if (!probe.ok()) return probe.status();
  *reached = true;
  if (probe->status != 200) return Status::Error(HubRefusal(ref, o, api, probe->status));
  const nlohmann::json info = nlohmann::json::parse(probe->body, nullptr, false);
  HubListing listing;
  if (info.is_object() && info.contains("sha") && info["sha"].is_string())
    listing.commit = info["sha"];
  if (!IsHex(listing.commit, 40)) {
    return Status::Error(
        fmt::format("{}: {} gave no 40-hex-digit commit in \"sha\"", ref.Text(), api));
  }
  Result<nlohmann::json> tree =
      GetJson(ref, o, api + "/tree/" + listing.commit + "?recursive=true");
  if (!tree.ok()) return tree.status();
  if (!tree->is_array())
    return Status::Error(fmt::format("{}: the tree listing is not a JSON array", ref.Text()));
  for (const nlohmann::json& e : *tree) {
    if (!e.is_object() || e.value("type", "") != "file" || !e.contains("path") ||
        !e["path"].is_string())
      continue;
    HubFile f{.path = e["path"], .bytes = e.value("size", int64_t{0})};
    if (e.contains("lfs") && e["lfs"].is_object()) {
      f.sha256 = e["lfs"].value("oid", "");
      f.bytes = e["lfs"].value("size", f.bytes);
    }
    if (SafeRelativePath(f.path)) listing.files.push_back(std::move(f));
  }
  return listing;
}

// The pick among refs/main's snapshot, for when the hub is not asked.
Result<PullResult> PickFromCache(const RepoRef& ref, const HubOptions& o,
                                 const std::string& reason) {
  const RepoCache cache(o.cache_dir, ref.repo);
  const std::string commit = cache.MainCommit();
  const std::vector<std::string> files = cache.SnapshotFiles(commit);
  if (files.empty()) {
    return Status::Error(fmt::format("{}: {}, and the cache ({}) has no snapshot of it", ref.Text(),
                                     reason, o.cache_dir));
  }
  Result<std::string> file = PickGguf(ref, files);
  if (!file.ok())
    return Status::Error(fmt::format("{} (in the cache; {})", file.status().message(), reason));
  const std::string path = cache.SnapshotPath(commit, *file);
  std::error_code ec;
  const auto bytes = fs::file_size(path, ec);
  return PullResult{.model = {.repo = ref.repo,
                              .file = *file,
                              .quant = QuantTag(*file),
                              .commit = commit,
                              .path = path,
                              .bytes = ec ? 0 : static_cast<int64_t>(bytes)},
                    .offline_reason = reason};
}

// An exclusive flock on a blob's lock file while alive (released by close, also when the process
// dies); the file stays, as huggingface_hub leaves its own: unlinking it could let a waiter lock
// a file nobody else sees.
class BlobLock {
 public:
  explicit BlobLock(const std::string& path) {
    std::error_code ec;
    fs::create_directories(fs::path(path).parent_path(), ec);
    fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ >= 0 && flock(fd_, LOCK_EX) != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~BlobLock() {
    if (fd_ >= 0) close(fd_);
  }
  BlobLock(const BlobLock&) = delete;
  BlobLock& operator=(const BlobLock&) = delete;
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Removes the repository's folders a failed first pull created and left empty.
void RemoveEmptyFolders(const RepoCache& cache) {
  std::error_code ec;
  for (const std::string& d : {cache.dir() + "/blobs", cache.dir()}) {
    if (fs::is_directory(d, ec) && fs::is_empty(d, ec)) fs::remove(d, ec);
  }
}

// Downloads `f` into blobs/<sha256>: resumes a .incomplete file, checks size and SHA-256.
Status DownloadBlob(const RepoRef& ref, const HubOptions& o, const std::string& commit,
                    const HubFile& f, const PullEvents& events, int64_t* resumed_from) {
  const RepoCache cache(o.cache_dir, ref.repo);
  const std::string part = cache.IncompletePath(f.sha256);
  std::error_code ec;
  fs::create_directories(fs::path(part).parent_path(), ec);
  if (ec)
    return Status::Error(
        fmt::format("cannot create {}: {}", fs::path(part).parent_path().string(), ec.message()));
  const auto size_of = [&] {
    std::error_code e;
    return fs::exists(part, e) ? static_cast<int64_t>(fs::file_size(part, e)) : int64_t{0};
  };
  if (size_of() > f.bytes) fs::remove(part, ec);  // not a prefix of this file
  const int64_t held = size_of();
  if (events.on_download) events.on_download(f.path, f.bytes, held);
  if (held < f.bytes) {
    const std::string url =
        o.endpoint + "/" + ref.repo + "/resolve/" + commit + "/" + UrlPath(f.path);
    Result<DownloadReply> got = DownloadFile(url, o.token, part, events.on_progress);
    if (!got.ok()) {
      return Status::Error(
          fmt::format("{}: downloading {} broke off: {}; run the same command again to resume "
                      "from the {} bytes kept in {}",
                      ref.Text(), f.path, got.status().message(), size_of(), part));
    }
    if (got->reply.status != 200 && got->reply.status != 206) {
      return Status::Error(HubRefusal(ref, o, url, got->reply.status));
    }
    *resumed_from = got->resumed_from;
  }
  const int64_t have = size_of();
  if (have != f.bytes) {
    fs::remove(part, ec);
    return Status::Error(
        fmt::format("{}: {} arrived with {} bytes, the hub lists {}; the partial file was deleted",
                    ref.Text(), f.path, have, f.bytes));
  }
  Result<std::string> sha = FileSha256(part);
  if (!sha.ok()) return sha.status();
  if (*sha != f.sha256) {
    fs::remove(part, ec);
    return Status::Error(
        fmt::format("{}: {} has SHA-256 {}, the hub lists {}: the download is corrupt and was "
                    "deleted (nothing was added to the cache)",
                    ref.Text(), f.path, *sha, f.sha256));
  }
  fs::rename(part, cache.BlobPath(f.sha256), ec);
  if (ec) return Status::Error(fmt::format("cannot rename {}: {}", part, ec.message()));
  return Status::Ok();
}

}  // namespace

HubOptions HubOptionsFromEnv() {
  HubOptions o;
  if (const char* e = std::getenv("HF_ENDPOINT"); e && *e) o.endpoint = e;
  while (!o.endpoint.empty() && o.endpoint.back() == '/') o.endpoint.pop_back();
  if (const char* t = std::getenv("HF_TOKEN"); t) o.token = t;
  o.cache_dir = CacheDirFromEnv();
  if (const char* off = std::getenv("HF_HUB_OFFLINE"); off) {
    std::string v(off);
    std::transform(v.begin(), v.end(), v.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    o.offline = v == "1" || v == "true" || v == "yes" || v == "on";
  }
  return o;
}

Result<PullResult> PullGguf(const RepoRef& ref, const HubOptions& o, const PullEvents& events) {
  if (o.offline) return PickFromCache(ref, o, "HF_HUB_OFFLINE is set");
  bool reached = false;
  Result<HubListing> listing = ListOnHub(ref, o, &reached);
  if (!listing.ok()) {
    if (reached) return listing.status();
    Result<PullResult> cached =
        PickFromCache(ref, o, "the hub could not be reached (" + listing.status().message() + ")");
    return cached.ok() ? cached
                       : Status::Error(fmt::format("{}: cannot reach the hub: {}", ref.Text(),
                                                   listing.status().message()));
  }
  std::vector<std::string> paths;
  for (const HubFile& f : listing->files) paths.push_back(f.path);
  Result<std::string> picked = PickGguf(ref, paths);
  if (!picked.ok()) return picked.status();
  const HubFile& f = *std::find_if(listing->files.begin(), listing->files.end(),
                                   [&](const HubFile& h) { return h.path == *picked; });
  if (!IsHex(f.sha256, 64)) {
    return Status::Error(
        fmt::format("{}: {} has no LFS SHA-256 in the hub's listing, so it cannot be verified",
                    ref.Text(), f.path));
  }
  const RepoCache cache(o.cache_dir, ref.repo);
  PullResult result;
  std::error_code ec;
  const std::string blob = cache.BlobPath(f.sha256);
  const auto missing = [&] {
    return !fs::exists(blob, ec) || static_cast<int64_t>(fs::file_size(blob, ec)) != f.bytes;
  };
  if (missing()) {
    const BlobLock lock(cache.LockPath(f.sha256));
    if (!lock.held()) return Status::Error("cannot lock " + cache.LockPath(f.sha256));
    if (missing()) {  // another process may have fetched it while this one waited
      if (Status s = DownloadBlob(ref, o, listing->commit, f, events, &result.resumed_from);
          !s.ok()) {
        RemoveEmptyFolders(cache);
        return s;
      }
      result.downloaded = true;
    }
  }
  if (Status s = cache.Link(listing->commit, f.path, f.sha256); !s.ok()) return s;
  result.model = {.repo = ref.repo,
                  .file = f.path,
                  .quant = QuantTag(f.path),
                  .commit = listing->commit,
                  .path = cache.SnapshotPath(listing->commit, f.path),
                  .bytes = f.bytes};
  return result;
}

}  // namespace kvq::hub
