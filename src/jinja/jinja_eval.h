// The Jinja interpreter: runs a parsed template (jinja_ast.h) over the variables a chat template
// gets, with jinja2's scoping (a `set` inside a for loop lasts one iteration; namespaces carry
// values out of loops), Python's semantics for values (jinja_builtins.h) and the limits of one
// render (jinja_builtins.h's Limits).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "jinja/jinja_ast.h"
#include "jinja/jinja_builtins.h"
#include "jinja/jinja_value.h"

namespace kvq::jinja {

/// A parsed template.
struct Program {
  std::string normalized;  ///< the source as the lexer read it (error offsets index it)
  Body body;
};

/// Renders `program` with `variables` as its global variables (besides the functions range,
/// namespace, dict, raise_exception and strftime_now, which formats `now`), within `limits`.
/// Throws Error.
std::string Render(const Program& program, const Dict& variables, std::chrono::sys_seconds now,
                   const Limits& limits);

}  // namespace kvq::jinja
