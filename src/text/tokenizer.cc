// Tokenizer (see tokenizer.h): the loaders, the SentencePiece encoder and what both kinds share
// (literal cutting, decoding, end of generation); byte-level BPE is in tokenizer_bpe.cc.
// The SentencePiece Encode is a priority-queue version of the SentencePiece BPE merge
// (as llama.cpp's llm_tokenizer_spm): the text is split into UTF-8 characters, every adjacent pair
// whose concatenation is a piece is queued by that piece's score, and the best pair (leftmost on
// ties) is merged until none is left; stale queue entries are skipped. For valid UTF-8 this gives
// exactly run.c's O(n^2) result (which merges the same best pair at every step) in O(n log n).
#include "text/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

#include "gguf/gguf_reader.h"
#include "kvq/log.h"
#include "text/symbol_merge.h"

namespace kvq {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's space

/// Bytes a UTF-8 character takes by its lead byte (llama.cpp's unicode_len_utf8): 1 for ASCII
/// and for a stray continuation byte, else 2, 3 or 4 as announced; the bytes that follow are not
/// checked.
size_t Utf8Length(uint8_t lead) {
  static constexpr uint8_t kByHighNibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kByHighNibble[lead >> 4];
}

std::string ReplaceAll(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  for (size_t at = 0;;) {
    const size_t hit = s.find(from, at);
    if (hit == std::string_view::npos) {
      out.append(s.substr(at));
      return out;
    }
    out.append(s.substr(at, hit - at));
    out.append(to);
    at = hit + from.size();
  }
}

/// A character for a message: itself in quotes when it is valid, printable UTF-8, then its code
/// point, e.g. "'é' (U+00E9)"; else its bytes, e.g. "the byte 0xFF (not UTF-8)".
std::string DescribeCharacter(std::string_view c) {
  const auto u = [&](size_t i) { return static_cast<uint8_t>(c[i]); };
  const auto continuation = [&](size_t i) { return i < c.size() && (u(i) & 0xC0) == 0x80; };
  uint32_t cp = 0;
  bool valid = !c.empty() && c.size() == Utf8Length(u(0));
  if (valid && c.size() == 1) {
    cp = u(0);
    valid = cp < 0x80;
  } else if (valid) {
    cp = u(0) & (0x7F >> c.size());
    for (size_t i = 1; i < c.size(); ++i) {
      valid = valid && continuation(i);
      cp = (cp << 6) | (u(i) & 0x3F);
    }
  }
  if (valid) {
    const bool printable = cp >= 0x20 && cp != 0x7F && !(cp >= 0x80 && cp < 0xA0);
    return printable ? fmt::format("'{}' (U+{:04X})", c, cp) : fmt::format("U+{:04X}", cp);
  }
  std::string bytes;
  for (size_t i = 0; i < c.size(); ++i) bytes += fmt::format("{}0x{:02X}", i ? " " : "", u(i));
  return fmt::format("the {} {} (not UTF-8)", c.size() == 1 ? "byte" : "bytes", bytes);
}

}  // namespace

