// Pre-tokenizers of byte-level BPE vocabularies: the regex splits (tokenizer.json's "Split"
// pre-tokenizers, listed per tokenizer.ggml.pre in llama.cpp's llama-vocab.cpp) that cut text into
// the words BPE merges stay inside. Each regex is implemented by hand over code points with the
// regex's own semantics (leftmost-first alternation, greedy quantifiers with backtracking, \s =
// White_Space, \p{X} = general category X) -- std::regex has no \p{L}. Several regexes apply in
// sequence: each one splits every piece the previous ones produced, and text a regex does not
// match stays a piece of its own (as llama.cpp's unicode_regex_split does).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvq {

enum class PreTokenizer : uint8_t {
  /// llama.cpp's fallback for "default" or a missing tokenizer.ggml.pre:
  /// [\p{P}\$\+<=>\^~\|]+ ; then GPT-2's regex ; then \p{N}+ ; then [0-9][0-9][0-9].
  kDefault,
  /// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kGpt2,
  /// Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
  ///   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+   (case-insensitive for ASCII only)
  kLlama3,
  /// Qwen 2: Llama 3's regex with \p{N} (one digit per piece) instead of \p{N}{1,3}.
  kQwen2,
  /// [\p{P}\$\+<=>\^~\|`]+ ; then GPT-2's regex ; then [0-9][0-9][0-9].
  kFalcon,
  /// \p{N} ; then GPT-2's regex.
  kStarcoder,
  /// [\r\n] ; \s?[cased letters of Latin, Greek, Cyrillic, ...]+ ; \s?[!-/:-~ fullwidth ASCII,
  /// U+2018..U+201F, U+3000..U+3002]+ ; \s+$ ; [U+4E00-U+9FA5 U+0800-U+4E00 U+AC00-U+D7FF]+ ;
  /// \p{N}+.
  kDeepseekLlm,
  /// Mistral's Tekken (Mistral Nemo): [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*
  ///   [\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+
  ///   [\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kTekken,
};

/// What a tokenizer.ggml.pre value means, as llama.cpp reads it.
struct PreTokenizerSpec {
  PreTokenizer kind;
  /// A pre-tokenized word that is itself a token becomes that token without merges
  /// (tokenizer.json's ignore_merges; llama.cpp sets it for the Llama 3 family).
  bool ignore_merges = false;
  /// Whether BOS goes in front of a prompt when tokenizer.ggml.add_bos_token is absent.
  bool add_bos = false;
};

/// The spec for a tokenizer.ggml.pre value ("gpt-2", "llama-bpe", "qwen2", ...; the names
/// llama.cpp maps to the regexes above), or nullopt for a name kvq does not support.
std::optional<PreTokenizerSpec> FindPreTokenizer(std::string_view ggml_pre);
/// Every supported tokenizer.ggml.pre value, comma-separated (for error messages).
std::string SupportedPreTokenizers();
/// The canonical name: "default", "gpt-2", "llama-bpe", "qwen2", "falcon", "starcoder",
/// "deepseek-llm", "tekken".
const char* PreTokenizerName(PreTokenizer kind);

/// Splits `text` into words: non-empty views into `text` that cover it in order. Text that is not
/// valid UTF-8 is split as if each invalid byte were U+FFFD (unicode.h), but the views keep the
/// original bytes, so the words always concatenate back to `text`.
std::vector<std::string_view> PreTokenize(PreTokenizer kind, std::string_view text);

}  // namespace kvq
