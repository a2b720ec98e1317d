// A byte-level BPE vocabulary as GGUF's tokenizer.ggml.* keys hold it: the one form kvq builds its
// BPE Tokenizer from (Tokenizer::FromBpeVocabulary), whether it came from a GGUF file or from a
// Hugging Face tokenizer.json (hf_tokenizer_json.h), and the form `kvq synth --vocab` writes into a
// GGUF file (WriteBpeVocabularyGguf), so both paths give one tokenizer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvq/status.h"

namespace kvq {

class GgufWriter;

struct BpeVocabulary {
  /// [n] tokenizer.ggml.tokens: normal tokens in GPT-2's byte alphabet ("Ġthe"), control and
  /// user-defined tokens as plain text ("<|im_end|>").
  std::vector<std::string> tokens;
  /// [n] tokenizer.ggml.token_type: llama_token_type values (Tokenizer::TokenType).
  std::vector<int32_t> token_types;
  /// tokenizer.ggml.merges: "left right" in the byte alphabet; rank = index.
  std::vector<std::string> merges;
  /// tokenizer.ggml.pre: a name FindPreTokenizer knows ("llama-bpe", "qwen2", ...).
  std::string pre = "default";
  int32_t bos = -1;  ///< -1: none
  int32_t eos = -1;  ///< -1: none
  int32_t unk = -1;  ///< -1: none
  int32_t pad = -1;  ///< -1: none (tokenizer.ggml.padding_token_id; kvq does not use it)
  /// tokenizer.ggml.add_bos_token; nullopt: the pre-tokenizer family's default.
  std::optional<bool> add_bos;
  /// tokenizer.chat_template; empty: none.
  std::string chat_template;
  /// Whether text is put in Unicode NFC before it is split (tokenizer.json's normalizer "NFC").
  /// GGUF has no key for it and llama.cpp never normalises byte-level BPE text, so this is not
  /// written to GGUF: only a Tokenizer built straight from tokenizer.json applies it.
  bool nfc = false;
};

/// Writes `v` as tokenizer.ggml.* keys the way llama.cpp's convert_hf_to_gguf.py does
/// (model "gpt2", pre, tokens, token_type, merges, bos/eos/unknown ids, add_bos_token,
/// chat_template), padded to `vocab_size` tokens (>= v.tokens.size()) with "[PAD<id>]" tokens of
/// type UNUSED, as the converter pads to the model's vocabulary size.
Status WriteBpeVocabularyGguf(const BpeVocabulary& v, int64_t vocab_size, GgufWriter* writer);

}  // namespace kvq
