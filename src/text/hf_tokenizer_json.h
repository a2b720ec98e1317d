// Imports a Hugging Face tokenizer.json (the file `tokenizers` and transformers.js load) as a
// byte-level BPE vocabulary (bpe_vocabulary.h), the way llama.cpp's convert_hf_to_gguf.py turns it
// into tokenizer.ggml.* keys, so `kvq synth --vocab tokenizer.json` and `kvq tokenize --vocab
// tokenizer.json` can use a model's own vocabulary without a GGUF file of it.
#pragma once

#include <string>

#include "kvq/status.h"
#include "text/bpe_vocabulary.h"

namespace kvq {

/// Reads `path` (a tokenizer.json) and, when it exists, the tokenizer_config.json in the same
/// folder. What is taken, and what is refused with an error naming the file and the field:
///  - model: type "BPE" only (Unigram, WordPiece, WordLevel are refused), without byte_fallback,
///    continuing_subword_prefix, end_of_word_suffix or dropout; vocab (token -> id) and merges,
///    either "left right" strings or ["left", "right"] pairs; unk_token.
///  - normalizer: none, or NFC (alone or in a Sequence); anything else is refused.
///  - pre_tokenizer: ByteLevel with its GPT-2 regex (pre "gpt-2"), or a Sequence of a Split by
///    Llama 3's, Qwen 2's or Mistral Nemo's Tekken regex (pre "llama-bpe", "qwen2", "tekken"; the
///    regex must be exactly that model's) then ByteLevel without its regex; model.ignore_merges
///    must be what llama.cpp assumes for that pre (true for llama-bpe). decoder: ByteLevel.
///  - added_tokens: each becomes its id's token as plain text, type CONTROL when "special" (or
///    when it looks special, "<|...|>", as the converter decides) else USER_DEFINED; lstrip,
///    rstrip and single_word are refused. Ids no token has become "[PAD<id>]" (UNUSED).
///  - tokenizer_config.json: bos_token, eos_token, pad_token (strings or {"content": ...}),
///    add_bos_token, chat_template (a string, or the "default" entry of a list). Without
///    add_bos_token, BOS is added when post_processor's TemplateProcessing puts a special token
///    first (and that token is BOS when the config names none).
Result<BpeVocabulary> ReadHfTokenizerJson(const std::string& path);

}  // namespace kvq
