// kvq serve's chat page: web/chat/ compiled into the program (cmake/embed_files.cmake writes
// ChatPageFiles), so every build serves it, the release build too, which has no web bundle. It is
// a client of the server's own /v1/chat/completions, /props and /slots; the web bundle (--web), when
// there is one, is served beside it and holds the in-tab runtime.
#pragma once

#include <span>
#include <string_view>

namespace httplib {
struct Request;
struct Response;
}

namespace kvq::server {

/// One file of web/chat/, by its name in that folder ("index.html").
struct EmbeddedFile {
  std::string_view name;
  std::string_view bytes;
};

/// Every file of web/chat/ (generated at build time).
std::span<const EmbeddedFile> ChatPageFiles();

/// Answers a GET or HEAD of the page: "/" and "/chat" redirect (302) to "/chat/", which is
/// index.html; "/chat/NAME" is that file, with its MIME type. False, touching nothing, for any
/// other request (a name web/chat/ lacks included, so the web bundle's own files still answer).
bool ServeChatPage(const httplib::Request& req, httplib::Response& res);

}  // namespace kvq::server
