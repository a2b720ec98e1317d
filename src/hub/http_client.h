// HTTP for the hub, through libcurl: small GETs (the hub's JSON API) and file downloads that
// follow redirects (the hub answers /resolve/ with a redirect to its CDN), append to a partial
// file and resume it with a Range request.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "kvq/status.h"

namespace kvq::hub {

/// A reply that arrived: any HTTP status, with its body (for a download, only an error reply's).
struct HttpReply {
  long status = 0;
  std::string body;
};

/// GET `url` (redirects followed); `token`, when not empty, goes as "Authorization: Bearer".
/// An error only when no reply came (the message names the URL and says why: refused, timed out).
Result<HttpReply> HttpGet(const std::string& url, const std::string& token);

/// Called as bytes arrive: bytes of the file held so far (the resumed part included) and the
/// file's total, 0 while unknown.
using DownloadProgress = std::function<void(int64_t held, int64_t total)>;

/// What a download did.
struct DownloadReply {
  HttpReply reply;           // 200 or 206 on success; another status: the file was left as it was
  int64_t resumed_from = 0;  // the bytes the server skipped (0 when it sent the whole file again)
};

/// Downloads `url` into the file at `path`. When the file already holds bytes, asks for the rest
/// (Range: bytes=<size>-) and appends; a server that sends the whole file instead (200) gets the
/// file rewritten from the start. An error when the transfer broke off (the file keeps what
/// arrived, for the next call to resume) or no reply came.
Result<DownloadReply> DownloadFile(const std::string& url, const std::string& token,
                                   const std::string& path, const DownloadProgress& progress);

}  // namespace kvq::hub