int Tokenizer::BytePieceValue(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  int value = 0;
  for (const char c : piece.substr(3, 2)) {
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                             : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

Result<std::vector<int32_t>> Tokenizer::GgufTokenTypes(const GgufFile& file, size_t n) {
  if (!file.Has("tokenizer.ggml.token_type")) return std::vector<int32_t>(n, static_cast<int32_t>(TokenType::kNormal));
  Result<std::vector<int32_t>> types = file.GetI32Array("tokenizer.ggml.token_type");
  if (!types.ok()) return types.status();
  if (types->size() != n) {
    return Status::Error(fmt::format("{}: tokenizer: tokenizer.ggml.token_type has {} entries for {} tokens",
                                     file.path(), types->size(), n));
  }
  return types;
}

Result<Tokenizer::TokenInfo> Tokenizer::GgufTokenInfo(int32_t type, std::string_view text, size_t id) {
  TokenInfo info;
  switch (type) {
    case 0:  // undefined: llama.cpp still matches it as a piece
    case 1:
      info.type = TokenType::kNormal;
      return info;
    case 2:
    case 3:
    case 4:
    case 5:
      info.type = static_cast<TokenType>(type);
      return info;
    case 6: {
      const int byte = BytePieceValue(text);
      if (byte < 0) {
        return Status::Error(
            fmt::format("token {} has type BYTE but is \"{}\", not \"<0xXX>\"", id, text.substr(0, 32)));
      }
      info.type = TokenType::kByte;
      info.byte = static_cast<uint8_t>(byte);
      return info;
    }
    default:
      return Status::Error(fmt::format("token {} has type {}; token types are 0 to 6", id, type));
  }
}

Result<Tokenizer> Tokenizer::LoadLlama2c(const std::string& path, int32_t vocab_size) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) return Status::Error(fmt::format("cannot open tokenizer {}: {}", path, std::strerror(errno)));
  const auto bad = [&](const std::string& why) {
    return Status::Error(fmt::format("{} is not a llama2.c tokenizer for a {}-token vocabulary: {}", path,
                                     vocab_size, why));
  };
  if (vocab_size < 3) return bad("run.c's vocabulary holds at least <unk>, BOS and EOS (ids 0, 1, 2)");
  int32_t max_len = 0;
  if (std::fread(&max_len, 4, 1, f.get()) != 1) return bad("no header");
  if (max_len <= 0 || max_len > 4096) return bad(fmt::format("max token length {} is implausible", max_len));
  Tokenizer t;
  for (int32_t i = 0; i < vocab_size; ++i) {
    float score = 0;
    int32_t len = 0;
    if (std::fread(&score, 4, 1, f.get()) != 1 || std::fread(&len, 4, 1, f.get()) != 1) {
      return bad(fmt::format("it ends at token {}", i));
    }
    if (len < 0 || len > max_len) return bad(fmt::format("token {} has length {}", i, len));
    std::string piece(len, '\0');
    if (len > 0 && std::fread(piece.data(), 1, len, f.get()) != static_cast<size_t>(len)) {
      return bad(fmt::format("it ends inside token {}", i));
    }
    TokenInfo info{.score = score};
    if (const int byte = BytePieceValue(piece); byte >= 0) {
      info.type = TokenType::kByte;
      info.byte = static_cast<uint8_t>(byte);
    } else if (i == 0) {
      info.type = TokenType::kUnknown;
    } else if (i == 1 || i == 2) {
      info.type = TokenType::kControl;  // "\n<s>\n", "\n</s>\n" in llama2.c's export
    }
    t.pieces_.push_back(std::move(piece));
    t.info_.push_back(info);
  }
  if (std::fgetc(f.get()) != EOF) return bad("there are bytes after the last token");
  t.source_ = path;
  t.bos_ = 1;
  t.eos_ = 2;
  t.unk_ = 0;
  t.Index();
  t.FindEndOfGeneration();
  // llama2.c's models mark the start of a new story with BOS, and run.c stops there: BOS ends
  // generation for these vocabularies (not for GGUF ones, as in llama.cpp).
  t.end_of_generation_.insert(std::lower_bound(t.end_of_generation_.begin(), t.end_of_generation_.end(), t.bos_),
                              t.bos_);
  return t;
}

