// The syntax tree of a parsed chat template (jinja_parser.h builds it, jinja_eval.h runs it). One
// node type for expressions and one for statements, each with a kind and generic children, rather
// than a class per construct: the interpreter switches on the kind in one place.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/jinja_value.h"

namespace kvq::jinja {

enum class ExprKind : uint8_t {
  kLiteral,      ///< literal
  kName,         ///< a variable: name
  kList,         ///< [args...]
  kTuple,        ///< (args...): a list at run time
  kDict,         ///< {args[0]: args[1], args[2]: args[3], ...}
  kAttribute,    ///< args[0].name
  kItem,         ///< args[0][args[1]]
  kSlice,        ///< args[0][args[1]:args[2]:args[3]], a null child where omitted
  kCall,         ///< args[0](args[1..], kwargs): a global function, or a method when args[0] is
                 ///< a kAttribute
  kFilter,       ///< args[0] | name(args[1..], kwargs)
  kTest,         ///< args[0] is [not] name(args[1..], kwargs)
  kNot,          ///< not args[0]
  kNegate,       ///< -args[0]
  kPlus,         ///< +args[0]
  kBinary,       ///< args[0] ops[0] args[1]: + - * / // % ** ~
  kAnd,          ///< args[0] and args[1] (Python's: the deciding operand)
  kOr,           ///< args[0] or args[1]
  kCompare,      ///< args[0] ops[0] args[1] ops[1] args[2] ...: chained, as in Python
  kConditional,  ///< args[1] if args[0] else args[2] (args[2] null: undefined)
};

// clang-format off
enum class Op : uint8_t {
  kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow, kConcat,  // kBinary
  kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn,               // kCompare
};
// clang-format on

struct Expr {
  ExprKind kind;
  uint32_t offset = 0;   ///< where it is in the normalised source, for error messages
  bool negated = false;  ///< kTest: `is not`
  int depth = 1;         ///< height of the subtree (the parser bounds it)
  std::string name;
  Value literal;
  std::vector<Op> ops;
  std::vector<std::unique_ptr<Expr>> args;
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
};

enum class StmtKind : uint8_t {
  kText,      ///< text
  kOutput,    ///< {{ expr }}
  kIf,        ///< the body of the first branch whose test holds, else orelse
  kFor,       ///< for targets in expr [if filter]: body, else orelse (no iteration)
  kSet,       ///< set targets = expr, or targets[0].attribute = expr
  kSetBlock,  ///< set targets[0]: the rendered body
  kBlock,     ///< body rendered as it is ({% generation %}, transformers' marker)
};

struct Stmt;
/// Statements are held by pointer: a body's vector then costs 8 bytes per statement, so that no
/// single allocation grows faster than the template (the fuzz targets' allocation rule).
using Body = std::vector<std::unique_ptr<Stmt>>;

/// One `if` or `elif` of a kIf.
struct Branch {
  std::unique_ptr<Expr> test;
  Body body;
};

struct Stmt {
  StmtKind kind;
  uint32_t offset = 0;
  std::string text;
  std::unique_ptr<Expr> expr;
  std::unique_ptr<Expr> filter;
  std::vector<std::string> targets;  ///< more than one: tuple unpacking
  std::string attribute;             ///< kSet on a namespace attribute
  std::vector<Branch> branches;      ///< kIf
  Body body, orelse;
};

}  // namespace kvq::jinja
