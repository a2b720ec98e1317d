// `kvq pull`'s core: find the GGUF a RepoRef picks on a Hugging Face hub, and make it a verified
// file of the local cache (hf_cache.h), downloading only what the cache lacks. The CLI's pull,
// list and -hf are clients of this one path.
//
// The hub's API, as huggingface_hub and huggingface.js call it:
//   GET {endpoint}/api/models/{repo}                  -> {"sha": "<commit>", ...}
//   GET {endpoint}/api/models/{repo}/tree/{commit}?recursive=true
//                                                     -> [{"type": "file", "path", "size",
//                                                          "lfs": {"oid": "<sha256>", "size"}},
//                                                          ...]
//   GET {endpoint}/{repo}/resolve/{commit}/{path}     -> the bytes (a redirect to the CDN)
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "hub/hf_cache.h"
#include "hub/http_client.h"
#include "hub/repo_ref.h"
#include "kvq/status.h"

namespace kvq::hub {

/// Where and how to reach the hub.
struct HubOptions {
  std::string endpoint = "https://huggingface.co";  // no trailing '/'
  std::string token;                                // sent as a Bearer token when not empty
  std::string cache_dir;                            // the cache (hf_cache.h)
  bool offline = false;                             // never ask the hub: pick from the cache
};

/// $HF_ENDPOINT, $HF_TOKEN, CacheDirFromEnv() and $HF_HUB_OFFLINE (1/true/yes/on).
HubOptions HubOptionsFromEnv();

/// What a pull tells its caller as it goes.
struct PullEvents {
  /// A download starts: the file, its size, and the bytes a .incomplete file already holds.
  std::function<void(const std::string& file, int64_t bytes, int64_t held)> on_download;
  DownloadProgress on_progress;
};

struct PullResult {
  CachedGguf model;
  bool downloaded = false;     // false: the file was in the cache already
  int64_t resumed_from = 0;    // bytes of an interrupted download that were kept
  std::string offline_reason;  // not empty: picked from the cache without the hub, and why
};

/// Makes the GGUF `ref` picks (repo_ref.h's rule, over the hub's file list) a file in the cache:
/// a cache hit downloads nothing; a download goes to blobs/<sha256>.incomplete, resumes one left
/// by an interrupted pull, and becomes the blob only when its size and SHA-256 are the hub's (a
/// mismatch deletes it). Offline, or when the hub cannot be reached, the pick is made among the
/// files of refs/main's snapshot. Errors name the repository (and the quant) and say what to do.
Result<PullResult> PullGguf(const RepoRef& ref, const HubOptions& options,
                            const PullEvents& events = {});

}  // namespace kvq::hub
