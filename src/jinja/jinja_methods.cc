// str and dict methods, the global functions, argument binding and the budget (jinja_builtins.h).
// Python's semantics, on UTF-8 text by characters (code points); case mapping is ASCII-only.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "jinja/jinja_builtins.h"
#include "text/unicode.h"

namespace kvq::jinja {
namespace {

using K = Value::Kind;

bool IsAsciiLower(char c) { return c >= 'a' && c <= 'z'; }
bool IsAsciiUpper(char c) { return c >= 'A' && c <= 'Z'; }
char ToUpper(char c) { return IsAsciiLower(c) ? static_cast<char>(c - 'a' + 'A') : c; }
char ToLower(char c) { return IsAsciiUpper(c) ? static_cast<char>(c - 'A' + 'a') : c; }

/// The strings `prefix` stands for: one string, or a tuple (list) of them.
std::vector<std::string_view> Affixes(const Value& prefix, const char* method) {
  if (prefix.is_string()) return {prefix.str()};
  std::vector<std::string_view> out;
  if (prefix.is_list()) {
    for (const Value& v : prefix.list()) {
      if (!v.is_string()) break;
      out.push_back(v.str());
    }
    if (out.size() == prefix.list().size()) return out;
  }
  throw Error(fmt::format("{}: expected a string or a tuple of strings, got '{}'", method,
                          TypeName(prefix)));
}

/// str.split(sep=None, maxsplit=-1).
Value Split(const std::string& s, const ArgReader& a, Context& ctx) {
  const Value* sep = a.Get(0);
  int64_t max_split = a.Int(1, -1);
  if (max_split < 0) max_split = std::numeric_limits<int64_t>::max();
  ctx.budget.Scan(s.size());
  std::vector<Value> parts;
  if (sep == nullptr || sep->is_none()) {
    // Runs of whitespace separate; no empty parts; the rest after max_split splits loses its
    // leading whitespace only.
    size_t at = 0;
    auto space_at = [&](size_t p, size_t* next) {
      const unicode::Decoded d = unicode::DecodeUtf8(s, p);
      *next = p + d.n_bytes;
      return IsPySpace(d.code_point);
    };
    while (true) {
      size_t next = at;
      while (at < s.size() && space_at(at, &next)) at = next;
      if (at == s.size()) break;
      ctx.budget.ListSlots(1);
      if (static_cast<int64_t>(parts.size()) == max_split) {
        parts.push_back(NewString(s.substr(at), ctx));
        break;
      }
      const size_t start = at;
      while (at < s.size() && !space_at(at, &next)) at = next;
      parts.push_back(NewString(s.substr(start, at - start), ctx));
    }
    return Value::List(std::move(parts));
  }
  if (!sep->is_string()) throw Error("split: the separator must be a string or none");
  const std::string& separator = sep->str();
  if (separator.empty()) throw Error("split: empty separator");
  size_t start = 0;
  while (static_cast<int64_t>(parts.size()) < max_split) {
    const size_t found = s.find(separator, start);
    if (found == std::string::npos) break;
    ctx.budget.ListSlots(1);
    parts.push_back(NewString(s.substr(start, found - start), ctx));
    start = found + separator.size();
  }
  parts.push_back(NewString(s.substr(start), ctx));
  return NewList(std::move(parts), ctx);
}

/// str.replace(old, new, count=-1); an empty `old` inserts `new` around every character.
Value Replace(const std::string& s, const ArgReader& a, Context& ctx) {
  const Value& from = a.Required(0);
  const Value& to = a.Required(1);
  if (!from.is_string() || !to.is_string()) throw Error("replace: arguments must be strings");
  int64_t count = a.Int(2, -1);
  if (count < 0) count = std::numeric_limits<int64_t>::max();
  const std::string &old_text = from.str(), &new_text = to.str();
  ctx.budget.Scan(s.size());
  // Where `old_text` is replaced: every match, or around every character when it is empty.
  auto next_hit = [&](size_t at) {
    if (!old_text.empty()) return s.find(old_text, at);
    if (at > s.size()) return std::string::npos;
    return at;
  };
  auto after_hit = [&](size_t hit) {
    if (!old_text.empty()) return hit + old_text.size();
    return hit < s.size() ? hit + unicode::DecodeUtf8(s, hit).n_bytes : hit + 1;
  };
  size_t n = 0;
  for (size_t p = next_hit(0); p != std::string::npos && static_cast<int64_t>(n) < count;
       p = next_hit(after_hit(p))) {
    ++n;
  }
  if (new_text.size() > old_text.size() && n > 0) {
    const size_t growth = new_text.size() - old_text.size();
    ctx.budget.Bytes(n, growth);
  }
  std::string out;
  size_t last = 0;
  for (size_t p = next_hit(0), done = 0; done < n; p = next_hit(after_hit(p)), ++done) {
    if (old_text.empty()) {
      out.append(s, last, p - last);  // the character before this gap
      out += new_text;
      last = p;
    } else {
      out.append(s, last, p - last);
      out += new_text;
      last = p + old_text.size();
    }
  }
  out.append(s, last, std::string::npos);
  return NewString(std::move(out), ctx);
}

/// A character index from a byte offset (str.find answers in characters).
int64_t CharIndex(const std::string& s, size_t byte) {
  return static_cast<int64_t>(CharCount(std::string_view(s).substr(0, byte)));
}

Value StringMethod(const std::string& s, std::string_view name, const Args& args, Context& ctx) {
  if (name == "startswith" || name == "endswith") {
    const ArgReader a(args, name, {"prefix"});
    const bool start = name == "startswith";
    for (const std::string_view affix : Affixes(a.Required(0), start ? "startswith" : "endswith")) {
      if (start ? std::string_view(s).starts_with(affix) : std::string_view(s).ends_with(affix)) {
        return Value::Bool(true);
      }
    }
    return Value::Bool(false);
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const ArgReader a(args, name, {"chars"});
    const Value* chars = a.Get(0);
    if (chars != nullptr && !chars->is_none() && !chars->is_string()) {
      throw Error(std::string(name) + ": chars must be a string or none");
    }
    const std::string* set = chars != nullptr && chars->is_string() ? &chars->str() : nullptr;
    ctx.budget.Scan(s.size());
    if (set != nullptr) ctx.budget.Step(static_cast<int64_t>((s.size() / 64) * (set->size() / 16)));
    return NewString(Strip(s, set, name != "rstrip", name != "lstrip"), ctx);
  }
  if (name == "split") return Split(s, ArgReader(args, name, {"sep", "maxsplit"}), ctx);
  if (name == "replace") return Replace(s, ArgReader(args, name, {"old", "new", "count"}), ctx);
  using CaseFn = std::string (*)(std::string_view);
  static constexpr std::pair<std::string_view, CaseFn> kCase[] = {
      {"upper", Upper}, {"lower", Lower}, {"title", Title}, {"capitalize", Capitalize}};
  for (const auto& [method, fn] : kCase) {
    if (name == method) {
      ArgReader(args, name, {});
      return NewString(fn(s), ctx);
    }
  }
  if (name == "find" || name == "count") {
    const ArgReader a(args, name, {"sub"});
    const Value& sub = a.Required(0);
    if (!sub.is_string()) throw Error(std::string(name) + ": the argument must be a string");
    ctx.budget.Scan(s.size());
    if (name == "find") {
      const size_t p = s.find(sub.str());
      return Value::Int(p == std::string::npos ? -1 : CharIndex(s, p));
    }
    if (sub.str().empty()) return Value::Int(static_cast<int64_t>(CharCount(s)) + 1);
    int64_t n = 0;
    for (size_t p = s.find(sub.str()); p != std::string::npos;
         p = s.find(sub.str(), p + sub.str().size()))
      ++n;
    return Value::Int(n);
  }
  if (name == "join") {
    const ArgReader a(args, name, {"iterable"});
    std::string out;
    bool first = true;
    for (const Value& item : Iterate(a.Required(0), ctx)) {
      if (!item.is_string())
        throw Error(fmt::format("join: expected str items, got '{}'", TypeName(item)));
      if (!first) out += s;
      first = false;
      ctx.budget.Bytes(item.str().size() + s.size());
      out += item.str();
    }
    return Value::String(std::move(out));
  }
  throw Error(fmt::format("unsupported str method '{}'", name));
}

Value DictMethod(const Dict& d, std::string_view name, const Args& args, Context& ctx) {
  if (name == "get") {
    const ArgReader a(args, name, {"key", "default"});
    const Value& key = a.Required(0);
    const Value* found = key.is_string() ? d.Find(key.str()) : nullptr;
    if (found != nullptr) return *found;
    return a.Get(1) != nullptr ? *a.Get(1) : Value::None();
  }
  ArgReader(args, name, {});
  std::vector<Value> out;
  for (const auto& [key, value] : d.items) {
    if (name == "items") {
      out.push_back(Value::List({NewString(key, ctx), value}));
    } else if (name == "keys") {
      out.push_back(NewString(key, ctx));
    } else if (name == "values") {
      out.push_back(value);
    } else {
      throw Error(fmt::format("unsupported dict method '{}'", name));
    }
  }
  if (name != "items" && name != "keys" && name != "values") {
    throw Error(fmt::format("unsupported dict method '{}'", name));
  }
  return NewList(std::move(out), ctx);
}

Value Range(const Args& args, Context& ctx) {
  if (!args.keyword.empty() || args.positional.empty() || args.positional.size() > 3) {
    throw Error("range() takes one to three integer arguments");
  }
  int64_t bounds[3] = {0, 0, 1};
  for (size_t i = 0; i < args.positional.size(); ++i) {
    const Value& v = args.positional[i];
    if (!v.is_int()) throw Error(fmt::format("range(): expected an int, got '{}'", TypeName(v)));
    bounds[args.positional.size() == 1 ? 1 : i] = v.integer();
  }
  const int64_t start = bounds[0], stop = bounds[1], step = bounds[2];
  if (step == 0) throw Error("range() step must not be zero");
  // Counted unsigned: stop - start may not fit in an int64_t.
  const uint64_t span =
      step > 0 ? (stop > start ? static_cast<uint64_t>(stop) - static_cast<uint64_t>(start) : 0)
               : (start > stop ? static_cast<uint64_t>(start) - static_cast<uint64_t>(stop) : 0);
  const uint64_t stride = step > 0 ? static_cast<uint64_t>(step) : ~static_cast<uint64_t>(step) + 1;
  const uint64_t count = span == 0 ? 0 : (span - 1) / stride + 1;
  ctx.budget.ListSlots(static_cast<size_t>(count));
  std::vector<Value> out;
  out.reserve(static_cast<size_t>(count));
  for (uint64_t i = 0; i < count; ++i) {
    out.push_back(Value::Int(
        static_cast<int64_t>(static_cast<uint64_t>(start) + i * static_cast<uint64_t>(step))));
  }
  return Value::List(std::move(out));
}

Value MakeDict(const Args& args, Context& ctx, bool is_namespace) {
  const char* callee = is_namespace ? "namespace" : "dict";
  if (args.positional.size() > 1)
    throw Error(fmt::format("{}() takes at most one positional argument", callee));
  Dict d;
  if (args.positional.size() == 1) {
    const Value& source = args.positional[0];
    if (source.is_dict()) {
      d = source.dict();
    } else {
      for (const Value& pair : Iterate(source, ctx)) {
        if (!pair.is_list() || pair.list().size() != 2 || !pair.list()[0].is_string()) {
          throw Error(fmt::format("{}(): expected a dict or (key, value) pairs", callee));
        }
        d.Set(pair.list()[0].str(), pair.list()[1]);
      }
    }
  }
  for (const auto& [key, value] : args.keyword) d.Set(key, value);
  ctx.budget.Bytes(d.items.size() + 1, sizeof(d.items[0]) + 2 * sizeof(Value));
  if (is_namespace) {
    ctx.namespaces.push_back(Value::Namespace(std::make_shared<Dict>(std::move(d))));
    return ctx.namespaces.back();
  }
  return Value::Dict(std::move(d));
}

/// Python's strftime for the directives chat templates use, in the C locale.
Value StrftimeNow(const Args& args, Context& ctx) {
  const ArgReader a(args, "strftime_now", {"format"});
  const Value& format = a.Required(0);
  if (!format.is_string()) throw Error("strftime_now: the format must be a string");
  using namespace std::chrono;
  const sys_days day = floor<days>(ctx.now);
  const year_month_day ymd(day);
  const hh_mm_ss<seconds> time(ctx.now - day);
  const unsigned week_day = weekday(day).c_encoding();  // 0 = Sunday
  static constexpr const char* kMonths[] = {"January",   "February", "March",    "April",
                                            "May",       "June",     "July",     "August",
                                            "September", "October",  "November", "December"};
  static constexpr const char* kDays[] = {"Sunday",   "Monday", "Tuesday", "Wednesday",
                                          "Thursday", "Friday", "Saturday"};
  const std::string month = kMonths[static_cast<unsigned>(ymd.month()) - 1];
  const std::string day_name = kDays[week_day];
  const int hour = static_cast<int>(time.hours().count());
  std::string out;
  const std::string& f = format.str();
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%' || i + 1 == f.size()) {
      out += f[i];
      continue;
    }
    switch (f[++i]) {
      case 'Y':
        out += fmt::format("{}", static_cast<int>(ymd.year()));
        break;
      case 'y':
        out += fmt::format("{:02}", static_cast<int>(ymd.year()) % 100);
        break;
      case 'm':
        out += fmt::format("{:02}", static_cast<unsigned>(ymd.month()));
        break;
      case 'd':
        out += fmt::format("{:02}", static_cast<unsigned>(ymd.day()));
        break;
      case 'H':
        out += fmt::format("{:02}", hour);
        break;
      case 'I':
        out += fmt::format("{:02}", hour % 12 == 0 ? 12 : hour % 12);
        break;
      case 'p':
        out += hour < 12 ? "AM" : "PM";
        break;
      case 'M':
        out += fmt::format("{:02}", time.minutes().count());
        break;
      case 'S':
        out += fmt::format("{:02}", time.seconds().count());
        break;
      case 'b':
        out += month.substr(0, 3);
        break;
      case 'B':
        out += month;
        break;
      case 'a':
        out += day_name.substr(0, 3);
        break;
      case 'A':
        out += day_name;
        break;
      case 'j':
        out += fmt::format("{:03}", (day - sys_days(ymd.year() / January / 1)).count() + 1);
        break;
      case '%':
        out += '%';
        break;
      default:
        throw Error(fmt::format("strftime_now: unsupported directive '%{}'", f[i]));
    }
  }
  return NewString(std::move(out), ctx);
}

}  // namespace

