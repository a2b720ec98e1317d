// kvq::Vocabulary (include/kvq/vocabulary.h): a text/ Tokenizer on its own, and the tokenizer
// calls it shares with Model (api/vocabulary_calls.h).
#include "kvq/vocabulary.h"

#include <fmt/format.h>

#include "api/vocabulary_calls.h"
#include "gguf/gguf_reader.h"
#include "text/pre_tokenizer.h"

namespace kvq {

std::vector<int32_t> TokenizeWith(const Tokenizer& tokenizer, std::string_view text, AddBos add_bos) {
  const bool bos = add_bos == AddBos::kModelDefault ? tokenizer.add_bos() : add_bos == AddBos::kYes;
  return tokenizer.Encode(text, bos);
}

Result<std::string> DetokenizeWith(const Tokenizer& tokenizer, int32_t vocab_size, std::span<const int32_t> ids) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return Status::Error(fmt::format("Detokenize: id {} at index {} is outside the vocabulary [0, {})",
                                       ids[i], i, vocab_size));
    }
  }
  return tokenizer.Detokenize(ids);
}

std::string TokenTextWith(const Tokenizer& tokenizer, int32_t vocab_size, int32_t previous, int32_t token) {
  if (token < 0 || token >= vocab_size || previous < 0 || previous >= vocab_size) return {};
  return tokenizer.Decode(previous, token);
}

std::string TokenPieceWith(const Tokenizer& tokenizer, int32_t vocab_size, int32_t id) {
  if (id < 0 || id >= vocab_size) return {};
  return tokenizer.piece(id);
}

struct Vocabulary::Impl {
  Tokenizer tokenizer;
};

Vocabulary::Vocabulary(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Vocabulary::~Vocabulary() = default;

Result<std::unique_ptr<Vocabulary>> Vocabulary::OpenGguf(const std::string& path) {
  Result<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  if (!file.ok()) return file.status();
  Result<Tokenizer> tokenizer = Tokenizer::LoadGguf(**file);
  if (!tokenizer.ok()) return tokenizer.status();
  return std::unique_ptr<Vocabulary>(new Vocabulary(std::make_unique<Impl>(Impl{std::move(*tokenizer)})));
}

Result<std::unique_ptr<Vocabulary>> Vocabulary::OpenHfTokenizerJson(const std::string& path) {
  Result<Tokenizer> tokenizer = Tokenizer::LoadHfTokenizerJson(path);
  if (!tokenizer.ok()) return tokenizer.status();
  return std::unique_ptr<Vocabulary>(new Vocabulary(std::make_unique<Impl>(Impl{std::move(*tokenizer)})));
}

int32_t Vocabulary::size() const { return impl_->tokenizer.vocab_size(); }

bool Vocabulary::adds_bos() const { return impl_->tokenizer.add_bos(); }

std::string Vocabulary::Description() const {
  const Tokenizer& t = impl_->tokenizer;
  const char* nfc = t.normalizes_nfc() ? ", NFC" : "";
  if (t.kind() != Tokenizer::Kind::kBytePairs) return fmt::format("SentencePiece{}", nfc);
  return fmt::format("byte-level BPE, pre-tokenizer {}{}", PreTokenizerName(t.pre_tokenizer()), nfc);
}

std::vector<int32_t> Vocabulary::Tokenize(std::string_view text, AddBos add_bos) const {
  return TokenizeWith(impl_->tokenizer, text, add_bos);
}

Result<std::string> Vocabulary::Detokenize(std::span<const int32_t> ids) const {
  return DetokenizeWith(impl_->tokenizer, size(), ids);
}

std::string Vocabulary::TokenText(int32_t previous, int32_t token) const {
  return TokenTextWith(impl_->tokenizer, size(), previous, token);
}

std::string Vocabulary::TokenPiece(int32_t id) const { return TokenPieceWith(impl_->tokenizer, size(), id); }

bool Vocabulary::IsByteToken(int32_t id) const {
  return id >= 0 && id < size() && impl_->tokenizer.type(id) == Tokenizer::TokenType::kByte;
}

}  // namespace kvq
