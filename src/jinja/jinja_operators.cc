// Operators, attribute and item access, slicing and iteration (jinja_builtins.h), with Python's
// semantics: + concatenates only str with str and list with list, / always gives a float, // and %
// round toward negative infinity, integers are 64-bit and overflow is an error (Python's are
// unbounded), bool counts as an int.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "jinja/jinja_builtins.h"
#include "text/unicode.h"

namespace kvq::jinja {
namespace {

using K = Value::Kind;

const char* OpText(Op op) {
  static constexpr const char* kText[] = {"+",  "-",  "*", "/",  "//", "%",  "**", "~",
                                          "==", "!=", "<", "<=", ">",  ">=", "in", "not in"};
  return kText[static_cast<int>(op)];
}

[[noreturn]] void Unsupported(Op op, const Value& a, const Value& b) {
  throw Error(fmt::format("unsupported operand types for {}: '{}' and '{}'", OpText(op),
                          TypeName(a), TypeName(b)));
}

/// A number operand: bool and int are integers.
struct Number {
  bool is_float;
  int64_t i;
  double f;
};

bool AsNumber(const Value& v, Number* n) {
  switch (v.kind()) {
    case K::kBool:
      *n = {false, v.boolean() ? 1 : 0, 0};
      break;
    case K::kInt:
      *n = {false, v.integer(), 0};
      break;
    case K::kFloat:
      *n = {true, 0, v.floating()};
      return true;
    default:
      return false;
  }
  n->f = static_cast<double>(n->i);
  return true;
}

[[noreturn]] void Overflow(Op op) {
  throw Error(fmt::format("integer overflow in '{}' (kvq's integers are 64-bit)", OpText(op)));
}

Value IntPower(int64_t base, int64_t exponent) {
  int64_t result = 1;
  while (exponent > 0) {
    if ((exponent & 1) && __builtin_mul_overflow(result, base, &result)) Overflow(Op::kPow);
    exponent >>= 1;
    if (exponent > 0 && __builtin_mul_overflow(base, base, &base)) Overflow(Op::kPow);
  }
  return Value::Int(result);
}

Value Arithmetic(Op op, const Number& x, const Number& y) {
  const bool is_float = x.is_float || y.is_float;
  if (op == Op::kDiv || (op == Op::kPow && !is_float && y.i < 0)) {
    if (op == Op::kDiv && y.f == 0) throw Error("division by zero");
    return Value::Float(op == Op::kDiv ? x.f / y.f : std::pow(x.f, y.f));
  }
  if (is_float) {
    switch (op) {
      case Op::kAdd:
        return Value::Float(x.f + y.f);
      case Op::kSub:
        return Value::Float(x.f - y.f);
      case Op::kMul:
        return Value::Float(x.f * y.f);
      case Op::kPow:
        return Value::Float(std::pow(x.f, y.f));
      case Op::kFloorDiv:
      case Op::kMod: {
        // CPython's float_divmod.
        if (y.f == 0) throw Error("float division by zero");
        double mod = std::fmod(x.f, y.f);
        double div = (x.f - mod) / y.f;
        if (mod != 0) {
          if ((y.f < 0) != (mod < 0)) mod += y.f, div -= 1.0;
        } else {
          mod = std::copysign(0.0, y.f);
        }
        if (op == Op::kMod) return Value::Float(mod);
        double floor_div = std::copysign(0.0, x.f / y.f);
        if (div != 0) {
          floor_div = std::floor(div);
          if (div - floor_div > 0.5) floor_div += 1.0;
        }
        return Value::Float(floor_div);
      }
      default:
        break;
    }
  }
  int64_t r = 0;
  switch (op) {
    case Op::kAdd:
      if (__builtin_add_overflow(x.i, y.i, &r)) Overflow(op);
      return Value::Int(r);
    case Op::kSub:
      if (__builtin_sub_overflow(x.i, y.i, &r)) Overflow(op);
      return Value::Int(r);
    case Op::kMul:
      if (__builtin_mul_overflow(x.i, y.i, &r)) Overflow(op);
      return Value::Int(r);
    case Op::kPow:
      return IntPower(x.i, y.i);
    case Op::kFloorDiv:
    case Op::kMod: {
      if (y.i == 0) throw Error("integer division or modulo by zero");
      if (x.i == std::numeric_limits<int64_t>::min() && y.i == -1) {
        if (op == Op::kMod) return Value::Int(0);
        Overflow(op);
      }
      int64_t q = x.i / y.i, m = x.i % y.i;
      if (m != 0 && ((m < 0) != (y.i < 0))) --q, m += y.i;
      return Value::Int(op == Op::kMod ? m : q);
    }
    default:
      break;
  }
  throw Error("unknown arithmetic operator");
}

/// s * n or list * n.
Value Repeat(const Value& seq, int64_t n, Context& ctx) {
  if (n <= 0) return seq.is_string() ? Value::String("") : Value::List({});
  const size_t count = static_cast<size_t>(n);
  if (seq.is_string()) {
    const std::string& s = seq.str();
    ctx.budget.Bytes(count, s.size());
    std::string out;
    out.reserve(s.size() * count);
    for (size_t i = 0; i < count; ++i) out += s;
    return Value::String(std::move(out));
  }
  const std::vector<Value>& items = seq.list();
  ctx.budget.Bytes(count, items.size() * sizeof(Value));
  std::vector<Value> out;
  out.reserve(items.size() * count);
  for (size_t i = 0; i < count; ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::List(std::move(out));
}

/// Python's slice.indices(): the first index and the count of items.
void SliceIndices(int64_t length, const Value* start, const Value* stop, int64_t step,
                  int64_t* first, int64_t* count) {
  auto bound = [&](const Value* v, int64_t fallback) {
    if (v == nullptr || v->is_none() || v->is_undefined()) return fallback;
    if (v->kind() != K::kInt && v->kind() != K::kBool) {
      throw Error(fmt::format("slice indices must be integers or none, not '{}'", TypeName(*v)));
    }
    int64_t i = v->kind() == K::kBool ? v->boolean() : v->integer();
    const int64_t lower = step < 0 ? -1 : 0, upper = step < 0 ? length - 1 : length;
    if (i < 0) i = i < -length ? lower : std::max(i + length, lower);
    return std::min(i, upper);
  };
  const int64_t a = bound(start, step < 0 ? length - 1 : 0);
  const int64_t b = bound(stop, step < 0 ? -1 : length);
  *first = a;
  if (step > 0) {
    *count = b > a ? (b - a + step - 1) / step : 0;
  } else {
    *count = a > b ? (a - b + (-step) - 1) / (-step) : 0;
  }
}

}  // namespace

Chars::Chars(std::string_view s, Context& ctx) : ascii_(true), n_bytes_(s.size()) {
  ctx.budget.Scan(s.size());
  for (const char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) ascii_ = false;
  }
  if (ascii_) return;
  ctx.budget.Bytes((s.size() + 1) * sizeof(size_t));
  offsets_.reserve(s.size() + 1);
  for (size_t at = 0; at < s.size(); at += unicode::DecodeUtf8(s, at).n_bytes)
    offsets_.push_back(at);
  offsets_.push_back(s.size());
}

Value Binary(Op op, const Value& a, const Value& b, Context& ctx) {
  if (op == Op::kConcat) {
    std::string s = Str(a, ctx.budget.limits().max_created_bytes);
    AppendStr(b, s, ctx.budget.limits().max_created_bytes);
    return NewString(std::move(s), ctx);
  }
  Number x, y;
  if (AsNumber(a, &x) && AsNumber(b, &y)) return Arithmetic(op, x, y);
  if (op == Op::kAdd && a.is_string() && b.is_string()) {
    ctx.budget.Bytes(a.str().size() + b.str().size());
    return Value::String(a.str() + b.str());
  }
  if (op == Op::kAdd && a.is_list() && b.is_list()) {
    ctx.budget.ListSlots(a.list().size() + b.list().size());
    std::vector<Value> items = a.list();
    items.insert(items.end(), b.list().begin(), b.list().end());
    return Value::List(std::move(items));
  }
  if (op == Op::kMul) {
    if ((a.is_string() || a.is_list()) && b.is_int()) return Repeat(a, b.integer(), ctx);
    if ((b.is_string() || b.is_list()) && a.is_int()) return Repeat(b, a.integer(), ctx);
  }
  if (op == Op::kMod && a.is_string()) {
    throw Error("unsupported construct: printf-style string formatting with '%'");
  }
  Unsupported(op, a, b);
}

bool EqualsCharged(const Value& a, const Value& b, Context& ctx) {
  int64_t work = 0;
  const bool equal = Equals(a, b, &work);
  ctx.budget.Step(work);
  return equal;
}

bool Compare(Op op, const Value& a, const Value& b, Context& ctx) {
  switch (op) {
    case Op::kEq:
      return EqualsCharged(a, b, ctx);
    case Op::kNe:
      return !EqualsCharged(a, b, ctx);
    case Op::kIn:
      return Contains(b, a, ctx);
    case Op::kNotIn:
      return !Contains(b, a, ctx);
    default:
      break;
  }
  int order = 0;
  Number x, y;
  if (AsNumber(a, &x) && AsNumber(b, &y)) {
    if (!x.is_float && !y.is_float) {
      order = x.i < y.i ? -1 : x.i > y.i ? 1 : 0;
    } else {
      if (std::isnan(x.f) || std::isnan(y.f)) return false;
      order = x.f < y.f ? -1 : x.f > y.f ? 1 : 0;
    }
  } else if (a.is_string() && b.is_string()) {
    ctx.budget.Scan(std::min(a.str().size(), b.str().size()));
    order = a.str().compare(b.str());  // UTF-8 byte order is code point order
  } else {
    throw Error(fmt::format("'{}' not supported between '{}' and '{}'", OpText(op), TypeName(a),
                            TypeName(b)));
  }
  switch (op) {
    case Op::kLt:
      return order < 0;
    case Op::kLe:
      return order <= 0;
    case Op::kGt:
      return order > 0;
    default:
      return order >= 0;
  }
}

Value Negate(const Value& v, bool minus) {
  Number n;
  if (!AsNumber(v, &n)) {
    throw Error(fmt::format("bad operand type for unary {}: '{}'", minus ? '-' : '+', TypeName(v)));
  }
  if (!minus) return n.is_float ? Value::Float(n.f) : Value::Int(n.i);
  if (n.is_float) return Value::Float(-n.f);
  if (n.i == std::numeric_limits<int64_t>::min()) Overflow(Op::kSub);
  return Value::Int(-n.i);
}

Value GetAttribute(const Value& object, std::string_view name) {
  const Value* found = nullptr;
  if (object.is_dict()) found = object.dict().Find(name);
  if (object.kind() == K::kNamespace) found = object.attributes().Find(name);
  return found != nullptr ? *found : Value();
}

Value GetItem(const Value& object, const Value& key, Context& ctx) {
  if (key.is_string()) return GetAttribute(object, key.str());
  if (key.kind() != K::kInt && key.kind() != K::kBool) return Value();
  int64_t index = key.kind() == K::kBool ? key.boolean() : key.integer();
  if (object.is_list()) {
    const int64_t n = static_cast<int64_t>(object.list().size());
    if (index < 0) index += n;
    return index >= 0 && index < n ? object.list()[static_cast<size_t>(index)] : Value();
  }
  if (object.is_string()) {
    const std::string& s = object.str();
    const Chars chars(s, ctx);
    const int64_t n = static_cast<int64_t>(chars.size());
    if (index < 0) index += n;
    if (index < 0 || index >= n) return Value();
    const size_t i = static_cast<size_t>(index);
    return NewString(s.substr(chars.offset(i), chars.offset(i + 1) - chars.offset(i)), ctx);
  }
  return Value();
}

Value Slice(const Value& object, const Value* start, const Value* stop, const Value* step,
            Context& ctx) {
  int64_t stride = 1;
  if (step != nullptr && !step->is_none() && !step->is_undefined()) {
    if (!step->is_int()) throw Error("slice step must be an integer");
    stride = step->integer();
    if (stride == 0) throw Error("slice step cannot be zero");
    if (stride == std::numeric_limits<int64_t>::min()) throw Error("slice step out of range");
  }
  int64_t first = 0, count = 0;
  if (object.is_list()) {
    const std::vector<Value>& items = object.list();
    SliceIndices(static_cast<int64_t>(items.size()), start, stop, stride, &first, &count);
    ctx.budget.ListSlots(static_cast<size_t>(count));
    std::vector<Value> out;
    out.reserve(static_cast<size_t>(count));
    for (int64_t i = 0, at = first; i < count; ++i, at += stride)
      out.push_back(items[static_cast<size_t>(at)]);
    return Value::List(std::move(out));
  }
  if (object.is_string()) {
    const std::string& s = object.str();
    const Chars chars(s, ctx);
    SliceIndices(static_cast<int64_t>(chars.size()), start, stop, stride, &first, &count);
    std::string out;
    for (int64_t i = 0, c = first; i < count; ++i, c += stride) {
      const size_t k = static_cast<size_t>(c);
      out.append(s, chars.offset(k), chars.offset(k + 1) - chars.offset(k));
    }
    return NewString(std::move(out), ctx);
  }
  if (object.is_undefined()) return Value();
  throw Error(fmt::format("'{}' cannot be sliced", TypeName(object)));
}

std::vector<Value> Iterate(const Value& v, Context& ctx) {
  switch (v.kind()) {
    case K::kUndefined:
      return {};
    case K::kList:
      return v.list();
    case K::kDict: {
      std::vector<Value> keys;
      for (const auto& item : v.dict().items) keys.push_back(NewString(item.first, ctx));
      return keys;
    }
    case K::kString: {
      const std::string& s = v.str();
      ctx.budget.ListSlots(s.size());
      ctx.budget.Bytes(s.size(), kStringOverheadBytes);
      std::vector<Value> chars;
      for (size_t at = 0; at < s.size();) {
        const size_t n = unicode::DecodeUtf8(s, at).n_bytes;
        chars.push_back(Value::String(s.substr(at, n)));
        at += n;
      }
      return chars;
    }
    default:
      throw Error(fmt::format("'{}' object is not iterable", TypeName(v)));
  }
}

bool Contains(const Value& haystack, const Value& needle, Context& ctx) {
  switch (haystack.kind()) {
    case K::kUndefined:
      return false;
    case K::kString: {
      if (!needle.is_string()) {
        throw Error(fmt::format("'in <string>' requires a string as left operand, not '{}'",
                                TypeName(needle)));
      }
      const std::string &h = haystack.str(), &n = needle.str();
      ctx.budget.Scan(h.size());
      ctx.budget.Step(static_cast<int64_t>((h.size() / 64) * (n.size() / 64)));
      return h.find(n) != std::string::npos;
    }
    case K::kList:
      for (const Value& item : haystack.list()) {
        if (EqualsCharged(item, needle, ctx)) return true;
      }
      return false;
    case K::kDict:
      return needle.is_string() && haystack.dict().Find(needle.str()) != nullptr;
    default:
      throw Error(fmt::format("argument of type '{}' is not iterable", TypeName(haystack)));
  }
}

}  // namespace kvq::jinja
