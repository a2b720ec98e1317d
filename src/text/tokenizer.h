// The tokenizers of the vocabularies kvq reads, behind one class:
//  - SentencePiece style (Kind::kSentencePiece): a vocabulary of pieces with scores, merged
//    greedily by score (the best-scoring adjacent pair first, leftmost on ties), with byte
//    fallback for text the pieces do not cover. Loaded from a llama2.c tokenizer file (pieces use
//    a plain space; BOS 1, EOS 2, byte pieces at 3..258) or from a GGUF vocabulary with
//    tokenizer.ggml.model "llama" (pieces use U+2581 for a space, stored here as a plain space).
//    Encoding follows llama.cpp's llm_tokenizer_spm, so ids match llama.cpp's for the same text
//    (see Encode for the one deliberate difference, a literal U+2581 in the text).
//  - Byte-level BPE (Kind::kBytePairs, tokenizer.ggml.model "gpt2": GPT-2, Llama 3, Qwen 2,
//    Falcon, StarCoder, DeepSeek ...): the text's bytes are written in GPT-2's byte alphabet (each
//    byte one printable character), split into words by the pre-tokenizer that
//    tokenizer.ggml.pre names (pre_tokenizer.h), and each word is merged pair by pair in the order
//    of tokenizer.ggml.merges (lowest rank first, leftmost on ties), as llama.cpp's
//    llm_tokenizer_bpe and Hugging Face's tokenizers do. Pieces are kept decoded to raw bytes.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvq/status.h"
#include "text/bpe_vocabulary.h"
#include "text/pre_tokenizer.h"

namespace kvq {

class GgufFile;

class Tokenizer {
 public:
  /// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
  enum class TokenType : uint8_t {
    kNormal = 1,
    kUnknown = 2,      ///< decoded to ""; matched literally in the text, as control tokens
    kControl = 3,      ///< BOS, EOS, chat markers: decoded to ""; matched literally in the text
    kUserDefined = 4,  ///< matched literally in the text before anything else (as llama.cpp does)
    kUnused = 5,
    kByte = 6,  ///< "<0xXX>": one raw byte, for text the pieces do not cover
  };

  /// llama2.c format: int32 max_token_length, then per token: f32 score, int32 length, bytes.
  /// Id 0 is the unknown token, BOS 1 and EOS 2 (control tokens), as run.c assumes; at least
  /// these 3 tokens. The byte pieces "<0x00>".."<0xFF>" (ids 3..258 in llama2.c's export, where
  /// run.c assumes them) are recognised by their text wherever they are, and may be missing
  /// altogether: a vocabulary trained on characters only (SentencePiece without byte fallback)
  /// has none; see Encode for what becomes of a character it lacks.
  static Result<Tokenizer> LoadLlama2c(const std::string& path, int32_t vocab_size);
  /// A GGUF vocabulary, by tokenizer.ggml.model (any other model is an error naming the file
  /// and the model). Errors name the file.
  ///  - "llama" (SentencePiece): reads tokenizer.ggml.tokens, .scores, .token_type,
  ///    .bos_token_id, .eos_token_id, .unknown_token_id, .add_bos_token and .add_space_prefix
  ///    (defaults as llama.cpp's for SPM: BOS 1, EOS 2, unknown 0, add BOS, add a space prefix).
  ///  - "gpt2" (byte-level BPE): reads tokenizer.ggml.tokens, .merges (required; rank = index),
  ///    .token_type, .pre, .bos_token_id, .eos_token_id, .unknown_token_id and .add_bos_token
  ///    (defaults as llama.cpp's for BPE: BOS = EOS = 11 if the vocabulary is that large, no
  ///    unknown token, no BOS unless the pre-tokenizer's family adds one, e.g. Llama 3). A missing
  ///    .pre means "default", as in llama.cpp; an unknown one is an error listing the supported
  ///    names (SupportedPreTokenizers()).
  static Result<Tokenizer> LoadGguf(const GgufFile& file);
  /// A byte-level BPE vocabulary (bpe_vocabulary.h), checked as LoadGguf checks a "gpt2" file's;
  /// errors name `source`. The "gpt2" GGUF loader and the tokenizer.json importer both end here.
  static Result<Tokenizer> FromBpeVocabulary(const BpeVocabulary& vocabulary, const std::string& source);
  /// A Hugging Face tokenizer.json (with the tokenizer_config.json beside it, if any): see
  /// ReadHfTokenizerJson (hf_tokenizer_json.h) for what is read and refused. Unlike a GGUF
  /// vocabulary, it applies the file's NFC normalizer.
  static Result<Tokenizer> LoadHfTokenizerJson(const std::string& path);

