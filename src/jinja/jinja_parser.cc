// The Jinja parser (jinja_parser.h). Precedence, loosest first, as in jinja2's parser.py:
//   a if b else c  <  or  <  and  <  not  <  comparisons (== != < <= > >= in, not in; chained)
//   <  + -  <  ~  <  * / // %  <  **  <  unary - +  <  primary with postfix . [] () | is
// so `not x is defined` is not (x is defined), and `'a' + x | trim` trims only x.
#include "jinja/jinja_parser.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <initializer_list>
#include <string_view>

#include "jinja/jinja_builtins.h"

namespace kvq::jinja {
namespace {

using ExprPtr = std::unique_ptr<Expr>;

[[noreturn]] void Fail(uint32_t offset, std::string message) {
  Error error(std::move(message));
  error.set_offset(offset);
  throw error;
}

std::string Describe(const Token& t) {
  // clang-format off
  static constexpr const char* kKinds[] = {"template text", "'{{'", "'}}'", "'{%'", "'%}'", nullptr,
                                           "a string", "a number", "a number", nullptr,
                                           "the end of the template"};
  // clang-format on
  const char* kind = kKinds[static_cast<int>(t.kind)];
  return kind != nullptr ? kind : "'" + t.text + "'";
}

bool IsRefusedTag(std::string_view name) {
  static constexpr std::string_view kRefused[] = {
      "macro", "call", "filter",     "include", "import", "from",     "extends", "block",
      "with",  "do",   "autoescape", "trans",   "break",  "continue", "raw"};
  return std::find(std::begin(kRefused), std::end(kRefused), name) != std::end(kRefused);
}

class Parser {
 public:
  explicit Parser(std::string_view normalized) : lexer_(normalized) {}

  Body Template() {
    Body body = Block({});
    if (Peek().kind != TokenKind::kEnd) Fail(Peek().offset, "unexpected " + Describe(Peek()));
    return body;
  }

 private:
  // Nesting guard: one level per block, bracket, unary operator or parenthesised expression.
  struct Nest {
    explicit Nest(Parser* parser) : p(parser) {
      if (++p->nesting_ > kMaxNesting) {
        Fail(p->Peek().offset, fmt::format("template nests deeper than {} levels", kMaxNesting));
      }
    }
    ~Nest() { --p->nesting_; }
    Parser* p;
  };

  /// The token `ahead` places on. The reference lasts until the next Next().
  const Token& Peek(size_t ahead = 0) {
    while (lookahead_.size() <= ahead) lookahead_.push_back(lexer_.Next());
    return lookahead_[ahead];
  }
  Token Next() {
    Peek();
    Token t = std::move(lookahead_.front());
    lookahead_.pop_front();
    return t;
  }
  bool IsOp(std::string_view op, size_t ahead = 0) {
    return Peek(ahead).kind == TokenKind::kOperator && Peek(ahead).text == op;
  }
  bool IsName(std::string_view name, size_t ahead = 0) {
    return Peek(ahead).kind == TokenKind::kName && Peek(ahead).text == name;
  }
  /// Consumes the next token, which must be as `ok` says: else "expected WHAT, found ...".
  Token ExpectThat(bool ok, std::string_view what) {
    if (!ok) Fail(Peek().offset, fmt::format("expected {}, found {}", what, Describe(Peek())));
    return Next();
  }
  void ExpectOp(std::string_view op) { ExpectThat(IsOp(op), fmt::format("'{}'", op)); }
  void Expect(TokenKind kind, std::string_view what) { ExpectThat(Peek().kind == kind, what); }
  std::string ExpectName() { return ExpectThat(Peek().kind == TokenKind::kName, "a name").text; }

  // ---- statements ----