Result<Tokenizer> Tokenizer::LoadGguf(const GgufFile& file) {
  const std::string& path = file.path();
  const auto bad = [&](const std::string& why) {
    return Status::Error(fmt::format("{}: tokenizer: {}", path, why));
  };
  if (!file.Has("tokenizer.ggml.model")) return bad("no tokenizer.ggml.model; the file holds no vocabulary");
  Result<std::string> model = file.GetString("tokenizer.ggml.model");
  if (!model.ok()) return model.status();
  if (*model == "gpt2") return LoadGgufBpe(file);
  if (*model != "llama") {
    return bad(fmt::format("tokenizer.ggml.model is \"{}\"; kvq reads \"llama\" (SentencePiece) and \"gpt2\" "
                           "(byte-level BPE) vocabularies",
                           *model));
  }
  Result<std::span<const std::string_view>> tokens = file.GetStringArray("tokenizer.ggml.tokens");
  if (!tokens.ok()) return tokens.status();
  const size_t n = tokens->size();
  if (n == 0) return bad("tokenizer.ggml.tokens is empty");
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return bad(fmt::format("tokenizer.ggml.tokens holds {} tokens, more than kvq's int32 ids allow", n));
  }
  std::vector<float> scores(n, 0.0f);
  if (file.Has("tokenizer.ggml.scores")) {
    Result<std::vector<float>> s = file.GetF32Array("tokenizer.ggml.scores");
    if (!s.ok()) return s.status();
    if (s->size() != n) return bad(fmt::format("tokenizer.ggml.scores has {} entries for {} tokens", s->size(), n));
    scores = std::move(s).value();
  }
  Result<std::vector<int32_t>> token_types = GgufTokenTypes(file, n);
  if (!token_types.ok()) return token_types.status();
  const std::vector<int32_t>& types = *token_types;

  Tokenizer t;
  t.source_ = path;
  t.pieces_.reserve(n);
  t.info_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string_view text = (*tokens)[i];
    Result<TokenInfo> typed = GgufTokenInfo(types[i], text, i);
    if (!typed.ok()) return bad(typed.status().message());
    TokenInfo info = *typed;
    info.score = scores[i];
    // Normal and unused pieces mark a space with U+2581; kvq keeps a plain space. (Control and
    // user-defined texts are literal, as llama.cpp matches and prints them.) A normal piece with a
    // plain space in it could never match in llama.cpp, which escapes every space of the text, so
    // it stays out of the merge table.
    if (info.type == TokenType::kNormal || info.type == TokenType::kUnused) {
      if (text.find(' ') != std::string_view::npos) info.matchable = false;
      t.pieces_.push_back(ReplaceAll(text, kSpaceMark, " "));
    } else {
      t.pieces_.emplace_back(text);
    }
    t.info_.push_back(info);
  }

  // Special ids: the metadata's, else llama.cpp's SPM defaults (BOS 1, EOS 2, unknown 0) when the
  // vocabulary is that large.
  const auto special = [&](std::string_view key, int32_t fallback, int32_t& id) -> Status {
    if (!file.Has(key)) {
      id = fallback < static_cast<int32_t>(n) ? fallback : -1;
      return Status::Ok();
    }
    Result<uint32_t> v = file.GetU32(key);
    if (!v.ok()) return v.status();
    if (*v >= n) return bad(fmt::format("{} is {}, but there are only {} tokens", key, *v, n));
    id = static_cast<int32_t>(*v);
    return Status::Ok();
  };
  if (Status s = special("tokenizer.ggml.bos_token_id", 1, t.bos_); !s.ok()) return s;
  if (Status s = special("tokenizer.ggml.eos_token_id", 2, t.eos_); !s.ok()) return s;
  if (Status s = special("tokenizer.ggml.unknown_token_id", 0, t.unk_); !s.ok()) return s;
  const auto flag = [&](std::string_view key, bool& value) -> Status {
    if (!file.Has(key)) return Status::Ok();
    Result<bool> v = file.GetBool(key);
    if (!v.ok()) return v.status();
    value = *v;
    return Status::Ok();
  };
  if (Status s = flag("tokenizer.ggml.add_bos_token", t.add_bos_); !s.ok()) return s;
  if (Status s = flag("tokenizer.ggml.add_space_prefix", t.add_space_prefix_); !s.ok()) return s;
  t.Index();
  t.FindEndOfGeneration();
  return t;
}

void Tokenizer::Index() {
  ids_.clear();
  byte_ids_.fill(-1);
  const int32_t n = vocab_size();
  for (int32_t id = 0; id < n; ++id) {
    const TokenInfo& info = info_[id];
    switch (info.type) {
      case TokenType::kNormal:
      case TokenType::kUnused:
      case TokenType::kUserDefined:
        if (pieces_[id].empty() || !info.matchable) break;
        ids_.emplace(pieces_[id], id);  // the first id wins
        break;
      case TokenType::kByte:
        if (byte_ids_[info.byte] < 0) byte_ids_[info.byte] = id;
        break;
      case TokenType::kUnknown:
      case TokenType::kControl:
        break;
    }
  }
  has_byte_pieces_ = std::find(byte_ids_.begin(), byte_ids_.end(), -1) == byte_ids_.end();
  // A vocabulary without a byte piece for some byte may still hold that byte as a one-byte piece
  // (llama.cpp's fallback in byte_to_token).
  for (int b = 0; b < 256; ++b) {
    if (byte_ids_[b] >= 0) continue;
    const char c = static_cast<char>(b);
    const auto it = ids_.find(std::string_view(&c, 1));
    if (it != ids_.end()) byte_ids_[b] = it->second;
  }
  IndexLiterals();
}