  enum class Kind : uint8_t { kSentencePiece, kBytePairs };
  Kind kind() const { return kind_; }
  /// The pre-tokenizer of a byte-level BPE vocabulary (kDefault for SentencePiece, unused there).
  PreTokenizer pre_tokenizer() const { return pre_; }

  int32_t vocab_size() const { return static_cast<int32_t>(pieces_.size()); }
  int32_t bos() const { return bos_; }  ///< -1 when the vocabulary has none
  int32_t eos() const { return eos_; }  ///< -1 when the vocabulary has none
  int32_t unk() const { return unk_; }  ///< -1 when the vocabulary has none
  /// Whether the vocabulary asks for BOS in front of a prompt (tokenizer.ggml.add_bos_token).
  bool add_bos() const { return add_bos_; }
  /// Whether Encode puts byte-level BPE text in Unicode NFC before splitting it (only a
  /// vocabulary imported from a tokenizer.json whose normalizer is NFC: see BpeVocabulary::nfc).
  bool normalizes_nfc() const { return nfc_; }
  /// Whether Encode puts a space in front of the text (tokenizer.ggml.add_space_prefix).
  bool add_space_prefix() const { return add_space_prefix_; }
  TokenType type(int32_t id) const { return info_[id].type; }
  /// SentencePiece: whether every one of the 256 bytes has a byte piece "<0xXX>" (llama2.c's
  /// export and llama.cpp's SPM vocabularies do; a character-level vocabulary has none). False for
  /// byte-level BPE, whose pieces spell bytes in GPT-2's byte alphabet instead.
  bool has_byte_pieces() const { return has_byte_pieces_; }
  /// What the file was loaded from (named in notices).
  const std::string& source() const { return source_; }

  /// Characters (SentencePiece) that Encode has turned into the unknown token so far, over this
  /// tokenizer's life (a copy starts from the count at the time of the copy).
  int64_t unknown_characters() const { return unknown_characters_.n.load(std::memory_order_relaxed); }
  /// Where the one-time notice about the first such character goes; by default kvq/log.h's Log
  /// (a line on stderr unless the application installed a log callback).
  /// The sink is called at most once per tokenizer, from Encode (so from Encode's thread).
  void set_notice_sink(std::function<void(std::string_view)> sink) { notice_ = std::move(sink); }