  /// Statements up to a `{% <one of ends> %}` (left unconsumed: the caller reads which) or the end
  /// of the template, which is an error inside a block: the last of `ends` closes the block that
  /// starts at `opener`.
  Body Block(std::initializer_list<std::string_view> ends, uint32_t opener = 0) {
    Body body;
    while (true) {
      const Token t = Peek();  // a copy: Next() ends a Peek()'s reference
      if (t.kind == TokenKind::kEnd) {
        if (ends.size() != 0) {
          const std::string_view closer = ends.end()[-1];
          Fail(opener, fmt::format("'{{% {} %}}' is never closed: no '{{% {} %}}' before the end",
                                   closer.substr(3), closer));
        }
        return body;
      }
      if (t.kind == TokenKind::kText) {
        Stmt s{StmtKind::kText, t.offset};
        s.text = Next().text;
        body.push_back(std::make_unique<Stmt>(std::move(s)));
      } else if (t.kind == TokenKind::kVariableBegin) {
        Next();
        Stmt s{StmtKind::kOutput, t.offset};
        s.expr = Tuple(/*with_conditional=*/true);
        Expect(TokenKind::kVariableEnd, "'}}'");
        body.push_back(std::make_unique<Stmt>(std::move(s)));
      } else if (t.kind == TokenKind::kBlockBegin) {
        const Token& name = Peek(1);
        if (name.kind == TokenKind::kName &&
            std::find(ends.begin(), ends.end(), name.text) != ends.end()) {
          return body;
        }
        Next();
        body.push_back(std::make_unique<Stmt>(Statement()));
      } else {
        Fail(t.offset, "unexpected " + Describe(t));
      }
    }
  }

  /// `{% name` has been read up to the name; reads through the closing tag of the statement.
  Stmt Statement() {
    Nest nest(this);
    if (Peek().kind != TokenKind::kName) {
      Fail(Peek().offset, "expected a tag name, found " + Describe(Peek()));
    }
    const Token t = Next();
    const std::string& name = t.text;
    if (name == "if") return If(t.offset);
    if (name == "for") return For(t.offset);
    if (name == "set") return Set(t.offset);
    if (name == "generation") {
      Stmt s{StmtKind::kBlock, t.offset};
      Expect(TokenKind::kBlockEnd, "'%}'");
      s.body = Block({"endgeneration"}, t.offset);
      EndTag("endgeneration");
      return s;
    }
    if (IsRefusedTag(name)) Fail(t.offset, "unsupported construct '" + name + "'");
    Fail(t.offset, "unknown or misplaced tag '" + name + "'");
  }

  /// Reads `{% name %}`.
  void EndTag(std::string_view name) {
    Expect(TokenKind::kBlockBegin, "'{%'");
    if (!IsName(name)) Fail(Peek().offset, fmt::format("expected '{}'", name));
    Next();
    Expect(TokenKind::kBlockEnd, "'%}'");
  }

  /// if, then any number of elif (read in a loop, not by recursion: a chain may be long), else.
  Stmt If(uint32_t offset) {
    Stmt s{StmtKind::kIf, offset};
    while (true) {
      Branch branch;
      branch.test = Expression(true);
      Expect(TokenKind::kBlockEnd, "'%}'");
      branch.body = Block({"elif", "else", "endif"}, offset);
      s.branches.push_back(std::move(branch));
      Expect(TokenKind::kBlockBegin, "'{%'");
      const std::string next = Next().text;
      if (next == "elif") continue;
      if (next == "else") {
        Expect(TokenKind::kBlockEnd, "'%}'");
        s.orelse = Block({"endif"}, offset);
        EndTag("endif");
        return s;
      }
      Expect(TokenKind::kBlockEnd, "'%}'");  // endif
      return s;
    }
  }

  /// Names for `for` and `set`: `a`, `a, b` or `(a, b)`.
  std::vector<std::string> Targets() {
    const bool parenthesised = IsOp("(");
    if (parenthesised) Next();
    std::vector<std::string> names{ExpectName()};
    while (IsOp(",")) {
      Next();
      if (Peek().kind != TokenKind::kName) break;
      names.push_back(ExpectName());
    }
    if (parenthesised) ExpectOp(")");
    return names;
  }