void Budget::Exceeded(const char* what, size_t limit) {
  throw Error(fmt::format("the template needs more than {} {} (a render's limit)", limit, what));
}

ArgReader::ArgReader(const Args& args, std::string_view callee,
                     std::initializer_list<std::string_view> params)
    : callee_(callee), params_(params), bound_(params.size(), nullptr) {
  if (args.positional.size() > params.size()) {
    throw Error(fmt::format("{}() takes at most {} argument(s), got {}", callee, params.size(),
                            args.positional.size()));
  }
  for (size_t i = 0; i < args.positional.size(); ++i) bound_[i] = &args.positional[i];
  for (const auto& [key, value] : args.keyword) {
    const auto it = std::find(params_.begin(), params_.end(), key);
    if (it == params_.end())
      throw Error(fmt::format("{}() got an unexpected keyword argument '{}'", callee, key));
    const size_t i = static_cast<size_t>(it - params_.begin());
    if (bound_[i] != nullptr)
      throw Error(fmt::format("{}() got multiple values for '{}'", callee, key));
    bound_[i] = &value;
  }
}

const Value& ArgReader::Required(size_t i) const {
  if (Get(i) == nullptr)
    throw Error(fmt::format("{}() missing argument '{}'", callee_, params_[i]));
  return *Get(i);
}

