// The vocabularies the tokenizer fuzz targets encode with, loaded once per process: the bundled
// stories260K tokenizer and llama.cpp's test vocabularies in tests/testdata/vocab, with what the
// round-trip property needs to know of each (the literal pieces, the bytes it has no token for).
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "gguf/gguf_reader.h"
#include "text/tokenizer.h"

namespace kvq::fuzz {

struct FuzzVocab {
  Tokenizer tokenizer;
  /// Texts Encode cuts out as single tokens (Tokenizer::literal_tokens()): an input holding one
  /// does not round-trip, as documented at Tokenizer::Encode.
  std::vector<std::string> literals;
  /// Byte-level BPE: bytes with no token of their own, dropped by Encode (Falcon lacks 28).
  std::array<bool, 256> missing_byte{};
};

/// Loads `relative` (under the source tree): ".bin" a llama2.c tokenizer of `llama2c_vocab` tokens,
/// else a GGUF vocabulary. Aborts naming the file if it does not load: the targets need it.
inline FuzzVocab LoadFuzzVocab(std::string_view relative, int32_t llama2c_vocab = 0) {
  const std::string path = SourcePath(relative);
  Result<Tokenizer> t = Status::Error("unreachable");
  if (path.ends_with(".bin")) {
    t = Tokenizer::LoadLlama2c(path, llama2c_vocab);
  } else {
    Result<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
    if (!file.ok()) Fail("vocab", file.status().message());
    t = Tokenizer::LoadGguf(**file);
  }
  if (!t.ok()) Fail("vocab", t.status().message());
  FuzzVocab v{.tokenizer = std::move(t).value()};
  v.tokenizer.set_notice_sink([](std::string_view) {});
  const bool bpe = v.tokenizer.kind() == Tokenizer::Kind::kBytePairs;
  std::array<bool, 256> has_byte{};
  for (const int32_t id : v.tokenizer.literal_tokens()) v.literals.push_back(v.tokenizer.piece(id));
  for (int32_t id = 0; id < v.tokenizer.vocab_size(); ++id) {
    const Tokenizer::TokenType type = v.tokenizer.type(id);
    const std::string& piece = v.tokenizer.piece(id);
    const bool literal = type == Tokenizer::TokenType::kUserDefined ||
                         type == Tokenizer::TokenType::kControl ||
                         type == Tokenizer::TokenType::kUnknown;
    if (bpe && !literal && piece.size() == 1) has_byte[static_cast<uint8_t>(piece[0])] = true;
  }
  for (int b = 0; b < 256; ++b) v.missing_byte[b] = bpe && !has_byte[b];
  return v;
}

/// Whether Detokenize(Encode(text)) == text is promised for this vocabulary (Tokenizer::Encode).
inline bool RoundTripPromised(const FuzzVocab& v, std::string_view text) {
  for (const std::string& literal : v.literals) {
    if (text.find(literal) != std::string_view::npos) return false;
  }
  for (unsigned char c : text) {
    if (v.missing_byte[c]) return false;
  }
  return true;
}

/// Encodes `text`, checks every id is in the vocabulary and, where promised, the round trip.
inline void CheckEncode(std::string_view target, const FuzzVocab& v, std::string_view text, bool add_bos) {
  const std::vector<int32_t> ids = v.tokenizer.Encode(text, add_bos);
  for (int32_t id : ids) {
    if (id < 0 || id >= v.tokenizer.vocab_size()) {
      Fail(target, v.tokenizer.source() + ": Encode returned id " + std::to_string(id));
    }
  }
  if (RoundTripPromised(v, text) && v.tokenizer.Detokenize(ids) != text) {
    Fail(target, v.tokenizer.source() + ": Detokenize(Encode(s)) != s");
  }
}

}  // namespace kvq::fuzz
