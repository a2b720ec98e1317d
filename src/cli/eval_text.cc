// The evaluation text helpers (see eval_text.h).
#include "cli/eval_text.h"

#include <fmt/core.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#ifndef KVQ_MODELS_DIR
#define KVQ_MODELS_DIR "models"
#endif

namespace kvq::cli {

std::string BundledEvalText() {
  const std::filesystem::path rel = "data/eval/tinystories-eval.txt";
  const std::filesystem::path beside = std::filesystem::path(KVQ_MODELS_DIR).parent_path() / rel;
  return std::filesystem::exists(beside) ? beside.string() : rel.string();
}

std::string DisplayPath(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path rel =
      std::filesystem::path(path).lexically_proximate(std::filesystem::current_path(ec));
  if (ec || rel.empty() || *rel.begin() == "..") return path;
  return rel.string();
}

namespace {

// What a path that is not a regular file is, for an error message.
const char* FileTypeName(std::filesystem::file_type type) {
  switch (type) {
    case std::filesystem::file_type::directory: return "a directory";
    case std::filesystem::file_type::character: return "a character device";
    case std::filesystem::file_type::block: return "a block device";
    case std::filesystem::file_type::fifo: return "a pipe";
    case std::filesystem::file_type::socket: return "a socket";
    default: return "unreadable";
  }
}

}  // namespace

Result<std::string> ReadEvalText(const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_type type = std::filesystem::status(path, ec).type();
  if (type == std::filesystem::file_type::not_found) {
    return Status::Error(fmt::format("-f {}: no such text file (expected a UTF-8 text file to evaluate on)", path));
  }
  if (type != std::filesystem::file_type::regular) {
    // A device (/dev/null), a directory or a pipe: not read, so a stream cannot pass for a text.
    return Status::Error(fmt::format("-f {}: not a regular file ({}; expected a UTF-8 text file to evaluate on)",
                                     path, FileTypeName(type)));
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) return Status::Error(fmt::format("-f {}: cannot read the file", path));
  if (text.str().empty()) {
    return Status::Error(fmt::format("-f {}: the file is empty (expected text to evaluate on)", path));
  }
  return text.str();
}

}  // namespace kvq::cli