std::string ArgReader::String(size_t i, std::string_view fallback) const {
  const Value* v = Get(i);
  if (v == nullptr || v->is_none() || v->is_undefined()) return std::string(fallback);
  if (!v->is_string()) throw Error(fmt::format("{}(): '{}' must be a string", callee_, params_[i]));
  return v->str();
}

int64_t ArgReader::Int(size_t i, int64_t fallback) const {
  const Value* v = Get(i);
  if (v == nullptr || v->is_none() || v->is_undefined()) return fallback;
  if (!v->is_int()) throw Error(fmt::format("{}(): '{}' must be an int", callee_, params_[i]));
  return v->integer();
}

bool ArgReader::Bool(size_t i, bool fallback) const {
  const Value* v = Get(i);
  return v == nullptr || v->is_undefined() ? fallback : Truthy(*v);
}

Value NewString(std::string s, Context& ctx) {
  ctx.budget.Bytes(s.size() + kStringOverheadBytes);
  return Value::String(std::move(s));
}

Value NewList(std::vector<Value> items, Context& ctx) {
  ctx.budget.ListSlots(items.size());
  return Value::List(std::move(items));
}

std::string Strip(std::string_view s, const std::string* chars, bool left, bool right) {
  auto strippable = [&](uint32_t c) {
    if (chars == nullptr) return IsPySpace(c);
    for (size_t at = 0; at < chars->size();) {
      const unicode::Decoded d = unicode::DecodeUtf8(*chars, at);
      if (d.code_point == c) return true;
      at += d.n_bytes;
    }
    return false;
  };
  // One forward pass: [first, last) is what remains.
  size_t first = 0, last = 0;
  bool leading = left;
  for (size_t at = 0; at < s.size();) {
    const unicode::Decoded d = unicode::DecodeUtf8(s, at);
    const bool strip = strippable(d.code_point);
    at += d.n_bytes;
    if (leading && strip) {
      first = last = at;
      continue;
    }
    leading = false;
    if (!strip || !right) last = at;
  }
  return std::string(s.substr(first, last - first));
}

