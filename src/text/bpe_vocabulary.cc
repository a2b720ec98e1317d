// WriteBpeVocabularyGguf (see bpe_vocabulary.h): the tokenizer.ggml.* keys in the order
// llama.cpp's convert_hf_to_gguf.py writes them.
#include "text/bpe_vocabulary.h"

#include <fmt/format.h>

#include "gguf/gguf_writer.h"

namespace kvq {

Status WriteBpeVocabularyGguf(const BpeVocabulary& v, int64_t vocab_size, GgufWriter* w) {
  constexpr int32_t kUnused = 5;  // llama_token_type LLAMA_TOKEN_TYPE_UNUSED
  const auto n = static_cast<int64_t>(v.tokens.size());
  if (v.token_types.size() != v.tokens.size()) {
    return Status::Error(fmt::format("vocabulary: {} token types for {} tokens", v.token_types.size(), n));
  }
  if (vocab_size < n) {
    return Status::Error(fmt::format("vocabulary: {} tokens do not fit a vocabulary size of {}", n, vocab_size));
  }
  std::vector<std::string> tokens = v.tokens;
  std::vector<int32_t> types = v.token_types;
  tokens.reserve(static_cast<size_t>(vocab_size));
  types.reserve(static_cast<size_t>(vocab_size));
  for (int64_t id = n; id < vocab_size; ++id) {
    tokens.push_back(fmt::format("[PAD{}]", id));
    types.push_back(kUnused);
  }
  const auto id_key = [&](const char* key, int32_t id) -> Status {
    if (id < 0) return Status::Ok();
    return w->SetU32(key, static_cast<uint32_t>(id));
  };
  for (Status s : {w->SetString("tokenizer.ggml.model", "gpt2"), w->SetString("tokenizer.ggml.pre", v.pre),
                   w->SetStringArray("tokenizer.ggml.tokens", tokens),
                   w->SetI32Array("tokenizer.ggml.token_type", types),
                   w->SetStringArray("tokenizer.ggml.merges", v.merges),
                   id_key("tokenizer.ggml.bos_token_id", v.bos), id_key("tokenizer.ggml.eos_token_id", v.eos),
                   id_key("tokenizer.ggml.unknown_token_id", v.unk),
                   id_key("tokenizer.ggml.padding_token_id", v.pad)}) {
    if (!s.ok()) return s;
  }
  if (v.add_bos) {
    if (Status s = w->SetBool("tokenizer.ggml.add_bos_token", *v.add_bos); !s.ok()) return s;
  }
  if (!v.chat_template.empty()) {
    if (Status s = w->SetString("tokenizer.chat_template", v.chat_template); !s.ok()) return s;
  }
  return Status::Ok();
}

}  // namespace kvq
