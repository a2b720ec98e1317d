// The Jinja parser: tokens -> statements (jinja_ast.h), following jinja2's grammar and operator
// precedence (parser.py), for the subset chat templates use. What it refuses, each with the
// line:column of the construct: macro, call, filter blocks, include/import/extends/block, with,
// raw, do, break/continue, recursive loops, `*args`/`**kwargs`, tuple subscripts, and any filter or
// test the interpreter does not implement (jinja2 too refuses unknown filters and tests when it
// compiles a template, not when it renders it).
#pragma once

#include <vector>

#include "jinja/jinja_ast.h"
#include "jinja/jinja_lexer.h"

namespace kvq::jinja {

/// How deep tags, brackets and unary operators may nest in the source; each level is a few frames
/// of the parser's recursion.
inline constexpr int kMaxNesting = 64;
/// How tall an expression tree may be (`a + b + c + ...` grows it by one per operator); the
/// interpreter recurses, and the tree is freed recursively, along it.
inline constexpr int kMaxExpressionDepth = 128;

/// The statements of a template (its source after NormalizeTemplateSource). Throws Error with an
/// offset.
Body Parse(std::string_view normalized);

}  // namespace kvq::jinja
