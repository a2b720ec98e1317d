#include "hub/repo_ref.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <regex>

namespace kvq::hub {
namespace {

std::string Upper(std::string_view s) {
  std::string u(s);
  for (char& c : u) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return u;
}

bool EndsWithGguf(std::string_view path) {
  return path.size() > 5 && Upper(path.substr(path.size() - 5)) == ".GGUF";
}

std::string_view BaseName(std::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// The hub's rule for one side of "user/name": its characters, no "--" or "..", not starting or
// ending with '-' or '.'.
bool ValidName(std::string_view s) {
  if (s.empty() || s.size() > 96) return false;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.')
      return false;
  }
  const auto edge = [](char c) { return c == '-' || c == '.'; };
  return !edge(s.front()) && !edge(s.back()) && s.find("--") == std::string_view::npos &&
         s.find("..") == std::string_view::npos;
}

}  // namespace

std::string RepoRef::Text() const { return quant.empty() ? repo : repo + ":" + quant; }

Result<RepoRef> ParseRepoRef(std::string_view text) {
  const auto bad = [&](const std::string& why) {
    return Status::Error(
        fmt::format("'{}' is not a model repository: {} (expected user/name or "
                    "user/name:quant, e.g. Qwen/Qwen3-0.6B-GGUF:Q8_0)",
                    text, why));
  };
  RepoRef ref;
  std::string_view repo = text;
  if (const size_t colon = text.find(':'); colon != std::string_view::npos) {
    repo = text.substr(0, colon);
    ref.quant = std::string(text.substr(colon + 1));
    if (ref.quant.empty()) return bad("the quant after ':' is empty");
    for (char c : ref.quant) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') {
        return bad(fmt::format(
            "the quant '{}' has a character other than letters, digits, '_', '-', '.'", ref.quant));
      }
    }
  }
  const size_t slash = repo.find('/');
  if (slash == std::string_view::npos || repo.find('/', slash + 1) != std::string_view::npos) {
    return bad("it needs exactly one '/'");
  }
  if (!ValidName(repo.substr(0, slash)) || !ValidName(repo.substr(slash + 1))) {
    return bad(
        "names are 1-96 letters, digits, '-', '_' or '.', without '--' or '..' and not "
        "starting or ending with '-' or '.'");
  }
  ref.repo = std::string(repo);
  return ref;
}

std::string QuantTag(std::string_view path) {
  std::string_view stem = BaseName(path);
  if (EndsWithGguf(stem)) stem.remove_suffix(5);
  const size_t cut = stem.find_last_of("-.");
  return std::string(cut == std::string_view::npos ? stem : stem.substr(cut + 1));
}

bool IsPickableGguf(std::string_view path) {
  if (!EndsWithGguf(path)) return false;
  const std::string base = Upper(BaseName(path));
  static const std::regex split(R"(-\d{5}-OF-\d{5}\.GGUF$)");
  return base.find("MMPROJ") == std::string::npos && !std::regex_search(base, split);
}

Result<std::string> PickGguf(const RepoRef& ref, const std::vector<std::string>& paths) {
  std::vector<std::string> ggufs;
  for (const std::string& p : paths) {
    if (IsPickableGguf(p)) ggufs.push_back(p);
  }
  std::sort(ggufs.begin(), ggufs.end());
  const auto with_tag = [&](auto match) -> const std::string* {
    for (const std::string& p : ggufs) {
      if (match(Upper(QuantTag(p)))) return &p;
    }
    return nullptr;
  };
  const std::string* picked = nullptr;
  if (!ref.quant.empty()) {
    const std::string want = Upper(ref.quant);
    picked = with_tag([&](const std::string& tag) { return tag == want; });
  } else {
    picked = with_tag([](const std::string& tag) { return tag == "Q4_K_M"; });
    if (!picked) picked = with_tag([](const std::string& tag) { return tag.rfind("Q4", 0) == 0; });
    if (!picked && !ggufs.empty()) picked = &ggufs.front();
  }
  if (picked) return *picked;
  if (ggufs.empty()) {
    const bool split = std::any_of(paths.begin(), paths.end(),
                                   [](const std::string& p) { return EndsWithGguf(p); });
    return Status::Error(fmt::format(
        "{} has no single-file GGUF model{}", ref.repo,
        split ? " (only split files or mmproj projectors, which kvq does not read)" : ""));
  }
  std::vector<std::string> tags;
  for (const std::string& p : ggufs) {
    if (std::find(tags.begin(), tags.end(), QuantTag(p)) == tags.end()) tags.push_back(QuantTag(p));
  }
  return Status::Error(fmt::format("{} has no GGUF with quant '{}' (available: {})", ref.repo,
                                   ref.quant, fmt::join(tags, ", ")));
}

}  // namespace kvq::hub
