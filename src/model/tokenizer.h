// SentencePiece-style tokenizer: a vocabulary of pieces with scores, merged greedily by score
// (the best-scoring adjacent pair first, leftmost on ties), with byte fallback for text the
// pieces do not cover. Loaded from a llama2.c tokenizer file (pieces use a plain space); the GGUF
// `llama` vocabulary (pieces use U+2581 for a space) loads into the same class.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvq/status.h"

namespace kvq {

class Tokenizer {
 public:
  /// llama2.c format: int32 max_token_length, then per token: f32 score, int32 length, bytes.
  /// Byte pieces "<0x00>".."<0xFF>" are ids 3..258, BOS 1, EOS 2, as run.c assumes.
  static Result<Tokenizer> LoadLlama2c(const std::string& path, int32_t vocab_size);

  int32_t vocab_size() const { return static_cast<int32_t>(pieces_.size()); }
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }

  /// Token ids for `text`: optionally BOS first; a leading space is added to non-empty text (as
  /// SentencePiece's add_dummy_prefix and run.c do).
  std::vector<int32_t> Encode(std::string_view text, bool add_bos) const;
  /// The text of `token` as it follows `previous` (the space after BOS is dropped; byte pieces
  /// become their byte).
  std::string Decode(int32_t previous, int32_t token) const;
  const std::string& piece(int32_t id) const { return pieces_[id]; }

 private:
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int32_t> ids_;
  int32_t bos_ = 1, eos_ = 2;
  int32_t byte_base_ = 3;  // id of "<0x00>"
};

}  // namespace kvq
