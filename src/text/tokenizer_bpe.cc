// Byte-level BPE (see tokenizer.h): the "gpt2" GGUF loader and the encoder.
//
// GPT-2's byte alphabet maps each byte to one printable character so that a vocabulary of
// strings can hold every byte sequence: the printable bytes '!'..'~', U+00A1..U+00AC and
// U+00AE..U+00FF stand for themselves, and the other 68 bytes (controls, space, 0x7F..0xA0, 0xAD)
// become U+0100, U+0101, ... in byte order (so ' ' is U+0120 "Ġ" and '\n' is U+010A "Ċ"). Normal
// tokens and merges are stored in that alphabet; control and user-defined tokens are stored as
// plain text.
//
// A word is merged with a priority queue (llama.cpp's llm_tokenizer_bpe_session): the word starts
// as one symbol per byte, every adjacent pair that is a merge is queued by its rank, and the best
// pair (lowest rank, leftmost on ties) is merged until none is left; stale queue entries are
// skipped. This gives Hugging Face's BPE result, which applies the lowest-ranked merge everywhere
// it occurs, left to right, until no merge applies.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <limits>

#include "gguf/gguf_reader.h"
#include "text/hf_tokenizer_json.h"
#include "text/nfc.h"
#include "text/symbol_merge.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace kvq {
namespace {

struct ByteAlphabet {
  std::array<uint32_t, 256> code_point{};  // byte -> character
  std::array<std::string, 256> utf8;       // byte -> the character's UTF-8 (1 or 2 bytes)
  std::array<int16_t, 324> byte{};         // character (< 256 + 68) -> byte, -1 if none
};

const ByteAlphabet& Alphabet() {
  static const ByteAlphabet alphabet = [] {
    ByteAlphabet a;
    a.byte.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      a.code_point[b] = printable ? b : next++;
      unicode::AppendUtf8(a.code_point[b], a.utf8[b]);
      a.byte[a.code_point[b]] = static_cast<int16_t>(b);
    }
    return a;
  }();
  return alphabet;
}

/// The bytes a piece in the byte alphabet stands for; a character outside the alphabet (only in
/// a damaged vocabulary) is kept as its own UTF-8.
std::string DecodeByteAlphabet(std::string_view piece) {
  const ByteAlphabet& a = Alphabet();
  std::string out;
  out.reserve(piece.size());
  for (size_t at = 0; at < piece.size();) {
    const unicode::Decoded d = unicode::DecodeUtf8(piece, at);
    if (d.code_point < a.byte.size() && a.byte[d.code_point] >= 0) {
      out.push_back(static_cast<char>(a.byte[d.code_point]));
    } else {
      out.append(piece.substr(at, d.n_bytes));
    }
    at += d.n_bytes;
  }
  return out;
}

}  // namespace

Result<Tokenizer> Tokenizer::LoadGgufBpe(const GgufFile& file) {
  const std::string& path = file.path();
  const auto bad = [&](const std::string& why) {
    return Status::Error(fmt::format("{}: tokenizer: {}", path, why));
  };
  Result<std::span<const std::string_view>> tokens = file.GetStringArray("tokenizer.ggml.tokens");
  if (!tokens.ok()) return tokens.status();
  const size_t n = tokens->size();
  if (!file.Has("tokenizer.ggml.merges")) {
    return bad("tokenizer.ggml.model is \"gpt2\" (byte-level BPE) but there is no tokenizer.ggml.merges");
  }
  Result<std::span<const std::string_view>> merges = file.GetStringArray("tokenizer.ggml.merges");
  if (!merges.ok()) return merges.status();
  Result<std::vector<int32_t>> token_types = GgufTokenTypes(file, n);
  if (!token_types.ok()) return token_types.status();

  BpeVocabulary v;
  v.tokens.assign(tokens->begin(), tokens->end());
  v.token_types = std::move(token_types).value();
  v.merges.assign(merges->begin(), merges->end());
  if (file.Has("tokenizer.ggml.pre")) {  // a missing name is llama.cpp's "default"
    Result<std::string> p = file.GetString("tokenizer.ggml.pre");
    if (!p.ok()) return p.status();
    v.pre = *p;
  }
  // Special ids: the metadata's, else llama.cpp's BPE defaults (BOS = EOS = 11, no unknown token).
  const auto special = [&](std::string_view key, int32_t fallback, int32_t& id) -> Status {
    if (!file.Has(key)) {
      id = fallback >= 0 && fallback < static_cast<int32_t>(n) ? fallback : -1;
      return Status::Ok();
    }
    Result<uint32_t> value = file.GetU32(key);
    if (!value.ok()) return value.status();
    if (*value >= n) return bad(fmt::format("{} is {}, but there are only {} tokens", key, *value, n));
    id = static_cast<int32_t>(*value);
    return Status::Ok();
  };
  if (Status s = special("tokenizer.ggml.bos_token_id", 11, v.bos); !s.ok()) return s;
  if (Status s = special("tokenizer.ggml.eos_token_id", 11, v.eos); !s.ok()) return s;
  if (Status s = special("tokenizer.ggml.unknown_token_id", -1, v.unk); !s.ok()) return s;
  if (file.Has("tokenizer.ggml.add_bos_token")) {
    Result<bool> value = file.GetBool("tokenizer.ggml.add_bos_token");
    if (!value.ok()) return value.status();
    v.add_bos = *value;
  }
  return FromBpeVocabulary(v, path);
}

