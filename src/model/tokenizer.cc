// Tokenizer (see tokenizer.h). Encode follows run.c's algorithm: split the text into UTF-8
// characters (each one piece, or its bytes as byte pieces), then repeatedly merge the adjacent
// pair whose concatenation is a piece with the highest score.
#include "model/tokenizer.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <memory>

namespace kvq {

Result<Tokenizer> Tokenizer::LoadLlama2c(const std::string& path, int32_t vocab_size) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) return Status::Error(fmt::format("cannot open tokenizer {}: {}", path, std::strerror(errno)));
  const auto bad = [&](const std::string& why) {
    return Status::Error(fmt::format("{} is not a llama2.c tokenizer for a {}-token vocabulary: {}", path,
                                     vocab_size, why));
  };
  int32_t max_len = 0;
  if (std::fread(&max_len, 4, 1, f.get()) != 1) return bad("no header");
  if (max_len <= 0 || max_len > 4096) return bad(fmt::format("max token length {} is implausible", max_len));
  Tokenizer t;
  for (int32_t i = 0; i < vocab_size; ++i) {
    float score = 0;
    int32_t len = 0;
    if (std::fread(&score, 4, 1, f.get()) != 1 || std::fread(&len, 4, 1, f.get()) != 1) {
      return bad(fmt::format("it ends at token {}", i));
    }
    if (len < 0 || len > max_len) return bad(fmt::format("token {} has length {}", i, len));
    std::string piece(len, '\0');
    if (len > 0 && std::fread(piece.data(), 1, len, f.get()) != static_cast<size_t>(len)) {
      return bad(fmt::format("it ends inside token {}", i));
    }
    t.ids_.emplace(piece, i);  // the first id wins for duplicate pieces
    t.pieces_.push_back(std::move(piece));
    t.scores_.push_back(score);
  }
  if (std::fgetc(f.get()) != EOF) return bad("there are bytes after the last token");
  if (vocab_size < t.byte_base_ + 256) return bad("the vocabulary is too small to hold the 256 byte pieces");
  return t;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_bos) const {
  std::vector<int32_t> tokens;
  if (add_bos) tokens.push_back(bos_);
  if (text.empty()) return tokens;
  std::vector<int32_t> ids;
  const std::string with_prefix = " " + std::string(text);
  for (size_t i = 0; i < with_prefix.size();) {
    // One UTF-8 character: a lead byte and its continuation bytes (at most 4 in all).
    size_t n = 1;
    while (i + n < with_prefix.size() && n < 4 && (static_cast<uint8_t>(with_prefix[i + n]) & 0xC0) == 0x80) ++n;
    const auto it = ids_.find(with_prefix.substr(i, n));
    if (it != ids_.end()) {
      ids.push_back(it->second);
    } else {
      for (size_t k = 0; k < n; ++k) ids.push_back(byte_base_ + static_cast<uint8_t>(with_prefix[i + k]));
    }
    i += n;
  }
  for (;;) {
    float best_score = -1e10f;
    int32_t best_id = -1;
    size_t best_at = 0;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      const auto it = ids_.find(pieces_[ids[i]] + pieces_[ids[i + 1]]);
      if (it != ids_.end() && scores_[it->second] > best_score) {
        best_score = scores_[it->second];
        best_id = it->second;
        best_at = i;
      }
    }
    if (best_id < 0) break;
    ids[best_at] = best_id;
    ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(best_at) + 1);
  }
  tokens.insert(tokens.end(), ids.begin(), ids.end());
  return tokens;
}

std::string Tokenizer::Decode(int32_t previous, int32_t token) const {
  if (token < 0 || token >= vocab_size()) return "";
  std::string_view piece = pieces_[token];
  if (previous == bos_ && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
  unsigned int byte = 0;
  if (piece.size() == 6 && std::sscanf(std::string(piece).c_str(), "<0x%02X>", &byte) == 1) {
    return std::string(1, static_cast<char>(byte));
  }
  return std::string(piece);
}

}  // namespace kvq
