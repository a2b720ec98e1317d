#include "hub/http_client.h"

#include <curl/curl.h>
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>

namespace kvq::hub {
namespace {

// libcurl's global state, set up once per process before the first handle.
void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct CurlDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};
using CurlHandle = std::unique_ptr<CURL, CurlDeleter>;
using CurlHeaders = std::unique_ptr<curl_slist, CurlDeleter>;

// A handle with what every hub request shares: redirects, the token, a user agent, and limits
// that turn a dead connection into an error instead of a hang (no overall timeout: a large
// model legitimately takes hours).
CurlHandle NewHandle(const std::string& url, const std::string& token, CurlHeaders* headers,
                     char* error) {
  InitCurlOnce();
  CurlHandle h(curl_easy_init());
  if (!h) return h;
  curl_easy_setopt(h.get(), CURLOPT_URL, url.c_str());
  curl_easy_setopt(h.get(), CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(h.get(), CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(h.get(), CURLOPT_USERAGENT, "kvq");
  curl_easy_setopt(h.get(), CURLOPT_CONNECTTIMEOUT, 30L);
  curl_easy_setopt(h.get(), CURLOPT_LOW_SPEED_LIMIT, 1L);  // bytes/s, for LOW_SPEED_TIME seconds
  curl_easy_setopt(h.get(), CURLOPT_LOW_SPEED_TIME, 60L);
  curl_easy_setopt(h.get(), CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(h.get(), CURLOPT_NOSIGNAL, 1L);
  // libcurl (7.58 on) sends a custom Authorization header only to the host first asked, so the
  // token does not follow the redirect to the CDN's signed URL.
  if (!token.empty()) {
    headers->reset(curl_slist_append(nullptr, ("Authorization: Bearer " + token).c_str()));
    curl_easy_setopt(h.get(), CURLOPT_HTTPHEADER, headers->get());
  }
  return h;
}

std::string CurlError(CURLcode code, const char* error) {
  return error[0] != '\0' ? std::string(error) : std::string(curl_easy_strerror(code));
}

size_t AppendToString(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// The state of one download, shared with libcurl's callbacks.
struct Transfer {
  CURL* handle = nullptr;
  std::string path;
  FILE* file = nullptr;  // opened at the first body byte of a 200/206 reply
  int64_t offset = 0;    // bytes the file held when asked; 0 after a 200 rewrote it
  long status = 0;
  std::string error_body;  // an error reply's first bytes, for the message
  bool write_failed = false;
  const DownloadProgress* progress = nullptr;
};

size_t WriteBody(char* data, size_t size, size_t n, void* user) {
  Transfer& t = *static_cast<Transfer*>(user);
  const size_t bytes = size * n;
  if (t.status == 0) curl_easy_getinfo(t.handle, CURLINFO_RESPONSE_CODE, &t.status);
  if (t.status != 200 && t.status != 206) {
    if (t.error_body.size() < 1024) t.error_body.append(data, std::min<size_t>(bytes, 1024));
    return bytes;
  }
  if (!t.file) {
    if (t.status == 200) t.offset = 0;  // the Range was not honoured: the whole file comes again
    t.file = std::fopen(t.path.c_str(), t.status == 206 ? "ab" : "wb");
    if (!t.file) {
      t.write_failed = true;
      return 0;
    }
  }
  if (std::fwrite(data, 1, bytes, t.file) != bytes) {
    t.write_failed = true;
    return 0;
  }
  return bytes;
}

int OnProgress(void* user, curl_off_t total, curl_off_t now, curl_off_t, curl_off_t) {
  const Transfer& t = *static_cast<const Transfer*>(user);
  if (t.progress && *t.progress && (t.status == 200 || t.status == 206)) {
    (*t.progress)(t.offset + now, total > 0 ? t.offset + total : 0);
  }
  return 0;
}

}  // namespace

Result<HttpReply> HttpGet(const std::string& url, const std::string& token) {
  char error[CURL_ERROR_SIZE] = {};
  CurlHeaders headers;
  CurlHandle h = NewHandle(url, token, &headers, error);
  if (!h) return Status::Error("GET " + url + ": libcurl could not start a request");
  HttpReply reply;
  curl_easy_setopt(h.get(), CURLOPT_WRITEFUNCTION, AppendToString);
  curl_easy_setopt(h.get(), CURLOPT_WRITEDATA, &reply.body);
  curl_easy_setopt(h.get(), CURLOPT_TIMEOUT, 120L);  // an API reply is a few kB
  const CURLcode code = curl_easy_perform(h.get());
  if (code != CURLE_OK)
    return Status::Error(fmt::format("GET {}: {}", url, CurlError(code, error)));
  curl_easy_getinfo(h.get(), CURLINFO_RESPONSE_CODE, &reply.status);
  return reply;
}

Result<DownloadReply> DownloadFile(const std::string& url, const std::string& token,
                                   const std::string& path, const DownloadProgress& progress) {
  char error[CURL_ERROR_SIZE] = {};
  CurlHeaders headers;
  CurlHandle h = NewHandle(url, token, &headers, error);
  if (!h) return Status::Error("GET " + url + ": libcurl could not start a request");
  std::error_code ec;
  const auto held = std::filesystem::exists(path, ec) ? std::filesystem::file_size(path, ec) : 0;
  Transfer t{.handle = h.get(),
             .path = path,
             .offset = static_cast<int64_t>(ec ? 0 : held),
             .progress = &progress};
  // CURLOPT_RANGE rather than RESUME_FROM: libcurl then leaves a 200 reply (a server without
  // ranges) to WriteBody, which starts the file over, instead of failing the transfer.
  const std::string range = fmt::format("{}-", t.offset);
  if (t.offset > 0) curl_easy_setopt(h.get(), CURLOPT_RANGE, range.c_str());
  curl_easy_setopt(h.get(), CURLOPT_WRITEFUNCTION, WriteBody);
  curl_easy_setopt(h.get(), CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(h.get(), CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(h.get(), CURLOPT_XFERINFOFUNCTION, OnProgress);
  curl_easy_setopt(h.get(), CURLOPT_XFERINFODATA, &t);
  const CURLcode code = curl_easy_perform(h.get());
  if (t.file) std::fclose(t.file);
  if (t.write_failed) return Status::Error(fmt::format("cannot write {}", path));
  if (t.status == 0) curl_easy_getinfo(h.get(), CURLINFO_RESPONSE_CODE, &t.status);
  if (code != CURLE_OK)
    return Status::Error(fmt::format("GET {}: {}", url, CurlError(code, error)));
  return DownloadReply{.reply = {.status = t.status, .body = t.error_body},
                       .resumed_from = t.offset};
}

}  // namespace kvq::hub