Result<Tokenizer> Tokenizer::FromBpeVocabulary(const BpeVocabulary& v, const std::string& source) {
  const auto bad = [&](const std::string& why) {
    return Status::Error(fmt::format("{}: tokenizer: {}", source, why));
  };
  const size_t n = v.tokens.size();
  if (n == 0) return bad("tokenizer.ggml.tokens is empty");
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return bad(fmt::format("tokenizer.ggml.tokens holds {} tokens, more than kvq's int32 ids allow", n));
  }
  if (v.token_types.size() != n) {
    return bad(fmt::format("tokenizer.ggml.token_type has {} entries for {} tokens", v.token_types.size(), n));
  }
  const std::optional<PreTokenizerSpec> spec = FindPreTokenizer(v.pre);
  if (!spec) {
    return bad(fmt::format("tokenizer.ggml.pre is \"{}\", a pre-tokenizer kvq does not implement; supported: {}",
                           v.pre, SupportedPreTokenizers()));
  }
  for (const auto& [key, id] : {std::pair{"bos_token_id", v.bos}, std::pair{"eos_token_id", v.eos},
                                std::pair{"unknown_token_id", v.unk}}) {
    if (id >= static_cast<int32_t>(n)) {
      return bad(fmt::format("tokenizer.ggml.{} is {}, but there are only {} tokens", key, id, n));
    }
  }

  Tokenizer t;
  t.kind_ = Kind::kBytePairs;
  t.source_ = source;
  t.add_space_prefix_ = false;  // llama.cpp's BPE never adds one
  t.pre_ = spec->kind;
  t.ignore_merges_ = spec->ignore_merges;
  t.add_bos_ = v.add_bos.value_or(spec->add_bos);
  t.nfc_ = v.nfc;
  t.bos_ = v.bos;
  t.eos_ = v.eos;
  t.unk_ = v.unk;

  t.pieces_.reserve(n);
  t.info_.reserve(n);
  t.bpe_text_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& text = v.tokens[i];
    Result<TokenInfo> typed = GgufTokenInfo(v.token_types[i], text, i);
    if (!typed.ok()) return bad(typed.status().message());
    TokenInfo info = *typed;
    const bool in_alphabet = info.type == TokenType::kNormal || info.type == TokenType::kUnused;
    t.pieces_.push_back(in_alphabet ? DecodeByteAlphabet(text) : text);
    t.bpe_text_.push_back(text);
    t.info_.push_back(info);
  }

  if (v.merges.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) return bad("too many merges");
  t.merge_ranks_.reserve(v.merges.size());
  for (size_t i = 0; i < v.merges.size(); ++i) {
    const std::string_view merge = v.merges[i];
    // "left right"; llama.cpp looks for the space from the second character on.
    const size_t space = merge.size() > 1 ? merge.find(' ', 1) : std::string_view::npos;
    if (space == std::string_view::npos || space + 1 >= merge.size()) {
      return bad(fmt::format("tokenizer.ggml.merges[{}] is \"{}\", not \"LEFT RIGHT\"", i, merge.substr(0, 64)));
    }
    t.merge_ranks_.emplace(std::string(merge), static_cast<int32_t>(i));  // the first rank wins
  }
  t.IndexBpe();
  t.FindEndOfGeneration();
  return t;
}

