// The Jinja lexer: template text -> tokens, with the whitespace rules transformers renders chat
// templates with (jinja2 with trim_blocks=True, lstrip_blocks=True; @huggingface/jinja does the
// same with two regexes over the source):
//  - newlines (\r\n, \r) become \n, and one trailing \n of the template is dropped;
//  - `{%-`, `{{-`, `{#-` strip all whitespace before the tag, `-%}`, `-}}`, `-#}` all after it;
//  - lstrip_blocks: whitespace between the start of a line and a `{%` or `{#` is dropped (`{%+`
//    keeps it);
//  - trim_blocks: the first \n after a `%}` or `#}` is dropped (`+%}` keeps it);
//  - comments produce no token.
// Inside a tag, `}}` and `%}` close it only outside brackets (`{{ {'a': {'b': 1}} }}`).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace kvq::jinja {

enum class TokenKind : uint8_t {
  kText,           ///< template text between tags (text: the text, whitespace rules applied)
  kVariableBegin,  ///< {{
  kVariableEnd,    ///< }}
  kBlockBegin,     ///< {%
  kBlockEnd,       ///< %}
  kName,           ///< identifier or keyword (text)
  kString,         ///< string literal (text: the value, escapes resolved)
  kInteger,        ///< integer literal (integer)
  kFloat,          ///< float literal (floating)
  kOperator,       ///< + - * / // % ** ~ == != < <= > >= = ( ) [ ] { } , . : | (text)
  kEnd,            ///< end of the template
};

struct Token {
  TokenKind kind;
  uint32_t offset;  ///< where it starts in the normalised source
  std::string text;
  int64_t integer = 0;
  double floating = 0;
};

/// The source as the lexer reads it: newlines normalised to \n, one trailing \n dropped. Token
/// offsets index this text; its line:column are those of the original (only \r is removed, and
/// only where it ends a line).
std::string NormalizeTemplateSource(std::string_view source);

/// The tokens of a normalised source, made as the parser asks for them (so that memory does not
/// grow with the template: one token at a time, plus the parser's lookahead). Next() throws Error
/// (with an offset) on an unterminated tag, comment or string, a bad escape or number, or a
/// character Jinja does not know; after the last token it returns kEnd forever.
class Lexer {
 public:
  explicit Lexer(std::string_view normalized);
  Token Next();

 private:
  void Step();  // lexes the next piece of the source into queue_
  size_t FindTagStart(size_t pos) const;
  void AddText(size_t pos, std::string_view text);
  /// After a closing `%}` or `#}` at `end` (`sign`: the character before it): `-` strips all
  /// whitespace, `+` nothing, else trim_blocks drops one newline. Returns the new position.
  size_t AfterBlockEnd(size_t end, char sign) const;
  size_t SkipSpace(size_t at) const;
  size_t SkipComment(size_t start, size_t body) const;
  void RefuseRaw(size_t body) const;
  size_t LexToken(size_t at);  // one token inside a tag; returns the position after it
  size_t LexNumber(size_t at);
  size_t LexString(size_t at);
  static uint32_t Offset(size_t pos) { return static_cast<uint32_t>(pos); }

  std::string_view src_;
  std::deque<Token> queue_;
  size_t pos_ = 0;
  bool in_tag_ = false;
  bool block_ = false;    // the tag is {% %} (else {{ }})
  size_t tag_start_ = 0;  // where the open tag began
  int brackets_ = 0;      // brackets open inside the tag: }} and %} close it only at 0
};

/// "line:column" (1-based; the column counts characters) of `offset` in `text`.
std::string LineColumn(std::string_view text, size_t offset);

}  // namespace kvq::jinja