void Tokenizer::IndexLiterals() {
  // llama.cpp's special-token cache (tokenizer_st_partition with parse_special): control,
  // user-defined and unknown tokens, for every kind of vocabulary.
  literals_.clear();
  for (int32_t id = 0; id < vocab_size(); ++id) {
    const TokenType type = info_[id].type;
    const bool literal = type == TokenType::kControl || type == TokenType::kUserDefined ||
                         type == TokenType::kUnknown;
    if (literal && !pieces_[id].empty()) literals_.push_back(id);  // an empty text matches nowhere
  }
  // Longest first, as llama.cpp matches them; equal lengths by id.
  std::stable_sort(literals_.begin(), literals_.end(),
                   [&](int32_t a, int32_t b) { return pieces_[a].size() > pieces_[b].size(); });
}

void Tokenizer::FindEndOfGeneration() {
  // llama.cpp's end-of-turn texts (llama-vocab.cpp, special_eog_ids); llama.cpp forces such a
  // token to control type, kvq only trusts the ones the vocabulary marks as control.
  static constexpr std::string_view kEndOfTurnTexts[] = {
      "<|eot_id|>",    "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",        "<end_of_turn>",
      "<|endoftext|>", "<|eom_id|>", "<EOT>",   "_<EOT>",     "[EOT]",           "[EOS]",
      "<|end_of_text|>", "<end_of_utterance>", "<eos>",
      "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",  // DeepSeek's "<｜end▁of▁sentence｜>"
  };
  end_of_generation_.clear();
  if (eos_ >= 0) end_of_generation_.push_back(eos_);
  for (int32_t id = 0; id < vocab_size(); ++id) {
    if (info_[id].type != TokenType::kControl) continue;
    for (const std::string_view text : kEndOfTurnTexts) {
      if (pieces_[id] == text) end_of_generation_.push_back(id);
    }
  }
  std::sort(end_of_generation_.begin(), end_of_generation_.end());
  end_of_generation_.erase(std::unique(end_of_generation_.begin(), end_of_generation_.end()),
                           end_of_generation_.end());
}

bool Tokenizer::IsEndOfGeneration(int32_t id) const {
  return std::binary_search(end_of_generation_.begin(), end_of_generation_.end(), id);
}

std::vector<Tokenizer::Fragment> Tokenizer::CutLiterals(std::string_view text) const {
  std::vector<Fragment> fragments{{text, -1}};
  for (const int32_t id : literals_) {
    const std::string& literal = pieces_[id];
    std::vector<Fragment> next;
    next.reserve(fragments.size());
    for (const Fragment& f : fragments) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      std::string_view rest = f.text;
      for (size_t at; (at = rest.find(literal)) != std::string_view::npos;) {
        if (at > 0) next.push_back({rest.substr(0, at), -1});
        next.push_back({{}, id});
        rest.remove_prefix(at + literal.size());
      }
      if (!rest.empty()) next.push_back({rest, -1});
    }
    fragments.swap(next);
  }
  return fragments;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_bos) const {
  if (kind_ == Kind::kBytePairs) return EncodeBpe(text, add_bos);
  std::vector<int32_t> tokens;
  if (add_bos && bos_ >= 0) tokens.push_back(bos_);
  if (text.empty()) return tokens;

  // Cut control, user-defined and unknown pieces out of the text, longest first (token >= 0
  // marks a cut piece); the text after one gets the space prefix again, as llama.cpp's.
  const std::vector<Fragment> fragments = CutLiterals(text);
  bool after_special = true;  // the start counts as following a special token
  std::string stretch;
  for (const Fragment& f : fragments) {
    if (f.token >= 0) {
      tokens.push_back(f.token);
      after_special = true;
      continue;
    }
    stretch.clear();
    if (add_space_prefix_ && after_special) stretch.push_back(' ');
    stretch.append(f.text);
    EncodeStretch(stretch, tokens);
    after_special = false;
  }
  return tokens;
}