Result<Tokenizer> Tokenizer::LoadHfTokenizerJson(const std::string& path) {
  Result<BpeVocabulary> v = ReadHfTokenizerJson(path);
  if (!v.ok()) return v.status();
  return FromBpeVocabulary(*v, path);
}

void Tokenizer::IndexBpe() {
  const ByteAlphabet& alphabet = Alphabet();
  bpe_ids_.clear();
  bpe_ids_.reserve(bpe_text_.size());
  for (int32_t id = 0; id < vocab_size(); ++id) {
    if (bpe_text_[id].empty()) continue;
    bpe_ids_.emplace(bpe_text_[id], id);  // the first id wins
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = bpe_ids_.find(alphabet.utf8[b]);
    byte_ids_[b] = it == bpe_ids_.end() ? -1 : it->second;
  }
  IndexLiterals();
}

std::vector<int32_t> Tokenizer::EncodeBpe(std::string_view text, bool add_bos) const {
  std::vector<int32_t> tokens;
  if (add_bos && bos_ >= 0) tokens.push_back(bos_);
  if (text.empty()) return tokens;
  for (const Fragment& f : CutLiterals(text)) {
    if (f.token >= 0) {
      tokens.push_back(f.token);
      continue;
    }
    if (nfc_) {
      // Literals were cut from the text as it was (Hugging Face matches its added tokens before
      // normalising); the rest is normalised, then split.
      const std::string normalized = unicode::NormalizeNfc(f.text);
      for (const std::string_view word : PreTokenize(pre_, normalized)) EncodeBpeWord(word, tokens);
      continue;
    }
    for (const std::string_view word : PreTokenize(pre_, f.text)) EncodeBpeWord(word, tokens);
  }
  return tokens;
}

void Tokenizer::EncodeBpeWord(std::string_view word, std::vector<int32_t>& out) const {
  const ByteAlphabet& alphabet = Alphabet();
  // The word in the byte alphabet; symbol i starts as raw byte i, at encoded offset start.
  std::string encoded;
  encoded.reserve(word.size() * 2);
  std::vector<MergeSymbol> symbols;  // byte ranges of `encoded`
  symbols.reserve(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    const std::string& c = alphabet.utf8[static_cast<uint8_t>(word[i])];
    symbols.push_back({static_cast<uint32_t>(encoded.size()), static_cast<uint32_t>(c.size()),
                       static_cast<int32_t>(i) - 1, i + 1 == word.size() ? -1 : static_cast<int32_t>(i + 1)});
    encoded += c;
  }
  const auto view = [&](const MergeSymbol& s) { return std::string_view(encoded).substr(s.start, s.n); };

  if (ignore_merges_) {
    if (const auto it = bpe_ids_.find(encoded); it != bpe_ids_.end()) {
      out.push_back(it->second);
      return;
    }
  }

  std::string key;
  MergeAdjacentSymbols<int32_t>(symbols, [&](const MergeSymbol& left,
                                             const MergeSymbol& right) -> std::optional<int32_t> {
    key.assign(view(left));
    key.push_back(' ');
    key.append(view(right));
    const auto it = merge_ranks_.find(key);
    if (it == merge_ranks_.end()) return std::nullopt;
    return it->second;  // the lowest rank merges first
  });

  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    if (const auto it = bpe_ids_.find(view(symbols[i])); it != bpe_ids_.end()) {
      out.push_back(it->second);
      continue;
    }
    // Not a token (a merge whose result the vocabulary lacks, or a byte it lacks): symbol i holds
    // raw bytes [i, next), each becoming its own token. A byte without one is dropped, as
    // llama.cpp drops it: the unknown token of such vocabularies is often a control token
    // (StarCoder's is <|endoftext|>), which would end the text.
    const size_t end = symbols[i].next < 0 ? word.size() : static_cast<size_t>(symbols[i].next);
    for (size_t b = static_cast<size_t>(i); b < end; ++b) {
      const int32_t id = byte_ids_[static_cast<uint8_t>(word[b])];
      if (id >= 0) out.push_back(id);
    }
  }
}

}  // namespace kvq
