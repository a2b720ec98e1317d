#include "hub/hf_cache.h"

#include <fmt/format.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include "hub/repo_ref.h"

namespace kvq::hub {
namespace fs = std::filesystem;

namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// "models--user--name" -> "user/name"; empty for another kind of folder (datasets--, spaces--).
std::string RepoOfFolder(const std::string& folder) {
  const std::string prefix = "models--";
  if (folder.rfind(prefix, 0) != 0) return "";
  std::string rest = folder.substr(prefix.size());
  const size_t sep = rest.find("--");
  if (sep == std::string::npos) return rest;  // a repository without a user ("gpt2")
  return rest.substr(0, sep) + "/" + rest.substr(sep + 2);
}

}  // namespace

std::string CacheDirFromEnv() {
  if (std::string d = Env("HF_HUB_CACHE"); !d.empty()) return d;
  if (std::string d = Env("HF_HOME"); !d.empty()) return (fs::path(d) / "hub").string();
  return (fs::path(Env("HOME")) / ".cache" / "huggingface" / "hub").string();
}

RepoCache::RepoCache(std::string cache_dir, const std::string& repo)
    : cache_dir_(std::move(cache_dir)), folder_("models--" + repo) {
  if (const size_t slash = folder_.find('/'); slash != std::string::npos) {
    folder_.replace(slash, 1, "--");
  }
  dir_ = (fs::path(cache_dir_) / folder_).string();
}

std::string RepoCache::LockPath(const std::string& sha256) const {
  return (fs::path(cache_dir_) / ".locks" / folder_ / (sha256 + ".lock")).string();
}

std::string RepoCache::BlobPath(const std::string& sha256) const {
  return dir_ + "/blobs/" + sha256;
}

std::string RepoCache::IncompletePath(const std::string& sha256) const {
  return BlobPath(sha256) + ".incomplete";
}

std::string RepoCache::SnapshotPath(const std::string& commit, const std::string& file) const {
  return dir_ + "/snapshots/" + commit + "/" + file;
}

std::string RepoCache::MainCommit() const {
  std::ifstream in(dir_ + "/refs/main");
  std::string commit;
  std::getline(in, commit);
  return commit;
}

std::vector<std::string> RepoCache::SnapshotFiles(const std::string& commit) const {
  std::vector<std::string> files;
  const fs::path root = fs::path(dir_) / "snapshots" / commit;
  std::error_code ec;
  if (commit.empty() || !fs::is_directory(root, ec)) return files;
  for (auto it = fs::recursive_directory_iterator(root, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    // lexically: fs::relative would resolve the link to its blob
    if (fs::is_regular_file(it->path(), ec))
      files.push_back(it->path().lexically_relative(root).generic_string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

Status RepoCache::Link(const std::string& commit, const std::string& file,
                       const std::string& sha256) const {
  const fs::path link = SnapshotPath(commit, file);
  std::error_code ec;
  fs::create_directories(link.parent_path(), ec);
  if (ec)
    return Status::Error(
        fmt::format("cannot create {}: {}", link.parent_path().string(), ec.message()));
  // Relative, so the cache can be moved: from snapshots/<commit>/<dirs...>/ up to the repository.
  fs::path target;
  for (size_t up = 0; up < 2 + static_cast<size_t>(std::count(file.begin(), file.end(), '/')); ++up)
    target /= "..";
  target = target / "blobs" / sha256;
  fs::remove(link, ec);
  fs::create_symlink(target, link, ec);
  if (ec)
    return Status::Error(
        fmt::format("cannot link {} -> {}: {}", link.string(), target.string(), ec.message()));
  fs::create_directories(fs::path(dir_) / "refs", ec);
  const std::string ref = dir_ + "/refs/main";
  std::ofstream out(ref, std::ios::trunc);
  out << commit;  // no newline, as huggingface_hub writes it
  out.close();
  if (!out) return Status::Error("cannot write " + ref);
  return Status::Ok();
}

std::vector<CachedGguf> ListCachedGgufs(const std::string& cache_dir) {
  std::map<std::pair<std::string, std::string>, CachedGguf> found;  // (repo, file) -> one entry
  std::error_code ec;
  if (!fs::is_directory(cache_dir, ec)) return {};
  for (const fs::directory_entry& e : fs::directory_iterator(cache_dir, ec)) {
    const std::string repo = RepoOfFolder(e.path().filename().string());
    if (repo.empty()) continue;
    const RepoCache cache(cache_dir, repo);
    const std::string main = cache.MainCommit();
    for (const fs::directory_entry& snap : fs::directory_iterator(e.path() / "snapshots", ec)) {
      const std::string commit = snap.path().filename().string();
      for (const std::string& file : cache.SnapshotFiles(commit)) {
        if (!IsPickableGguf(file)) continue;
        const auto key = std::make_pair(repo, file);
        if (found.count(key) && commit != main) continue;
        const std::string path = cache.SnapshotPath(commit, file);
        const auto bytes = fs::file_size(path, ec);
        found[key] = {.repo = repo,
                      .file = file,
                      .quant = QuantTag(file),
                      .commit = commit,
                      .path = path,
                      .bytes = ec ? 0 : static_cast<int64_t>(bytes)};
      }
    }
  }
  std::vector<CachedGguf> list;
  for (auto& [key, g] : found) list.push_back(std::move(g));
  return list;
}

Result<std::string> FileSha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error("cannot read " + path);
  const std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(),
                                                                    EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return Status::Error("OpenSSL could not start a SHA-256");
  }
  std::vector<char> piece(1 << 20);  // [1 MiB] bytes of the file
  while (in) {
    in.read(piece.data(), static_cast<std::streamsize>(piece.size()));
    if (in.gcount() > 0)
      EVP_DigestUpdate(ctx.get(), piece.data(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) return Status::Error("error reading " + path);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &n);
  std::string hex;
  for (unsigned int i = 0; i < n; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

}  // namespace kvq::hub
