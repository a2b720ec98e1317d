// SentencePiece-style tokenizer: a vocabulary of pieces with scores, merged greedily by score
// (the best-scoring adjacent pair first, leftmost on ties), with byte fallback for text the
// pieces do not cover. Two loaders fill the same representation:
//  - a llama2.c tokenizer file (pieces use a plain space; BOS 1, EOS 2, byte pieces at 3..258);
//  - a GGUF vocabulary with tokenizer.ggml.model "llama" (pieces use U+2581 for a space, which is
//    stored as a plain space; token types, special ids and flags come from the metadata).
// Encoding follows llama.cpp's SPM tokenizer (llm_tokenizer_spm), so ids match llama.cpp's for
// the same text: see Encode for the one deliberate difference (a literal U+2581 in the text).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvq/status.h"

namespace kvq {

class GgufFile;

class Tokenizer {
 public:
  /// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
  enum class TokenType : uint8_t {
    kNormal = 1,
    kUnknown = 2,
    kControl = 3,      ///< BOS, EOS, chat markers: never produced from text, decoded to ""
    kUserDefined = 4,  ///< matched literally in the text before anything else (as llama.cpp does)
    kUnused = 5,
    kByte = 6,  ///< "<0xXX>": one raw byte, for text the pieces do not cover
  };

  /// llama2.c format: int32 max_token_length, then per token: f32 score, int32 length, bytes.
  /// Byte pieces "<0x00>".."<0xFF>" are ids 3..258, BOS 1, EOS 2, as run.c assumes (id 0 is the
  /// unknown token, 1 and 2 are control tokens).
  static Result<Tokenizer> LoadLlama2c(const std::string& path, int32_t vocab_size);
  /// A GGUF vocabulary: tokenizer.ggml.model must be "llama" (SentencePiece); reads
  /// tokenizer.ggml.tokens, .scores, .token_type, .bos_token_id, .eos_token_id,
  /// .unknown_token_id, .add_bos_token and .add_space_prefix (defaults as llama.cpp's for SPM:
  /// BOS 1, EOS 2, unknown 0, add BOS, add a space prefix). Errors name the file.
  static Result<Tokenizer> LoadGguf(const GgufFile& file);

  int32_t vocab_size() const { return static_cast<int32_t>(pieces_.size()); }
  int32_t bos() const { return bos_; }  ///< -1 when the vocabulary has none
  int32_t eos() const { return eos_; }  ///< -1 when the vocabulary has none
  int32_t unk() const { return unk_; }  ///< -1 when the vocabulary has none
  /// Whether the vocabulary asks for BOS in front of a prompt (tokenizer.ggml.add_bos_token).
  bool add_bos() const { return add_bos_; }
  /// Whether Encode puts a space in front of the text (tokenizer.ggml.add_space_prefix).
  bool add_space_prefix() const { return add_space_prefix_; }
  TokenType type(int32_t id) const { return info_[id].type; }

  /// Token ids for `text`: optionally BOS first (when the vocabulary has one); then, as
  /// llama.cpp: user-defined pieces are cut out of the text first; each remaining stretch at the
  /// start or after such a piece gets a leading space (if add_space_prefix()), is split into UTF-8
  /// characters (a lead byte and as many bytes as it announces, whatever they are), and adjacent
  /// symbols are merged best score first (leftmost on ties); a symbol that is no piece becomes
  /// its byte pieces. Control, unknown and byte tokens are never merged into. Unlike llama.cpp, a
  /// literal U+2581 in the text is text, not a space (it becomes byte pieces), so every input
  /// round-trips through Detokenize.
  std::vector<int32_t> Encode(std::string_view text, bool add_bos) const;
  /// The text of `token` as it follows `previous` (the space Encode added after BOS is dropped;
  /// byte pieces become their byte; control and unknown tokens become "").
  std::string Decode(int32_t previous, int32_t token) const;
  /// The text of a whole sequence: Decode of each id, the first as if it followed BOS (so the
  /// space Encode put in front is dropped, with or without a leading BOS).
  /// Detokenize(Encode(s, b)) == s for any bytes s without a user-defined piece in them.
  std::string Detokenize(std::span<const int32_t> ids) const;
  /// The vocabulary's piece (U+2581 shown as a plain space; byte pieces as "<0xXX>").
  const std::string& piece(int32_t id) const { return pieces_[id]; }

 private:
  struct TokenInfo {
    float score = 0;
    TokenType type = TokenType::kNormal;
    uint8_t byte = 0;        // the byte of a kByte token
    bool matchable = true;   // false: never produced by a merge (see LoadGguf)
  };
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  /// Builds ids_, byte_ids_ and user_defined_ from pieces_ and info_.
  void Index();
  /// Appends the tokens of one stretch of text (space prefix already applied).
  void EncodeStretch(std::string_view text, std::vector<int32_t>& out) const;
  /// The text of `token`; `strip_space` drops one leading space of a piece.
  std::string Text(int32_t token, bool strip_space) const;

  std::vector<std::string> pieces_;
  std::vector<TokenInfo> info_;
  /// Pieces that merges may produce (normal, user-defined, unused), by text; first id wins.
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ids_;
  std::array<int32_t, 256> byte_ids_{};  // -1 where the vocabulary lacks the byte piece
  std::vector<int32_t> user_defined_;    // longest text first
  int32_t bos_ = 1, eos_ = 2, unk_ = 0;
  bool add_bos_ = true;
  bool add_space_prefix_ = true;
};

}  // namespace kvq