  /// Token ids for `text`: optionally BOS first (when the vocabulary has one); then the text.
  ///
  /// Byte-level BPE, as llama.cpp with special tokens parsed: control, user-defined and unknown
  /// tokens (literal_tokens()) are cut out of the text first (longest first) and become their
  /// ids; each remaining stretch is pre-tokenized into words, each word's bytes become symbols in
  /// GPT-2's byte alphabet, and adjacent symbols are merged lowest merge rank first (leftmost on
  /// ties) until no pair is a merge (with ignore_merges, a word that is itself a token is taken
  /// whole). A final symbol that is no token becomes the tokens of its bytes; a byte the vocabulary
  /// has no token for is dropped, as llama.cpp drops it (GPT-2's vocabulary has all 256; Falcon's
  /// lacks 28 bytes, e.g. 0x0B and 0xC0, StarCoder's 14). Invalid UTF-8 is pre-tokenized as U+FFFD
  /// per bad byte (pre_tokenizer.h) but keeps its bytes (llama.cpp replaces them by U+FFFD's three
  /// bytes), so Detokenize(Encode(s)) == s for any bytes s that hold no literal_tokens() token's
  /// text and no byte the vocabulary lacks. With normalizes_nfc(), each stretch between literals is
  /// put in NFC (nfc.h) before it is split, so Detokenize(Encode(s)) is then NFC(s).
  ///
  /// SentencePiece, as llama.cpp with special tokens parsed: control, user-defined and unknown
  /// pieces (literal_tokens()) are cut out of the text first, e.g. Mistral's "[INST]" or Llama 2's
  /// "<s>"; each remaining stretch at the start or after such a piece gets a leading space (if
  /// add_space_prefix()), is split into UTF-8 characters (a lead byte and as many bytes as it
  /// announces, whatever they are), and adjacent
  /// symbols are merged best score first (leftmost on ties); a symbol that is no piece becomes
  /// its byte pieces (run.c's byte fallback). Control, unknown and byte tokens are never merged
  /// into. Unlike llama.cpp, a literal U+2581 in the text is text, not a space (it becomes byte
  /// pieces), so every input round-trips through Detokenize.
  /// A symbol that is no piece and has a byte without a byte piece (nor a one-byte piece, as
  /// llama.cpp falls back to) becomes one unknown token (none if the vocabulary has no unknown
  /// token), counted in unknown_characters(); the first one is reported once through the notice
  /// sink, naming the character. (run.c would emit byte + 3 for each of its bytes, ids that in
  /// such a vocabulary are arbitrary pieces.)
  std::vector<int32_t> Encode(std::string_view text, bool add_bos) const;
  /// The text of `token` as it follows `previous` (SentencePiece: the space Encode added after
  /// BOS is dropped; byte pieces become their byte; control and unknown tokens become "").
  /// Byte-level BPE pieces are bytes, so a token may hold part of a UTF-8 character.
  std::string Decode(int32_t previous, int32_t token) const;
  /// The text of a whole sequence: Decode of each id, the first as if it followed BOS (so the
  /// space Encode put in front is dropped, with or without a leading BOS).
  /// Detokenize(Encode(s, b)) == s for any bytes s without the text of a literal_tokens() token
  /// in them (and, for byte-level BPE, without bytes the vocabulary lacks: see Encode). For
  /// SentencePiece this needs a piece that a lone space can become (llama's 29871): in a
  /// vocabulary without one, the space put in front becomes the byte piece <0x20>, which Decode
  /// keeps, so the text comes back with a space in front (found by fuzz/llama2c_fuzzer.cc).
  std::string Detokenize(std::span<const int32_t> ids) const;
  /// The vocabulary's piece (SentencePiece: U+2581 shown as a plain space; byte pieces as
  /// "<0xXX>"; byte-level BPE: normal pieces decoded from GPT-2's byte alphabet to their bytes;
  /// control and user-defined pieces as stored, e.g. "<|endoftext|>").
  const std::string& piece(int32_t id) const { return pieces_[id]; }
  /// Whether generation should stop at `id`: EOS, or a control token whose text llama.cpp treats
  /// as an end of turn ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|endoftext|>", "<end_of_turn>",
  /// "<|end_of_text|>", "<|eom_id|>", ...; the list is kEndOfTurnTexts in tokenizer.cc). For a
  /// llama2.c vocabulary BOS too (its models start a new story with it; run.c stops there).
  bool IsEndOfGeneration(int32_t id) const;
  /// The tokens Encode cuts out of the text as themselves, longest text first: every control,
  /// user-defined and unknown token with a non-empty text (llama.cpp's special-token cache).
  std::span<const int32_t> literal_tokens() const { return literals_; }

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

  /// A stretch of text between literals, or a literal cut out of it (token >= 0).
  struct Fragment {
    std::string_view text;
    int32_t token;
  };