  Stmt For(uint32_t offset) {
    Stmt s{StmtKind::kFor, offset};
    s.targets = Targets();
    if (!IsName("in"))
      Fail(Peek().offset, "expected 'in' in a for loop, found " + Describe(Peek()));
    Next();
    s.expr = Tuple(/*with_conditional=*/false);
    if (IsName("if")) {
      Next();
      s.filter = Expression(true);
    }
    if (IsName("recursive")) Fail(Peek().offset, "unsupported construct 'recursive' loop");
    Expect(TokenKind::kBlockEnd, "'%}'");
    s.body = Block({"else", "endfor"}, offset);
    if (IsName("else", 1)) {
      Next(), Next();
      Expect(TokenKind::kBlockEnd, "'%}'");
      s.orelse = Block({"endfor"}, offset);
    }
    EndTag("endfor");
    return s;
  }

  Stmt Set(uint32_t offset) {
    Stmt s{StmtKind::kSet, offset};
    if (Peek().kind == TokenKind::kName && IsOp(".", 1)) {
      s.targets = {Next().text};
      Next();
      s.attribute = ExpectName();
    } else {
      s.targets = Targets();
    }
    if (IsOp("=")) {
      Next();
      s.expr = Tuple(true);
      Expect(TokenKind::kBlockEnd, "'%}'");
      return s;
    }
    if (!s.attribute.empty() || s.targets.size() != 1) {
      Fail(Peek().offset, "expected '=' after the targets of a set");
    }
    if (IsOp("|")) Fail(Peek().offset, "unsupported construct: filtered block set");
    Expect(TokenKind::kBlockEnd, "'%}'");
    s.kind = StmtKind::kSetBlock;
    s.body = Block({"endset"}, offset);
    EndTag("endset");
    return s;
  }

  // ---- expressions ----

  ExprPtr Make(ExprKind kind, uint32_t offset, std::vector<ExprPtr> args = {}) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->offset = offset;
    e->args = std::move(args);
    return e;
  }
  /// Sets the height of `e` from its children and refuses a tree taller than the limit.
  ExprPtr Finish(ExprPtr e) {
    int depth = 0;
    for (const ExprPtr& a : e->args) depth = std::max(depth, a ? a->depth : 0);
    for (const auto& kv : e->kwargs) depth = std::max(depth, kv.second->depth);
    e->depth = depth + 1;
    if (e->depth > kMaxExpressionDepth) {
      Fail(e->offset, fmt::format("expression deeper than {} operations", kMaxExpressionDepth));
    }
    return e;
  }
  ExprPtr Literal(uint32_t offset, Value value) {
    ExprPtr e = Make(ExprKind::kLiteral, offset);
    e->literal = std::move(value);
    return e;
  }
  /// A node with one child.
  ExprPtr Wrap(ExprKind kind, uint32_t offset, ExprPtr child) {
    std::vector<ExprPtr> args;
    args.push_back(std::move(child));
    return Finish(Make(kind, offset, std::move(args)));
  }
  ExprPtr Binary(ExprKind kind, Op op, uint32_t offset, ExprPtr a, ExprPtr b) {
    std::vector<ExprPtr> args;
    args.push_back(std::move(a));
    args.push_back(std::move(b));
    ExprPtr e = Make(kind, offset, std::move(args));
    e->ops.push_back(op);
    return Finish(std::move(e));
  }

  /// jinja2's parse_tuple: an expression, or a tuple when commas follow.
  ExprPtr Tuple(bool with_conditional) {
    const uint32_t offset = Peek().offset;
    ExprPtr first = Expression(with_conditional);
    if (!IsOp(",")) return first;
    std::vector<ExprPtr> items;
    items.push_back(std::move(first));
    while (IsOp(",")) {
      Next();
      if (Peek().kind == TokenKind::kVariableEnd || Peek().kind == TokenKind::kBlockEnd ||
          IsOp(")"))
        break;
      items.push_back(Expression(with_conditional));
    }
    return Finish(Make(ExprKind::kTuple, offset, std::move(items)));
  }

  ExprPtr Expression(bool with_conditional) {
    Nest nest(this);
    ExprPtr e = Or();
    while (with_conditional && IsName("if")) {
      const uint32_t offset = Next().offset;
      std::vector<ExprPtr> args;
      args.push_back(Or());
      args.push_back(std::move(e));
      if (IsName("else")) {
        Next();
        args.push_back(Expression(true));
      } else {
        args.push_back(nullptr);
      }
      e = Finish(Make(ExprKind::kConditional, offset, std::move(args)));
    }
    return e;
  }

  ExprPtr Or() {
    ExprPtr e = And();
    while (IsName("or")) {
      const uint32_t offset = Next().offset;
      e = Binary(ExprKind::kOr, Op::kEq, offset, std::move(e), And());
    }
    return e;
  }

  ExprPtr And() {
    ExprPtr e = Not();
    while (IsName("and")) {
      const uint32_t offset = Next().offset;
      e = Binary(ExprKind::kAnd, Op::kEq, offset, std::move(e), Not());
    }
    return e;
  }

  ExprPtr Not() {
    if (IsName("not")) {
      Nest nest(this);
      const uint32_t offset = Next().offset;
      return Wrap(ExprKind::kNot, offset, Not());
    }
    return Compare();
  }

  ExprPtr Compare() {
    const uint32_t offset = Peek().offset;
    ExprPtr first = Sum();
    std::vector<ExprPtr> args;
    std::vector<Op> ops;
    static constexpr std::pair<std::string_view, Op> kOps[] = {{"==", Op::kEq}, {"!=", Op::kNe},
                                                               {"<", Op::kLt},  {"<=", Op::kLe},
                                                               {">", Op::kGt},  {">=", Op::kGe}};
    while (true) {
      const Op* op = nullptr;
      for (const auto& [text, o] : kOps) {
        if (IsOp(text)) op = &o;
      }
      if (op != nullptr) {
        Next();
        ops.push_back(*op);
      } else if (IsName("in")) {
        Next();
        ops.push_back(Op::kIn);
      } else if (IsName("not") && IsName("in", 1)) {
        Next(), Next();
        ops.push_back(Op::kNotIn);
      } else {
        break;
      }
      args.push_back(Sum());
    }
    if (ops.empty()) return first;
    args.insert(args.begin(), std::move(first));
    ExprPtr e = Make(ExprKind::kCompare, offset, std::move(args));
    e->ops = std::move(ops);
    return Finish(std::move(e));
  }

  /// One left-associative level of binary operators.
  template <typename Operand>
  ExprPtr BinaryLevel(std::initializer_list<std::pair<std::string_view, Op>> ops, Operand operand) {
    ExprPtr e = (this->*operand)();
    while (true) {
      const std::pair<std::string_view, Op>* match = nullptr;
      for (const auto& op : ops) {
        if (IsOp(op.first)) match = &op;
      }
      if (match == nullptr) return e;
      const uint32_t offset = Next().offset;
      e = Binary(ExprKind::kBinary, match->second, offset, std::move(e), (this->*operand)());
    }
  }
  ExprPtr Sum() { return BinaryLevel({{"+", Op::kAdd}, {"-", Op::kSub}}, &Parser::Concat); }
  ExprPtr Concat() { return BinaryLevel({{"~", Op::kConcat}}, &Parser::Product); }
  ExprPtr Product() {
    return BinaryLevel({{"*", Op::kMul}, {"/", Op::kDiv}, {"//", Op::kFloorDiv}, {"%", Op::kMod}},
                       &Parser::Power);
  }
  ExprPtr Power() { return BinaryLevel({{"**", Op::kPow}}, &Parser::UnaryWithFilters); }
  ExprPtr UnaryWithFilters() { return Unary(true); }

  ExprPtr Unary(bool with_filters) {
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      Nest nest(this);
      const Token& op = Next();
      e = Wrap(op.text == "-" ? ExprKind::kNegate : ExprKind::kPlus, op.offset, Unary(false));
    } else {
      e = Primary();
    }
    e = Postfix(std::move(e));
    return with_filters ? FiltersAndTests(std::move(e)) : std::move(e);
  }

  ExprPtr Primary() {
    const Token& t = Next();
    switch (t.kind) {
      case TokenKind::kName: {
        ExprPtr e = Make(ExprKind::kLiteral, t.offset);
        if (t.text == "true" || t.text == "True") {
          e->literal = Value::Bool(true);
        } else if (t.text == "false" || t.text == "False") {
          e->literal = Value::Bool(false);
        } else if (t.text == "none" || t.text == "None") {
          e->literal = Value::None();
        } else {
          e->kind = ExprKind::kName;
          e->name = t.text;
        }
        return e;
      }
      case TokenKind::kString: {
        std::string value = t.text;
        while (Peek().kind == TokenKind::kString) value += Next().text;  // 'a' 'b' is 'ab'
        return Literal(t.offset, Value::String(std::move(value)));
      }
      case TokenKind::kInteger:
      case TokenKind::kFloat:
        return Literal(t.offset, t.kind == TokenKind::kInteger ? Value::Int(t.integer)
                                                               : Value::Float(t.floating));
      case TokenKind::kOperator:
        if (t.text == "(") {
          Nest nest(this);
          if (IsOp(")")) {
            Next();
            return Make(ExprKind::kTuple, t.offset);
          }
          ExprPtr e = Tuple(true);
          ExpectOp(")");
          return e;
        }
        if (t.text == "[" || t.text == "{") return Collection(t);
        break;
      default:
        break;
    }
    Fail(t.offset, "unexpected " + Describe(t) + " in an expression");
  }

  /// A list `[a, b]` or a dict `{k: v, ...}` after its opening bracket; trailing commas allowed.
  ExprPtr Collection(const Token& open) {
    Nest nest(this);
    const bool dict = open.text == "{";
    const std::string_view close = dict ? "}" : "]";
    std::vector<ExprPtr> items;
    while (!IsOp(close)) {
      if (!items.empty()) {
        ExpectOp(",");
        if (IsOp(close)) break;
      }
      items.push_back(Expression(true));
      if (dict) {
        ExpectOp(":");
        items.push_back(Expression(true));
      }
    }
    Next();
    return Finish(Make(dict ? ExprKind::kDict : ExprKind::kList, open.offset, std::move(items)));
  }

  ExprPtr Postfix(ExprPtr e) {
    while (true) {
      if (IsOp(".")) {
        const uint32_t offset = Next().offset;
        std::vector<ExprPtr> args;
        args.push_back(std::move(e));
        if (Peek().kind == TokenKind::kInteger) {  // foo.0 is foo[0]
          const Token& index = Next();
          args.push_back(Literal(index.offset, Value::Int(index.integer)));
          e = Finish(Make(ExprKind::kItem, offset, std::move(args)));
        } else {
          e = Make(ExprKind::kAttribute, offset, std::move(args));
          e->name = ExpectName();
          e = Finish(std::move(e));
        }
      } else if (IsOp("[")) {
        e = Subscript(std::move(e));
      } else if (IsOp("(")) {
        e = Call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr Subscript(ExprPtr object) {
    Nest nest(this);
    const uint32_t offset = Next().offset;
    std::vector<ExprPtr> args;
    args.push_back(std::move(object));
    // Up to three parts separated by ':'; any ':' makes it a slice.
    std::vector<ExprPtr> parts(1);
    bool slice = false;
    while (!IsOp("]")) {
      if (IsOp(":")) {
        Next();
        slice = true;
        if (parts.size() == 3) Fail(offset, "a slice has at most three parts");
        parts.emplace_back();
      } else if (IsOp(",")) {
        Fail(Peek().offset, "unsupported construct: tuple subscript");
      } else {
        if (parts.back()) Fail(Peek().offset, "expected ']' or ':', found " + Describe(Peek()));
        parts.back() = Expression(true);
      }
    }
    Next();
    if (!slice) {
      if (!parts[0]) Fail(offset, "empty subscript");
      args.push_back(std::move(parts[0]));
      return Finish(Make(ExprKind::kItem, offset, std::move(args)));
    }
    parts.resize(3);
    for (ExprPtr& p : parts) args.push_back(std::move(p));
    return Finish(Make(ExprKind::kSlice, offset, std::move(args)));
  }

  /// Reads `(args, name=value)` into e's args (after those it has) and kwargs.
  void Arguments(Expr* e) {
    Nest nest(this);
    ExpectOp("(");
    while (!IsOp(")")) {
      if (IsOp("*") || IsOp("**")) Fail(Peek().offset, "unsupported construct: argument unpacking");
      if (Peek().kind == TokenKind::kName && IsOp("=", 1)) {
        std::string key = Next().text;
        Next();
        e->kwargs.emplace_back(std::move(key), Expression(true));
      } else {
        if (!e->kwargs.empty())
          Fail(Peek().offset, "a positional argument follows a keyword argument");
        e->args.push_back(Expression(true));
      }
      if (!IsOp(",")) break;
      Next();
    }
    ExpectOp(")");
  }

  ExprPtr Call(ExprPtr callee) {
    ExprPtr e = Make(ExprKind::kCall, Peek().offset);
    e->args.push_back(std::move(callee));
    Arguments(e.get());
    return Finish(std::move(e));
  }

  /// Dotted names are allowed for filters and tests in jinja2; none of ours has a dot.
  ExprPtr FiltersAndTests(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        Next();
        const uint32_t offset = Peek().offset;
        ExprPtr f = Make(ExprKind::kFilter, offset);
        f->name = ExpectName();
        if (!IsKnownFilter(f->name)) Fail(offset, "unsupported filter '" + f->name + "'");
        f->args.push_back(std::move(e));
        if (IsOp("(")) Arguments(f.get());
        e = Finish(std::move(f));
      } else if (IsName("is")) {
        Next();
        ExprPtr test = Make(ExprKind::kTest, Peek().offset);
        if (IsName("not")) {
          Next();
          test->negated = true;
        }
        const uint32_t offset = Peek().offset;
        if (Peek().kind != TokenKind::kName) {
          Fail(offset, "expected a test name after 'is', found " + Describe(Peek()));
        }
        test->name = Next().text;
        if (!IsKnownTest(test->name)) Fail(offset, "unsupported test '" + test->name + "'");
        test->args.push_back(std::move(e));
        const Token& next = Peek();
        if (IsOp("(")) {
          Arguments(test.get());
        } else if ((next.kind == TokenKind::kName || next.kind == TokenKind::kString ||
                    next.kind == TokenKind::kInteger || next.kind == TokenKind::kFloat ||
                    IsOp("[") || IsOp("{")) &&
                   !IsName("else") && !IsName("or") && !IsName("and")) {
          // `x is divisibleby 3`, `x is sameas none`: one argument without parentheses.
          if (IsName("is")) Fail(next.offset, "tests cannot be chained without parentheses");
          test->args.push_back(Postfix(Primary()));
        }
        e = Finish(std::move(test));
      } else if (IsOp("(")) {
        e = Call(std::move(e));
      } else {
        return e;
      }
    }
  }

  Lexer lexer_;
  std::deque<Token> lookahead_;  // tokens read from lexer_ and not yet consumed
  int nesting_ = 0;
};

}  // namespace

Body Parse(std::string_view normalized) { return Parser(normalized).Template(); }

}  // namespace kvq::jinja
