// kvq serve's chat page (see chat_page.h): the embedded web/chat/ files by URL.
#include "server/chat_page.h"

#include <httplib.h>

#include <string>

namespace kvq::server {
namespace {

constexpr std::string_view kPrefix = "/chat/";

// The page's file types; a file of another type in web/chat/ is not served (it would need one here).
struct MimeEntry {
  std::string_view extension;
  const char* mime;
};
constexpr MimeEntry kMimeTypes[] = {
    {".html", "text/html; charset=utf-8"},
    {".js", "text/javascript; charset=utf-8"},
    {".css", "text/css; charset=utf-8"},
    {".svg", "image/svg+xml"},
};

const char* MimeOf(std::string_view name) {
  for (const MimeEntry& m : kMimeTypes) {
    if (name.ends_with(m.extension)) return m.mime;
  }
  return nullptr;
}

}  // namespace

bool ServeChatPage(const httplib::Request& req, httplib::Response& res) {
  if (req.method != "GET" && req.method != "HEAD") return false;
  if (req.path == "/" || req.path == "/chat") {
    res.set_redirect(std::string(kPrefix));
    return true;
  }
  if (!req.path.starts_with(kPrefix)) return false;
  std::string_view name = std::string_view(req.path).substr(kPrefix.size());
  if (name.empty()) name = "index.html";
  for (const EmbeddedFile& f : ChatPageFiles()) {
    const char* mime = MimeOf(f.name);
    if (f.name != name || mime == nullptr) continue;
    // The page changes with the program: a browser asks again rather than keep an old copy.
    res.set_header("Cache-Control", "no-cache");
    res.set_content(std::string(f.bytes), mime);
    return true;
  }
  return false;
}

}  // namespace kvq::server
