// What `-hf user/repo[:quant]` names, and which GGUF file of a repository it picks. The rule is
// llama.cpp's -hf: the file whose quant tag equals the one asked for (case-insensitive), or with
// none asked Q4_K_M, else the first Q4 quant, else the first GGUF. Split files (-00001-of-00003)
// and multimodal projectors (mmproj) are never picked: kvq reads one self-contained GGUF.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kvq/status.h"

namespace kvq::hub {

/// A model repository on the hub and, optionally, the quant wanted from it.
struct RepoRef {
  std::string repo;   // "user/name"
  std::string quant;  // "Q8_0" as typed; empty: the default choice
  /// "user/name" or "user/name:quant", as the user would type it.
  std::string Text() const;
};

/// "user/name[:quant]" with the hub's name rules (letters, digits, '-', '_', '.'; no "--" or
/// ".."; at most 96 characters each side); the error quotes the text and says what is expected.
Result<RepoRef> ParseRepoRef(std::string_view text);

/// The quant tag of a GGUF file name: the last '-' or '.' separated part of its stem
/// ("Llama-3.2-1B-Instruct-Q4_K_M.gguf" -> "Q4_K_M", "llama-2-7b.Q8_0.gguf" -> "Q8_0").
std::string QuantTag(std::string_view path);

/// True for a ".gguf" path kvq can pick: not one part of a split model, not an mmproj file.
bool IsPickableGguf(std::string_view path);

/// The file `ref` picks among a repository's `paths` (any files: the others are skipped), by the
/// rule at the top of this file. The error names the repository and the quant and lists the
/// quants it has.
Result<std::string> PickGguf(const RepoRef& ref, const std::vector<std::string>& paths);

}  // namespace kvq::hub
