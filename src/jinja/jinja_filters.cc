// Filters and tests (jinja_builtins.h): jinja2's, by their jinja2 names and argument lists, as one
// table each; transformers' own tojson (json.dumps with ensure_ascii=False) replaces jinja2's
// HTML-escaping one. A name missing from the tables is refused when the template is parsed.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "jinja/jinja_builtins.h"

namespace kvq::jinja {
namespace {

using K = Value::Kind;
using FilterFn = Value (*)(const Value& operand, const Args& args, Context& ctx);
using TestFn = bool (*)(const Value& operand, const Args& args, Context& ctx);

/// jinja2's soft_str: the text of a value, as `{{ }}` prints it.
std::string Text(const Value& v, Context& ctx) {
  std::string s = Str(v, ctx.budget.limits().max_created_bytes);
  ctx.budget.Bytes(s.size());
  return s;
}

/// `item.a.b` / `item.0` as jinja2's make_attrgetter reads an attribute path.
Value AttributePath(const Value& item, const std::string& path, Context& ctx) {
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
    const bool index = !part.empty() && std::all_of(part.begin(), part.end(),
                                                    [](char c) { return c >= '0' && c <= '9'; });
    v = index ? GetItem(v, Value::Int(std::atoll(part.c_str())), ctx) : GetAttribute(v, part);
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

size_t Length(const Value& v) {
  switch (v.kind()) {
    case K::kUndefined:
      return 0;
    case K::kString:
      return CharCount(v.str());
    case K::kList:
      return v.list().size();
    case K::kDict:
      return v.dict().items.size();
    default:
      throw Error(fmt::format("object of type '{}' has no len()", TypeName(v)));
  }
}

Value FilterLength(const Value& v, const Args& args, Context&) {
  ArgReader(args, "length", {});
  return Value::Int(static_cast<int64_t>(Length(v)));
}

Value FilterString(const Value& v, const Args& args, Context& ctx) {
  ArgReader(args, "string", {});
  return v.is_string() ? v : Value::String(Text(v, ctx));
}

Value FilterTrim(const Value& v, const Args& args, Context& ctx) {
  const ArgReader a(args, "trim", {"chars"});
  const Value* chars = a.Get(0);
  const std::string text = Text(v, ctx);
  const std::string set = chars != nullptr && chars->is_string() ? chars->str() : "";
  ctx.budget.Scan(text.size());
  ctx.budget.Step(static_cast<int64_t>((text.size() / 64) * (set.size() / 16)));
  return Value::String(
      Strip(text, chars != nullptr && chars->is_string() ? &set : nullptr, true, true));
}

template <std::string (*Fn)(std::string_view)>
Value CaseFilter(const Value& v, const Args& args, Context& ctx) {
  ArgReader(args, "case filter", {});
  return Value::String(Fn(Text(v, ctx)));
}

Value FilterDefault(const Value& v, const Args& args, Context&) {
  const ArgReader a(args, "default", {"default_value", "boolean"});
  const bool use_default = v.is_undefined() || (a.Bool(1, false) && !Truthy(v));
  if (!use_default) return v;
  return a.Get(0) != nullptr ? *a.Get(0) : Value::String("");
}

Value FilterFirst(const Value& v, const Args& args, Context& ctx) {
  ArgReader(args, "first", {});
  if (v.is_list()) return v.list().empty() ? Value() : v.list().front();
  const std::vector<Value> items = Iterate(v, ctx);
  return items.empty() ? Value() : items.front();
}

Value FilterLast(const Value& v, const Args& args, Context& ctx) {
  ArgReader(args, "last", {});
  if (v.is_list()) return v.list().empty() ? Value() : v.list().back();
  const std::vector<Value> items = Iterate(v, ctx);
  return items.empty() ? Value() : items.back();
}

Value FilterList(const Value& v, const Args& args, Context& ctx) {
  ArgReader(args, "list", {});
  return v.is_list() ? v : NewList(Iterate(v, ctx), ctx);
}

Value FilterReverse(const Value& v, const Args& args, Context& ctx) {
  ArgReader(args, "reverse", {});
  std::vector<Value> items = Iterate(v, ctx);
  std::reverse(items.begin(), items.end());
  if (!v.is_string()) return NewList(std::move(items), ctx);
  std::string out;
  for (const Value& c : items) out += c.str();
  return NewString(std::move(out), ctx);
}

Value FilterItems(const Value& v, const Args& args, Context& ctx) {
  ArgReader(args, "items", {});
  if (v.is_undefined()) return Value::List({});
  if (!v.is_dict()) throw Error(fmt::format("items: expected a dict, got '{}'", TypeName(v)));
  std::vector<Value> pairs;
  for (const auto& [key, value] : v.dict().items) {
    pairs.push_back(Value::List({NewString(key, ctx), value}));
  }
  return NewList(std::move(pairs), ctx);
}

Value FilterJoin(const Value& v, const Args& args, Context& ctx) {
  const ArgReader a(args, "join", {"d", "attribute"});
  const std::string separator = a.String(0, "");
  const Value* attribute = a.Get(1);
  std::string out;
  bool first = true;
  for (const Value& item : Iterate(v, ctx)) {
    if (!first) out += separator;
    first = false;
    const Value part =
        attribute != nullptr ? AttributePath(item, Str(*attribute, 4096), ctx) : item;
    AppendStr(part, out, ctx.budget.limits().max_created_bytes);
    ctx.budget.Step();
  }
  return NewString(std::move(out), ctx);
}

Value FilterReplace(const Value& v, const Args& args, Context& ctx) {
  return CallMethod(Value::String(Text(v, ctx)), "replace", args, ctx);
}

Value FilterTojson(const Value& v, const Args& args, Context& ctx) {
  const ArgReader a(args, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonStyle style;
  style.ensure_ascii = a.Bool(0, false);
  if (a.Get(1) != nullptr && !a.Get(1)->is_none()) {
    style.indent = static_cast<int>(std::clamp<int64_t>(a.Int(1, 0), 0, 64));
    style.item_separator = ",";
  }
  if (const Value* separators = a.Get(2); separators != nullptr && !separators->is_none()) {
    if (!separators->is_list() || separators->list().size() != 2 ||
        !separators->list()[0].is_string() || !separators->list()[1].is_string()) {
      throw Error("tojson: separators must be a pair of strings");
    }
    style.item_separator = separators->list()[0].str();
    style.key_separator = separators->list()[1].str();
  }
  style.sort_keys = a.Bool(3, false);
  std::string out;
  AppendJson(v, style, out, ctx.budget.limits().max_created_bytes);
  return NewString(std::move(out), ctx);
}

Value FilterAbs(const Value& v, const Args& args, Context&) {
  ArgReader(args, "abs", {});
  if (v.kind() == K::kFloat) return Value::Float(std::fabs(v.floating()));
  const Value n = Negate(v, false);
  return n.integer() < 0 ? Negate(n, true) : n;
}

Value FilterInt(const Value& v, const Args& args, Context&) {
  const ArgReader a(args, "int", {"default"});
  const Value fallback = a.Get(0) != nullptr ? *a.Get(0) : Value::Int(0);
  switch (v.kind()) {
    case K::kBool:
      return Value::Int(v.boolean());
    case K::kInt:
      return v;
    case K::kFloat:
      if (!std::isfinite(v.floating()) || std::fabs(v.floating()) >= 9.2e18) return fallback;
      return Value::Int(static_cast<int64_t>(v.floating()));
    case K::kString: {
      const std::string s = Strip(v.str(), nullptr, true, true);
      char* end = nullptr;
      errno = 0;
      const long long i = std::strtoll(s.c_str(), &end, 10);
      if (!s.empty() && *end == '\0' && errno == 0) return Value::Int(i);
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && *end == '\0' && std::isfinite(d) && std::fabs(d) < 9.2e18) {
        return Value::Int(static_cast<int64_t>(d));
      }
      return fallback;
    }
    default:
      return fallback;
  }
}

Value FilterFloat(const Value& v, const Args& args, Context&) {
  const ArgReader a(args, "float", {"default"});
  const Value fallback = a.Get(0) != nullptr ? *a.Get(0) : Value::Float(0.0);
  switch (v.kind()) {
    case K::kBool:
      return Value::Float(v.boolean());
    case K::kInt:
      return Value::Float(static_cast<double>(v.integer()));
    case K::kFloat:
      return v;
    case K::kString: {
      const std::string s = Strip(v.str(), nullptr, true, true);
      char* end = nullptr;
      const double d = std::strtod(s.c_str(), &end);
      return !s.empty() && *end == '\0' ? Value::Float(d) : fallback;
    }
    default:
      return fallback;
  }
}

Value FilterIndent(const Value& v, const Args& args, Context& ctx) {
  const ArgReader a(args, "indent", {"width", "first", "blank"});
  const std::string pad =
      a.Get(0) != nullptr && a.Get(0)->is_string()
          ? a.Get(0)->str()
          : std::string(static_cast<size_t>(std::clamp<int64_t>(a.Int(0, 4), 0, 256)), ' ');
  const bool first = a.Bool(1, false), blank = a.Bool(2, false);
  const std::string text = Text(v, ctx);
  std::string out;
  size_t start = 0;
  for (size_t line = 0;; ++line) {
    const size_t newline = text.find('\n', start);
    const std::string_view piece = std::string_view(text).substr(
        start, newline == std::string::npos ? std::string::npos : newline - start);
    if ((line > 0 || first) && (blank || !piece.empty())) out += pad;
    out += piece;
    if (newline == std::string::npos) break;
    out += '\n';
    start = newline + 1;
    ctx.budget.Bytes(pad.size());
  }
  return NewString(std::move(out), ctx);
}

/// select/reject/selectattr/rejectattr: items for which the test (truth when none is named) holds.
Value SelectItems(const Value& v, const Args& args, Context& ctx, bool by_attribute, bool keep) {
  Args rest;
  size_t first_test_arg = 0;
  std::string attribute;
  if (by_attribute) {
    if (args.positional.empty() || !args.positional[0].is_string()) {
      throw Error("selectattr/rejectattr: expected an attribute name");
    }
    attribute = args.positional[0].str();
    first_test_arg = 1;
  }
  std::string test;
  if (args.positional.size() > first_test_arg) {
    if (!args.positional[first_test_arg].is_string()) throw Error("select: expected a test name");
    test = args.positional[first_test_arg].str();
    if (!IsKnownTest(test)) throw Error("unsupported test '" + test + "'");
    rest.positional.assign(
        args.positional.begin() + static_cast<std::ptrdiff_t>(first_test_arg) + 1,
        args.positional.end());
  }
  if (!args.keyword.empty()) throw Error("select: unexpected keyword arguments");
  std::vector<Value> kept;
  for (const Value& item : Iterate(v, ctx)) {
    ctx.budget.Step();
    const Value subject = by_attribute ? AttributePath(item, attribute, ctx) : item;
    const bool passed = test.empty() ? Truthy(subject) : ApplyTest(test, subject, rest, ctx);
    if (passed == keep) kept.push_back(item);
  }
  return NewList(std::move(kept), ctx);
}

Value FilterSelect(const Value& v, const Args& a, Context& c) {
  return SelectItems(v, a, c, false, true);
}
Value FilterReject(const Value& v, const Args& a, Context& c) {
  return SelectItems(v, a, c, false, false);
}
Value FilterSelectattr(const Value& v, const Args& a, Context& c) {
  return SelectItems(v, a, c, true, true);
}
Value FilterRejectattr(const Value& v, const Args& a, Context& c) {
  return SelectItems(v, a, c, true, false);
}

/// map(attribute='x', default=...) or map('filter', args...).
Value FilterMap(const Value& v, const Args& args, Context& ctx) {
  std::vector<Value> out;
  if (args.positional.empty()) {
    const ArgReader a(args, "map", {"attribute", "default"});
    const std::string attribute = Str(a.Required(0), 4096);
    for (const Value& item : Iterate(v, ctx)) {
      ctx.budget.Step();
      Value mapped = AttributePath(item, attribute, ctx);
      if (mapped.is_undefined() && a.Get(1) != nullptr) mapped = *a.Get(1);
      out.push_back(std::move(mapped));
    }
    return NewList(std::move(out), ctx);
  }
  if (!args.positional[0].is_string()) throw Error("map: expected a filter name");
  const std::string filter = args.positional[0].str();
  if (!IsKnownFilter(filter) || filter == "map")
    throw Error("map: unsupported filter '" + filter + "'");
  Args rest{std::vector<Value>(args.positional.begin() + 1, args.positional.end()), args.keyword};
  for (const Value& item : Iterate(v, ctx)) {
    ctx.budget.Step();
    out.push_back(ApplyFilter(filter, item, rest, ctx));
  }
  return NewList(std::move(out), ctx);
}

Value FilterSafe(const Value& v, const Args& args, Context&) {
  ArgReader(args, "safe", {});
  return v;
}

struct FilterEntry {
  std::string_view name;
  FilterFn fn;
};
constexpr FilterEntry kFilters[] = {
    {"abs", FilterAbs},
    {"capitalize", CaseFilter<Capitalize>},
    {"count", FilterLength},
    {"d", FilterDefault},
    {"default", FilterDefault},
    {"first", FilterFirst},
    {"float", FilterFloat},
    {"indent", FilterIndent},
    {"int", FilterInt},
    {"items", FilterItems},
    {"join", FilterJoin},
    {"last", FilterLast},
    {"length", FilterLength},
    {"list", FilterList},
    {"lower", CaseFilter<Lower>},
    {"map", FilterMap},
    {"reject", FilterReject},
    {"rejectattr", FilterRejectattr},
    {"replace", FilterReplace},
    {"reverse", FilterReverse},
    {"safe", FilterSafe},
    {"select", FilterSelect},
    {"selectattr", FilterSelectattr},
    {"string", FilterString},
    {"title", CaseFilter<Title>},
    {"tojson", FilterTojson},
    {"trim", FilterTrim},
    {"upper", CaseFilter<Upper>},
};

// ---- tests ----

bool IsNumberKind(const Value& v) {
  return v.kind() == K::kInt || v.kind() == K::kFloat || v.kind() == K::kBool;
}

const Value& OneArg(const Args& args, const char* test) {
  if (args.positional.size() != 1 || !args.keyword.empty()) {
    throw Error(fmt::format("test '{}' takes one argument", test));
  }
  return args.positional[0];
}

template <K kind>
bool TestKind(const Value& v, const Args&, Context&) {
  return v.kind() == kind;
}
bool TestDefined(const Value& v, const Args&, Context&) { return !v.is_undefined(); }
bool TestNumber(const Value& v, const Args&, Context&) { return IsNumberKind(v); }
bool TestTrue(const Value& v, const Args&, Context&) { return v.kind() == K::kBool && v.boolean(); }
bool TestFalse(const Value& v, const Args&, Context&) {
  return v.kind() == K::kBool && !v.boolean();
}
bool TestIterable(const Value& v, const Args&, Context&) {
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
}
bool TestSequence(const Value& v, const Args&, Context&) {
  return v.is_string() || v.is_list() || v.is_dict();
}
bool TestCallable(const Value& v, const Args&, Context&) { return v.kind() == K::kFunction; }
bool TestOdd(const Value& v, const Args&, Context&) {
  if (!v.is_int()) throw Error(fmt::format("test 'odd' needs an int, got '{}'", TypeName(v)));
  return v.integer() % 2 != 0;
}
bool TestEven(const Value& v, const Args& a, Context& c) { return !TestOdd(v, a, c); }
bool TestDivisibleBy(const Value& v, const Args& args, Context& ctx) {
  return EqualsCharged(Binary(Op::kMod, v, OneArg(args, "divisibleby"), ctx), Value::Int(0), ctx);
}
/// str.islower() / str.isupper() on ASCII letters: some cased letter, none of the other case.
template <bool kLower>
bool TestCase(const Value& v, const Args&, Context& ctx) {
  if (!v.is_string()) return false;
  ctx.budget.Scan(v.str().size());
  bool cased = false;
  for (const char c : v.str()) {
    const bool lower = c >= 'a' && c <= 'z', upper = c >= 'A' && c <= 'Z';
    if (kLower ? upper : lower) return false;
    cased = cased || lower || upper;
  }
  return cased;
}
template <Op kOp>
bool TestCompare(const Value& v, const Args& args, Context& ctx) {
  return Compare(kOp, v, OneArg(args, "comparison"), ctx);
}

struct TestEntry {
  std::string_view name;
  TestFn fn;
};
constexpr TestEntry kTests[] = {
    {"!=", TestCompare<Op::kNe>},
    {"<", TestCompare<Op::kLt>},
    {"<=", TestCompare<Op::kLe>},
    {"==", TestCompare<Op::kEq>},
    {">", TestCompare<Op::kGt>},
    {">=", TestCompare<Op::kGe>},
    {"boolean", TestKind<K::kBool>},
    {"callable", TestCallable},
    {"defined", TestDefined},
    {"divisibleby", TestDivisibleBy},
    {"eq", TestCompare<Op::kEq>},
    {"equalto", TestCompare<Op::kEq>},
    {"even", TestEven},
    {"false", TestFalse},
    {"float", TestKind<K::kFloat>},
    {"ge", TestCompare<Op::kGe>},
    {"greaterthan", TestCompare<Op::kGt>},
    {"gt", TestCompare<Op::kGt>},
    {"in", TestCompare<Op::kIn>},
    {"integer", TestKind<K::kInt>},
    {"iterable", TestIterable},
    {"le", TestCompare<Op::kLe>},
    {"lessthan", TestCompare<Op::kLt>},
    {"lower", TestCase<true>},
    {"lt", TestCompare<Op::kLt>},
    {"mapping", TestKind<K::kDict>},
    {"ne", TestCompare<Op::kNe>},
    {"none", TestKind<K::kNone>},
    {"number", TestNumber},
    {"odd", TestOdd},
    {"sequence", TestSequence},
    {"string", TestKind<K::kString>},
    {"true", TestTrue},
    {"undefined", TestKind<K::kUndefined>},
    {"upper", TestCase<false>},
};

template <typename Entry, size_t N>
const Entry* Find(const Entry (&table)[N], std::string_view name) {
  for (const Entry& entry : table) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

}  // namespace

bool IsKnownFilter(std::string_view name) { return Find(kFilters, name) != nullptr; }
bool IsKnownTest(std::string_view name) { return Find(kTests, name) != nullptr; }

Value ApplyFilter(std::string_view name, const Value& operand, const Args& args, Context& ctx) {
  const FilterEntry* f = Find(kFilters, name);
  if (f == nullptr) throw Error("unsupported filter '" + std::string(name) + "'");
  return f->fn(operand, args, ctx);
}

bool ApplyTest(std::string_view name, const Value& operand, const Args& args, Context& ctx) {
  const TestEntry* t = Find(kTests, name);
  if (t == nullptr) throw Error("unsupported test '" + std::string(name) + "'");
  return t->fn(operand, args, ctx);
}

}  // namespace kvq::jinja
