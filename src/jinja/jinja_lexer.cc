// The Jinja lexer (jinja_lexer.h), written after jinja2's lexer.py: the same tag,
// whitespace-control and literal rules, so that a template's text comes out byte for byte as
// transformers renders it.
#include "jinja/jinja_lexer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "jinja/jinja_value.h"
#include "text/unicode.h"

namespace kvq::jinja {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

[[noreturn]] void Fail(size_t offset, std::string message) {
  Error error(std::move(message));
  error.set_offset(offset);
  throw error;
}

/// Python whitespace at `at`, or 0: its length in bytes.
size_t SpaceAt(std::string_view s, size_t at) {
  const unicode::Decoded d = unicode::DecodeUtf8(s, at);
  return IsPySpace(d.code_point) ? d.n_bytes : 0;
}

/// `text` without its trailing Python whitespace (str.rstrip()).
std::string_view RStrip(std::string_view text) {
  size_t end = 0;  // past the last non-space character
  for (size_t at = 0; at < text.size();) {
    const size_t space = SpaceAt(text, at);
    at += space != 0 ? space : unicode::DecodeUtf8(text, at).n_bytes;
    if (space == 0) end = at;
  }
  return text.substr(0, end);
}

bool AllSpace(std::string_view text) {
  for (size_t at = 0; at < text.size();) {
    const size_t n = SpaceAt(text, at);
    if (n == 0) return false;
    at += n;
  }
  return true;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

Lexer::Lexer(std::string_view normalized) : src_(normalized) {}

Token Lexer::Next() {
  while (queue_.empty()) Step();
  Token t = std::move(queue_.front());
  queue_.pop_front();
  return t;
}

void Lexer::Step() {
  if (!in_tag_) {
    if (pos_ >= src_.size()) {
      queue_.push_back(Token{TokenKind::kEnd, Offset(src_.size()), ""});
      return;
    }
    const size_t start = FindTagStart(pos_);
    std::string_view text = src_.substr(pos_, start - pos_);
    if (start == src_.size()) {
      AddText(pos_, text);
      pos_ = start;
      return;
    }
    const char open = src_[start + 1];  // '{', '%' or '#'
    const char sign = start + 2 < src_.size() ? src_[start + 2] : '\0';
    if (sign == '-') {
      text = RStrip(text);
    } else if (sign != '+' && open != '{') {
      // lstrip_blocks: the text from the last newline (or from a line start) to the tag.
      const size_t newline = text.rfind('\n');
      const size_t line_start = newline == std::string_view::npos ? 0 : newline + 1;
      const bool at_line_start = line_start > 0 || pos_ == 0 || src_[pos_ - 1] == '\n';
      if (at_line_start && AllSpace(text.substr(line_start))) text = text.substr(0, line_start);
    }
    AddText(pos_, text);
    const size_t body = start + 2 + (sign == '-' || sign == '+' ? 1 : 0);
    if (open == '#') {
      pos_ = SkipComment(start, body);
      return;
    }
    block_ = open == '%';
    queue_.push_back(
        Token{block_ ? TokenKind::kBlockBegin : TokenKind::kVariableBegin, Offset(start), ""});
    if (block_) RefuseRaw(body);
    in_tag_ = true;
    tag_start_ = start;
    brackets_ = 0;
    pos_ = body;
    return;
  }
  // Inside a tag: one token, or the end of the tag.
  const std::string_view close = block_ ? "%}" : "}}";
  const size_t at = SkipSpace(pos_);
  if (at >= src_.size()) {
    Fail(tag_start_,
         fmt::format("unterminated tag: no '{}' before the end of the template", close));
  }
  if (brackets_ == 0) {
    const char sign = src_[at];
    const bool signed_close =
        (sign == '-' || (sign == '+' && block_)) && src_.substr(at + 1, 2) == close;
    if (signed_close || src_.substr(at, 2) == close) {
      queue_.push_back(
          Token{block_ ? TokenKind::kBlockEnd : TokenKind::kVariableEnd, Offset(at), ""});
      const size_t after = at + 2 + (signed_close ? 1 : 0);
      const char effective = signed_close ? sign : '\0';
      pos_ = block_ ? AfterBlockEnd(after, effective) : effective == '-' ? SkipSpace(after) : after;
      in_tag_ = false;
      return;
    }
  }
  pos_ = LexToken(at);
}

size_t Lexer::FindTagStart(size_t pos) const {
  for (size_t at = src_.find('{', pos); at != std::string_view::npos; at = src_.find('{', at + 1)) {
    if (at + 1 < src_.size() &&
        (src_[at + 1] == '{' || src_[at + 1] == '%' || src_[at + 1] == '#')) {
      return at;
    }
  }
  return src_.size();
}

void Lexer::AddText(size_t pos, std::string_view text) {
  if (!text.empty()) queue_.push_back(Token{TokenKind::kText, Offset(pos), std::string(text)});
}

size_t Lexer::AfterBlockEnd(size_t end, char sign) const {
  if (sign == '-') return SkipSpace(end);
  if (sign != '+' && end < src_.size() && src_[end] == '\n') return end + 1;
  return end;
}

size_t Lexer::SkipSpace(size_t at) const {
  while (at < src_.size()) {
    const size_t n = SpaceAt(src_, at);
    if (n == 0) break;
    at += n;
  }
  return at;
}

size_t Lexer::SkipComment(size_t start, size_t body) const {
  const size_t close = src_.find("#}", body);
  if (close == std::string_view::npos) Fail(start, "unterminated comment: no '#}'");
  const char sign = close > body ? src_[close - 1] : '\0';
  return AfterBlockEnd(close + 2, sign);
}

void Lexer::RefuseRaw(size_t body) const {
  const size_t at = SkipSpace(body);
  if (src_.substr(at, 3) == "raw" && (at + 3 >= src_.size() || !IsNameChar(src_[at + 3]))) {
    Fail(at, "unsupported construct 'raw'");
  }
}

size_t Lexer::LexToken(size_t at) {
  const char c = src_[at];
  if (IsNameStart(c)) {
    size_t end = at;
    while (end < src_.size() && IsNameChar(src_[end])) ++end;
    queue_.push_back(Token{TokenKind::kName, Offset(at), std::string(src_.substr(at, end - at))});
    return end;
  }
  if (IsDigit(c)) return LexNumber(at);
  if (c == '\'' || c == '"') return LexString(at);
  static constexpr std::string_view kTwoChar[] = {"**", "//", "==", "!=", "<=", ">="};
  for (const std::string_view op : kTwoChar) {
    if (src_.substr(at, 2) == op) {
      queue_.push_back(Token{TokenKind::kOperator, Offset(at), std::string(op)});
      return at + 2;
    }
  }
  if (std::string_view("+-*/%~<>=()[]{},.:|").find(c) == std::string_view::npos) {
    const unicode::Decoded d = unicode::DecodeUtf8(src_, at);
    Fail(at, fmt::format("unexpected character '{}' in a tag", src_.substr(at, d.n_bytes)));
  }
  if (c == '(' || c == '[' || c == '{') ++brackets_;
  if ((c == ')' || c == ']' || c == '}') && brackets_ > 0) --brackets_;
  queue_.push_back(Token{TokenKind::kOperator, Offset(at), std::string(1, c)});
  return at + 1;
}

/// jinja2's integer and float literals: digits with optional '_' separators, a fraction only
/// when a digit follows the '.', an optional exponent.
size_t Lexer::LexNumber(size_t at) {
  auto digits = [&](size_t p) {
    while (p < src_.size() &&
           (IsDigit(src_[p]) || (src_[p] == '_' && p + 1 < src_.size() && IsDigit(src_[p + 1])))) {
      ++p;
    }
    return p;
  };
  size_t end = digits(at);
  bool is_float = false;
  const bool after_dot = at > 0 && src_[at - 1] == '.';  // foo.0.1 is two item accesses
  if (!after_dot && end + 1 < src_.size() && src_[end] == '.' && IsDigit(src_[end + 1])) {
    end = digits(end + 1);
    is_float = true;
  }
  if (!after_dot && end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
    size_t p = end + 1;
    if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
    if (p < src_.size() && IsDigit(src_[p])) {
      end = digits(p);
      is_float = true;
    }
  }
  std::string text;
  for (const char ch : src_.substr(at, end - at)) {
    if (ch != '_') text += ch;
  }
  Token token{is_float ? TokenKind::kFloat : TokenKind::kInteger, Offset(at), text};
  if (is_float) {
    token.floating = std::strtod(text.c_str(), nullptr);
  } else {
    unsigned long long v = 0;
    for (const char ch : text) {
      const unsigned long long digit = static_cast<unsigned long long>(ch - '0');
      if (v > (static_cast<unsigned long long>(std::numeric_limits<int64_t>::max()) - digit) / 10) {
        Fail(at, "integer literal " + text + " does not fit in 64 bits");
      }
      v = v * 10 + digit;
    }
    token.integer = static_cast<int64_t>(v);
  }
  queue_.push_back(std::move(token));
  return end;
}

/// A quoted string; escapes as Python's unicode-escape codec reads them (what jinja2 applies):
/// \\ \' \" \a \b \f \n \r \t \v, \ooo, \xhh, \uhhhh, \Uhhhhhhhh, backslash-newline; any other
/// backslash stays as it is.
size_t Lexer::LexString(size_t at) {
  const char quote = src_[at];
  std::string value;
  size_t p = at + 1;
  while (true) {
    if (p >= src_.size()) Fail(at, "unterminated string literal");
    const char c = src_[p];
    if (c == quote) break;
    if (c != '\\') {
      value += c;
      ++p;
      continue;
    }
    if (p + 1 >= src_.size()) Fail(at, "unterminated string literal");
    const char e = src_[p + 1];
    p += 2;
    switch (e) {
      case '\\':
        value += '\\';
        break;
      case '\'':
        value += '\'';
        break;
      case '"':
        value += '"';
        break;
      case 'a':
        value += '\a';
        break;
      case 'b':
        value += '\b';
        break;
      case 'f':
        value += '\f';
        break;
      case 'n':
        value += '\n';
        break;
      case 'r':
        value += '\r';
        break;
      case 't':
        value += '\t';
        break;
      case 'v':
        value += '\v';
        break;
      case '\n':
        break;
      case 'x':
      case 'u':
      case 'U': {
        const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t code_point = 0;
        for (int i = 0; i < n; ++i, ++p) {
          const int h = p < src_.size() ? HexValue(src_[p]) : -1;
          if (h < 0) Fail(p - 2 - i, fmt::format("truncated \\{} escape in a string literal", e));
          code_point = code_point * 16 + static_cast<uint32_t>(h);
        }
        if (code_point > 0x10FFFF) Fail(p - 2 - n, "\\U escape beyond U+10FFFF");
        unicode::AppendUtf8(code_point, value);
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          uint32_t code_point = static_cast<uint32_t>(e - '0');
          for (int i = 0; i < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++i, ++p) {
            code_point = code_point * 8 + static_cast<uint32_t>(src_[p] - '0');
          }
          unicode::AppendUtf8(code_point, value);
        } else {
          value += '\\';
          value += e;
        }
    }
  }
  queue_.push_back(Token{TokenKind::kString, Offset(at), std::move(value)});
  return p + 1;
}

std::string NormalizeTemplateSource(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::string LineColumn(std::string_view text, size_t offset) {
  offset = std::min(offset, text.size());
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') ++line, line_start = i + 1;
  }
  return fmt::format("{}:{}", line, CharCount(text.substr(line_start, offset - line_start)) + 1);
}

}  // namespace kvq::jinja
