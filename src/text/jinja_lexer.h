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

/// Tokens of a normalised source, ending with kEnd. Throws Error (with an offset) on an
/// unterminated tag, comment or string, a bad escape or number, or a character Jinja does not know.
std::vector<Token> Tokenize(std::string_view normalized);

/// "line:column" (1-based; the column counts characters) of `offset` in `text`.
std::string LineColumn(std::string_view text, size_t offset);

}  // namespace kvq::jinja