  /// A small copyable counter (std::atomic is neither copyable nor movable; Tokenizer is both).
  struct Counter {
    std::atomic<int64_t> n{0};
    Counter() = default;
    Counter(const Counter& o) : n(o.n.load(std::memory_order_relaxed)) {}
    Counter& operator=(const Counter& o) {
      n.store(o.n.load(std::memory_order_relaxed), std::memory_order_relaxed);
      return *this;
    }
  };

  /// The one parser of byte pieces: the byte of "<0xXX>" (hex digits in either case), or -1.
  static int BytePieceValue(std::string_view piece);
  /// The TokenInfo (type and byte) of a GGUF tokenizer.ggml.token_type value for token `id` with
  /// text `text`; an error says what is wrong, without the file (the caller names it).
  static Result<TokenInfo> GgufTokenInfo(int32_t type, std::string_view text, size_t id);
  /// tokenizer.ggml.token_type for n tokens (all normal when the key is absent); an error names
  /// the file.
  static Result<std::vector<int32_t>> GgufTokenTypes(const GgufFile& file, size_t n);
  /// The "gpt2" half of LoadGguf (tokenizer_bpe.cc).
  static Result<Tokenizer> LoadGgufBpe(const GgufFile& file);
  /// Builds ids_, byte_ids_ and literals_ from pieces_ and info_ (SentencePiece).
  void Index();
  /// Builds bpe_ids_, byte_ids_ and literals_ from bpe_text_, pieces_ and info_ (byte-level BPE).
  void IndexBpe();
  /// Builds literals_ from pieces_ and info_ (both kinds, one rule).
  void IndexLiterals();
  /// Fills end_of_generation_ (both kinds).
  void FindEndOfGeneration();
  /// `text` cut at every occurrence of a literals_ piece, longest pieces first.
  std::vector<Fragment> CutLiterals(std::string_view text) const;
  std::vector<int32_t> EncodeBpe(std::string_view text, bool add_bos) const;
  /// Appends the tokens of one pre-tokenized word.
  void EncodeBpeWord(std::string_view word, std::vector<int32_t>& out) const;
  /// Appends the tokens of one stretch of text (space prefix already applied).
  void EncodeStretch(std::string_view text, std::vector<int32_t>& out) const;
  /// The text of `token`; `strip_space` drops one leading space of a piece.
  std::string Text(int32_t token, bool strip_space) const;
  /// Counts a character Encode made the unknown token; the first one goes to the notice sink.
  void NoteUnknown(std::string_view character) const;

  std::vector<std::string> pieces_;
  std::vector<TokenInfo> info_;
  /// Pieces that merges may produce (normal, user-defined, unused), by text; first id wins.
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ids_;
  std::array<int32_t, 256> byte_ids_{};  // the token of one raw byte; -1 where there is none
  /// Pieces cut out of the text before anything else, longest text first: control, user-defined
  /// and unknown tokens (IndexLiterals).
  std::vector<int32_t> literals_;
  std::vector<int32_t> end_of_generation_;  // sorted
  int32_t bos_ = 1, eos_ = 2, unk_ = 0;
  bool add_bos_ = true;
  bool add_space_prefix_ = true;
  bool has_byte_pieces_ = false;  // all 256 bytes have a kByte token (set by Index/IndexBpe)
  std::string source_;
  mutable Counter unknown_characters_;
  std::function<void(std::string_view)> notice_;  // empty: Log(kWarning)

  Kind kind_ = Kind::kSentencePiece;
  // Byte-level BPE only:
  PreTokenizer pre_ = PreTokenizer::kDefault;
  bool ignore_merges_ = false;
  bool nfc_ = false;  // NFC before splitting (BpeVocabulary::nfc)
  std::vector<std::string> bpe_text_;  // [vocab_size] the token as stored (GPT-2 byte alphabet)
  /// Stored text -> id, every token type (as llama.cpp's text_to_token); first id wins.
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> bpe_ids_;
  /// A merge as stored ("left right", both in the byte alphabet) -> rank (index in .merges).
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> merge_ranks_;
};

}  // namespace kvq
