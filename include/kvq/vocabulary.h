// kvq's public C++ API: a vocabulary on its own, without a model's weights. What `kvq tokenize`
// and other tools read when they need a tokenizer but no forward pass:
//
//   kvq::Result<std::unique_ptr<kvq::Vocabulary>> v = kvq::Vocabulary::OpenGguf("ggml-vocab-qwen2.gguf");
//   std::vector<int32_t> ids = (*v)->Tokenize("Hello");
//
// Tokenize, Detokenize, TokenText and TokenPiece are Model's (kvq/model.h), the same code over the
// same tokenizer: a Vocabulary opened from a model's file gives a loaded Model's ids and texts.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvq/model.h"  // AddBos
#include "kvq/status.h"

namespace kvq {

class Vocabulary {
 public:
  /// The tokenizer.* metadata of a GGUF file: a model, or a vocabulary-only GGUF such as
  /// llama.cpp's models/ggml-vocab-*.gguf (only the metadata is read; tensors are not touched).
  /// Errors name the file and what was wrong (not a GGUF file, no tokenizer.ggml.tokens, ...).
  static Result<std::unique_ptr<Vocabulary>> OpenGguf(const std::string& path);
  /// A Hugging Face tokenizer.json (byte-level BPE; tokenizer_config.json beside it is read too),
  /// normalizer included, as llama.cpp's converter would write it into a GGUF.
  static Result<std::unique_ptr<Vocabulary>> OpenHfTokenizerJson(const std::string& path);
  ~Vocabulary();
  Vocabulary(const Vocabulary&) = delete;
  Vocabulary& operator=(const Vocabulary&) = delete;

  int32_t size() const;  ///< tokens
  /// Whether Tokenize(text, AddBos::kModelDefault) puts BOS in front.
  bool adds_bos() const;
  /// "SentencePiece" or "byte-level BPE, pre-tokenizer NAME", with ", NFC" when the text is
  /// NFC-normalised first: how this vocabulary cuts text, for a tool's report.
  std::string Description() const;

  /// As Model::Tokenize.
  std::vector<int32_t> Tokenize(std::string_view text, AddBos add_bos = AddBos::kModelDefault) const;
  /// As Model::Detokenize.
  Result<std::string> Detokenize(std::span<const int32_t> ids) const;
  /// As Model::TokenText.
  std::string TokenText(int32_t previous, int32_t token) const;
  /// As Model::TokenPiece.
  std::string TokenPiece(int32_t id) const;
  /// Whether `id` is a byte piece ("<0x0A>"): its text is that one byte. False out of range.
  bool IsByteToken(int32_t id) const;

  struct Impl;  ///< internal

 private:
  explicit Vocabulary(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvq
