// The Jinja interpreter (jinja_eval.h): one switch over statement kinds, one over expression
// kinds. Recursion follows the tree, whose height the parser bounds; every evaluation charges the
// budget, so a template that loops or allocates without end stops with an error.
#include "jinja/jinja_eval.h"

#include <fmt/format.h>

#include "jinja/jinja_builtins.h"

namespace kvq::jinja {
namespace {

class Evaluator {
 public:
  Evaluator(const Dict& variables, Context& ctx) : ctx_(ctx) {
    Dict globals;
    globals.Set("range", Value::Function(Builtin::kRange));
    globals.Set("namespace", Value::Function(Builtin::kNamespace));
    globals.Set("dict", Value::Function(Builtin::kDict));
    globals.Set("raise_exception", Value::Function(Builtin::kRaiseException));
    globals.Set("strftime_now", Value::Function(Builtin::kStrftimeNow));
    scopes_.push_back(std::move(globals));
    scopes_.push_back(variables);
  }

  void Exec(const Body& body, std::string& out) {
    for (const std::unique_ptr<Stmt>& s : body) {
      try {
        ExecOne(*s, out);
      } catch (Error& error) {
        if (!error.has_offset()) error.set_offset(s->offset);
        throw;
      }
    }
  }

 private:
  void ExecOne(const Stmt& s, std::string& out) {
    ctx_.budget.Step();
    switch (s.kind) {
      case StmtKind::kText:
        if (s.text.size() > ctx_.budget.limits().max_output_bytes - out.size()) {
          throw Error(
              fmt::format("text longer than {} bytes", ctx_.budget.limits().max_output_bytes));
        }
        out += s.text;
        return;
      case StmtKind::kOutput:
        AppendStr(Eval(*s.expr), out, ctx_.budget.limits().max_output_bytes);
        return;
      case StmtKind::kIf:
        for (const Branch& branch : s.branches) {
          if (Truthy(Eval(*branch.test))) {
            Exec(branch.body, out);
            return;
          }
        }
        Exec(s.orelse, out);
        return;
      case StmtKind::kFor:
        For(s, out);
        return;
      case StmtKind::kSet: {
        Value value = Eval(*s.expr);
        if (!s.attribute.empty()) {
          const Value ns = Lookup(s.targets[0]);
          if (ns.kind() != Value::Kind::kNamespace) {
            throw Error(fmt::format(
                "cannot set attribute '{}' of '{}': only a namespace has assignable attributes",
                s.attribute, s.targets[0]));
          }
          ns.attributes().Set(s.attribute, std::move(value));
          return;
        }
        Assign(s.targets, std::move(value));
        return;
      }
      case StmtKind::kSetBlock: {
        std::string text;
        Exec(s.body, text);
        Assign(s.targets, NewString(std::move(text), ctx_));
        return;
      }
      case StmtKind::kBlock:
        Exec(s.body, out);
        return;
    }
  }

  /// Binds `targets` in the innermost scope: one name, or a tuple unpacking a list.
  void Assign(const std::vector<std::string>& targets, Value value) {
    Dict& scope = scopes_.back();
    if (targets.size() == 1) {
      scope.Set(targets[0], std::move(value));
      return;
    }
    std::vector<Value> items = value.is_list() ? value.list() : Iterate(value, ctx_);
    if (items.size() != targets.size()) {
      throw Error(
          fmt::format("cannot unpack {} values into {} names", items.size(), targets.size()));
    }
    for (size_t i = 0; i < targets.size(); ++i) scope.Set(targets[i], std::move(items[i]));
  }

  void For(const Stmt& s, std::string& out) {
    std::vector<Value> items = Iterate(Eval(*s.expr), ctx_);
    if (s.filter) {
      std::vector<Value> kept;
      for (Value& item : items) {
        scopes_.emplace_back();
        Assign(s.targets, item);
        const bool keep = Truthy(Eval(*s.filter));
        scopes_.pop_back();
        if (keep) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      Exec(s.orelse, out);
      return;
    }
    // `loop` is one object per loop whose attributes change as it runs, as jinja2's LoopContext
    // (a namespace, so that updating it allocates nothing), emptied when the loop ends (it may
    // have been made to hold itself). The scope is emptied at every iteration: jinja2 forgets a
    // loop body's `set` between iterations.
    const int64_t n = static_cast<int64_t>(items.size());
    Dict state;
    for (const char* key : {"index", "index0", "revindex", "revindex0", "first", "last", "length",
                            "previtem", "nextitem", "depth", "depth0"}) {
      state.items.emplace_back(key, Value());
    }
    ctx_.budget.Bytes(sizeof(Dict) + state.items.size() * sizeof(state.items[0]));
    const Value loop = Value::Namespace(std::make_shared<Dict>(std::move(state)));
    struct Emptied {
      ~Emptied() { loop.attributes().items.clear(); }
      const Value& loop;
    } emptied{loop};
    auto& attrs = loop.attributes().items;
    scopes_.emplace_back();
    for (int64_t i = 0; i < n; ++i) {
      ctx_.budget.Step();
      attrs[0].second = Value::Int(i + 1);
      attrs[1].second = Value::Int(i);
      attrs[2].second = Value::Int(n - i);
      attrs[3].second = Value::Int(n - i - 1);
      attrs[4].second = Value::Bool(i == 0);
      attrs[5].second = Value::Bool(i == n - 1);
      attrs[6].second = Value::Int(n);
      attrs[7].second = i > 0 ? items[static_cast<size_t>(i - 1)] : Value();
      attrs[8].second = i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value();
      attrs[9].second = Value::Int(1);
      attrs[10].second = Value::Int(0);
      Dict& scope = scopes_.back();
      scope.items.clear();
      scope.items.emplace_back("loop", loop);
      Assign(s.targets, items[static_cast<size_t>(i)]);
      Exec(s.body, out);
    }
    scopes_.pop_back();
  }

  Value Lookup(const std::string& name) const {
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      if (const Value* v = scope->Find(name)) return *v;
    }
    return Value();
  }

  Args Arguments(const Expr& e, size_t first) {
    Args args;
    for (size_t i = first; i < e.args.size(); ++i) args.positional.push_back(Eval(*e.args[i]));
    for (const auto& [key, value] : e.kwargs) args.keyword.emplace_back(key, Eval(*value));
    return args;
  }

  Value Eval(const Expr& e) {
    ctx_.budget.Step();
    try {
      return EvalInner(e);
    } catch (Error& error) {
      if (!error.has_offset()) error.set_offset(e.offset);
      throw;
    }
  }

  Value EvalInner(const Expr& e) {
    switch (e.kind) {
      case ExprKind::kLiteral:
        return e.literal;
      case ExprKind::kName:
        return Lookup(e.name);
      case ExprKind::kList:
      case ExprKind::kTuple: {
        std::vector<Value> items;
        for (const auto& a : e.args) items.push_back(Eval(*a));
        return NewList(std::move(items), ctx_);
      }
      case ExprKind::kDict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value key = Eval(*e.args[i]);
          if (!key.is_string())
            throw Error(fmt::format("dict keys must be strings, got '{}'", TypeName(key)));
          d.Set(key.str(), Eval(*e.args[i + 1]));
        }
        ctx_.budget.ListSlots(d.items.size() * 2);
        return Value::Dict(std::move(d));
      }
      case ExprKind::kAttribute:
        return GetAttribute(Eval(*e.args[0]), e.name);
      case ExprKind::kItem:
        return GetItem(Eval(*e.args[0]), Eval(*e.args[1]), ctx_);
      case ExprKind::kSlice: {
        const Value object = Eval(*e.args[0]);
        Value parts[3];
        for (int i = 0; i < 3; ++i) {
          if (e.args[1 + i]) parts[i] = Eval(*e.args[1 + i]);
        }
        return Slice(object, e.args[1] ? &parts[0] : nullptr, e.args[2] ? &parts[1] : nullptr,
                     e.args[3] ? &parts[2] : nullptr, ctx_);
      }
      case ExprKind::kCall:
        return Call(e);
      case ExprKind::kFilter: {
        const Value operand = Eval(*e.args[0]);
        return ApplyFilter(e.name, operand, Arguments(e, 1), ctx_);
      }
      case ExprKind::kTest: {
        const Value operand = Eval(*e.args[0]);
        return Value::Bool(ApplyTest(e.name, operand, Arguments(e, 1), ctx_) != e.negated);
      }
      case ExprKind::kNot:
        return Value::Bool(!Truthy(Eval(*e.args[0])));
      case ExprKind::kNegate:
      case ExprKind::kPlus:
        return Negate(Eval(*e.args[0]), e.kind == ExprKind::kNegate);
      case ExprKind::kBinary: {
        const Value a = Eval(*e.args[0]);
        const Value b = Eval(*e.args[1]);
        return Binary(e.ops[0], a, b, ctx_);
      }
      case ExprKind::kAnd: {
        Value a = Eval(*e.args[0]);
        return Truthy(a) ? Eval(*e.args[1]) : a;
      }
      case ExprKind::kOr: {
        Value a = Eval(*e.args[0]);
        return Truthy(a) ? a : Eval(*e.args[1]);
      }
      case ExprKind::kCompare: {
        Value left = Eval(*e.args[0]);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = Eval(*e.args[i + 1]);
          if (!Compare(e.ops[i], left, right, ctx_)) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case ExprKind::kConditional:
        if (Truthy(Eval(*e.args[0]))) return Eval(*e.args[1]);
        return e.args[2] ? Eval(*e.args[2]) : Value();
    }
    throw Error("unknown expression");
  }

  /// `receiver.method(...)` or `function(...)`.
  Value Call(const Expr& e) {
    const Expr& callee = *e.args[0];
    if (callee.kind == ExprKind::kAttribute) {
      const Value receiver = Eval(*callee.args[0]);
      return CallMethod(receiver, callee.name, Arguments(e, 1), ctx_);
    }
    const Value f = Eval(callee);
    if (f.kind() != Value::Kind::kFunction) {
      if (callee.kind == ExprKind::kName && f.is_undefined()) {
        throw Error(fmt::format("'{}' is undefined", callee.name));
      }
      throw Error(fmt::format("'{}' object is not callable", TypeName(f)));
    }
    return CallFunction(f.function(), Arguments(e, 1), ctx_);
  }

  Context& ctx_;
  std::vector<Dict> scopes_;  // globals, the template's variables, then one per loop iteration
};

}  // namespace

std::string Render(const Program& program, const Dict& variables, std::chrono::sys_seconds now,
                   const Limits& limits) {
  Context ctx(limits);
  ctx.now = now;
  std::string out;
  Evaluator(variables, ctx).Exec(program.body, out);
  return out;
}

}  // namespace kvq::jinja