std::string Upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = ToUpper(c);
  return out;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = ToLower(c);
  return out;
}

std::string Capitalize(std::string_view s) {
  std::string out = Lower(s);
  if (!out.empty()) out[0] = ToUpper(out[0]);
  return out;
}

std::string Title(std::string_view s) {
  // Python: a letter after a non-letter starts a word. Non-ASCII bytes count as letters (they
  // are not case-mapped, but `é` does not start a new word in the middle of one).
  std::string out(s);
  bool in_word = false;
  for (char& c : out) {
    const bool letter = IsAsciiLower(c) || IsAsciiUpper(c) || static_cast<unsigned char>(c) >= 0x80;
    c = letter && !in_word ? ToUpper(c) : ToLower(c);
    in_word = letter;
  }
  return out;
}

Value CallMethod(const Value& receiver, std::string_view name, const Args& args, Context& ctx) {
  if (receiver.is_string()) return StringMethod(receiver.str(), name, args, ctx);
  if (receiver.is_dict()) return DictMethod(receiver.dict(), name, args, ctx);
  if (receiver.is_undefined())
    throw Error(fmt::format("cannot call '{}' on an undefined value", name));
  throw Error(fmt::format("unsupported method '{}' of '{}'", name, TypeName(receiver)));
}

Value CallFunction(Builtin f, const Args& args, Context& ctx) {
  switch (f) {
    case Builtin::kRange:
      return Range(args, ctx);
    case Builtin::kNamespace:
      return MakeDict(args, ctx, true);
    case Builtin::kDict:
      return MakeDict(args, ctx, false);
    case Builtin::kStrftimeNow:
      return StrftimeNow(args, ctx);
    case Builtin::kRaiseException: {
      const ArgReader a(args, "raise_exception", {"message"});
      throw Error(a.Get(0) != nullptr ? Str(*a.Get(0), ctx.budget.limits().max_output_bytes) : "",
                  /*raised=*/true);
    }
  }
  throw Error("unknown function");
}

}  // namespace kvq::jinja