void Tokenizer::EncodeStretch(std::string_view text, std::vector<int32_t>& out) const {
  // Symbols: the UTF-8 characters of `text` (a lead byte and as many bytes as it announces).
  std::vector<MergeSymbol> symbols;
  symbols.reserve(text.size());
  for (size_t at = 0; at < text.size();) {
    const size_t n = std::min(Utf8Length(static_cast<uint8_t>(text[at])), text.size() - at);
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({static_cast<uint32_t>(at), static_cast<uint32_t>(n), index - 1,
                       at + n == text.size() ? -1 : index + 1});
    at += n;
  }
  // The best score merges first: the priority is the negated score (exact, order-reversing).
  MergeAdjacentSymbols<float>(symbols, [&](const MergeSymbol& left,
                                             const MergeSymbol& right) -> std::optional<float> {
    const auto it = ids_.find(text.substr(left.start, left.n + right.n));
    if (it == ids_.end()) return std::nullopt;
    return -info_[it->second].score;
  });

  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    const std::string_view piece = text.substr(symbols[i].start, symbols[i].n);
    if (const auto it = ids_.find(piece); it != ids_.end()) {
      out.push_back(it->second);
      continue;
    }
    // Not a piece (a character the vocabulary lacks, or invalid UTF-8): its bytes, when the
    // vocabulary has a token for each; else the unknown token for the whole character.
    const bool spelled = std::all_of(piece.begin(), piece.end(),
                                     [&](char c) { return byte_ids_[static_cast<uint8_t>(c)] >= 0; });
    if (spelled) {
      for (const char c : piece) out.push_back(byte_ids_[static_cast<uint8_t>(c)]);
      continue;
    }
    if (unk_ >= 0) out.push_back(unk_);
    NoteUnknown(piece);
  }
}

void Tokenizer::NoteUnknown(std::string_view character) const {
  if (unknown_characters_.n.fetch_add(1, std::memory_order_relaxed) != 0) return;  // once
  const bool any_byte_piece = std::any_of(info_.begin(), info_.end(),
                                          [](const TokenInfo& i) { return i.type == TokenType::kByte; });
  std::string why = "the vocabulary has no byte pieces";
  if (any_byte_piece) {
    for (const char c : character) {
      if (byte_ids_[static_cast<uint8_t>(c)] >= 0) continue;
      why = fmt::format("the vocabulary has no byte piece <0x{:02X}>", static_cast<uint8_t>(c));
      break;
    }
  }
  const std::string as = unk_ >= 0 ? fmt::format("encoded as the unknown token {} (id {})", pieces_[unk_], unk_)
                                   : std::string("dropped (the vocabulary has no unknown token)");
  const std::string note = fmt::format(
      "tokenizer {}: {} has no piece and {} to spell it with: {}; later such characters are {} without "
      "another notice",
      source_, DescribeCharacter(character), why, as, unk_ >= 0 ? "encoded the same way" : "dropped too");
  if (notice_) {
    notice_(note);
  } else {
    Log(LogLevel::kWarning, note);
  }
}

std::string Tokenizer::Text(int32_t token, bool strip_space) const {
  if (token < 0 || token >= vocab_size()) return "";
  const TokenInfo& info = info_[token];
  switch (info.type) {
    case TokenType::kControl:
    case TokenType::kUnknown:
      return "";
    case TokenType::kByte:
      return std::string(1, static_cast<char>(info.byte));
    case TokenType::kUserDefined:
      return pieces_[token];
    case TokenType::kNormal:
    case TokenType::kUnused:
      break;
  }
  std::string_view piece = pieces_[token];
  if (strip_space && add_space_prefix_ && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
  return std::string(piece);
}

std::string Tokenizer::Decode(int32_t previous, int32_t token) const {
  return Text(token, bos_ >= 0 && previous == bos_);
}

std::string Tokenizer::Detokenize(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    out += Text(ids[i], i == 0 || (bos_ >= 0 && ids[i - 1] == bos_));
  }
  return out;
}

}  // namespace kvq
