// Values and their Python semantics (jinja_value.h).
#include "jinja/jinja_value.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "text/unicode.h"

namespace kvq::jinja {
namespace {

constexpr char kHex[] = "0123456789abcdef";

void AppendHexEscape(const char* prefix, uint32_t c, int digits, std::string& out) {
  out += prefix;
  for (int shift = 4 * (digits - 1); shift >= 0; shift -= 4) out += kHex[(c >> shift) & 0xF];
}

void CheckDepth(int depth) {
  if (depth > kMaxValueDepth) {
    throw Error("lists, dicts and namespaces nest deeper than " + std::to_string(kMaxValueDepth));
  }
}

bool EqualsAt(const Value& a, const Value& b, int depth, int64_t& work) {
  CheckDepth(depth);
  ++work;
  using K = Value::Kind;
  const K ka = a.kind(), kb = b.kind();
  // Python compares bool, int and float as numbers (True == 1 == 1.0).
  auto numeric = [](const Value& v, double* d, int64_t* i) {
    switch (v.kind()) {
      case K::kBool:
        *i = v.boolean();
        *d = static_cast<double>(*i);
        return 1;
      case K::kInt:
        *i = v.integer();
        *d = static_cast<double>(*i);
        return 1;
      case K::kFloat:
        *d = v.floating();
        return 2;
      default:
        return 0;
    }
  };
  double da = 0, db = 0;
  int64_t ia = 0, ib = 0;
  const int na = numeric(a, &da, &ia), nb = numeric(b, &db, &ib);
  if (na && nb) return (na == 1 && nb == 1) ? ia == ib : da == db;
  if (ka != kb) return false;
  switch (ka) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      work += static_cast<int64_t>(std::min(a.str().size(), b.str().size()) / 64);
      return a.str() == b.str();
    case K::kList: {
      const auto &la = a.list(), &lb = b.list();
      if (la.size() != lb.size()) return false;
      for (size_t i = 0; i < la.size(); ++i) {
        if (!EqualsAt(la[i], lb[i], depth + 1, work)) return false;
      }
      return true;
    }
    case K::kDict: {
      const Dict &da2 = a.dict(), &db2 = b.dict();
      if (da2.items.size() != db2.items.size()) return false;
      for (const auto& [key, value] : da2.items) {
        const Value* other = db2.Find(key);
        if (other == nullptr || !EqualsAt(value, *other, depth + 1, work)) return false;
      }
      return true;
    }
    case K::kNamespace:
      return &a.attributes() == &b.attributes();
    case K::kFunction:
      return a.function() == b.function();
    default:
      return false;
  }
}

void AppendReprOf(const Value& v, std::string& out, size_t limit, int depth);

void CheckLength(const std::string& out, size_t more, size_t limit) {
  if (more > limit || out.size() > limit - more) {
    throw Error("text longer than " + std::to_string(limit) + " bytes");
  }
}

void AppendStrAt(const Value& v, std::string& out, size_t limit, int depth) {
  CheckDepth(depth);
  CheckLength(out, v.is_string() ? v.str().size() : 0, limit);
  using K = Value::Kind;
  switch (v.kind()) {
    case K::kUndefined:
      return;
    case K::kNone:
      out += "None";
      return;
    case K::kBool:
      out += v.boolean() ? "True" : "False";
      return;
    case K::kInt:
      out += std::to_string(v.integer());
      return;
    case K::kFloat:
      AppendFloat(v.floating(), out);
      return;
    case K::kString:
      out += v.str();
      return;
    case K::kList: {
      out += '[';
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i > 0) out += ", ";
        AppendReprOf(v.list()[i], out, limit, depth + 1);
      }
      out += ']';
      return;
    }
    case K::kDict:
    case K::kNamespace: {
      const Dict& d = v.kind() == K::kDict ? v.dict() : v.attributes();
      out += v.kind() == K::kDict ? "{" : "<Namespace {";
      for (size_t i = 0; i < d.items.size(); ++i) {
        if (i > 0) out += ", ";
        AppendRepr(d.items[i].first, out);
        out += ": ";
        AppendReprOf(d.items[i].second, out, limit, depth + 1);
      }
      out += v.kind() == K::kDict ? "}" : "}>";
      return;
    }
    case K::kFunction:
      out += "<built-in function>";
      return;
  }
}

void AppendReprOf(const Value& v, std::string& out, size_t limit, int depth) {
  if (v.is_string()) {
    CheckLength(out, v.str().size(), limit);
    AppendRepr(v.str(), out);
  } else if (v.is_undefined()) {
    out += "Undefined";
  } else {
    AppendStrAt(v, out, limit, depth);
  }
}

void AppendJsonString(std::string_view s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (size_t at = 0; at < s.size(); ++at) {
    const char ch = s[at];
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x80 && ensure_ascii) {
      const unicode::Decoded d = unicode::DecodeUtf8(s, at);
      if (d.code_point > 0xFFFF) {
        const uint32_t v = d.code_point - 0x10000;
        AppendHexEscape("\\u", 0xD800 + (v >> 10), 4, out);
        AppendHexEscape("\\u", 0xDC00 + (v & 0x3FF), 4, out);
      } else {
        AppendHexEscape("\\u", d.code_point, 4, out);
      }
      at += d.n_bytes - 1;
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          AppendHexEscape("\\u", c, 4, out);
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

void AppendJsonNewline(const JsonStyle& style, int level, std::string& out) {
  out += '\n';
  out.append(static_cast<size_t>(style.indent) * static_cast<size_t>(level), ' ');
}

}  // namespace

const Value* Dict::Find(std::string_view key) const {
  for (const auto& item : items) {
    if (item.first == key) return &item.second;
  }
  return nullptr;
}

void Dict::Set(std::string_view key, Value value) {
  for (auto& item : items) {
    if (item.first == key) {
      item.second = std::move(value);
      return;
    }
  }
  items.emplace_back(std::string(key), std::move(value));
}

Value Value::List(std::vector<Value> items) {
  int depth = 0;
  for (const Value& item : items) depth = std::max(depth, item.depth());
  CheckDepth(depth + 1);
  return Value(ListPtr(std::make_shared<const ListBox>(ListBox{std::move(items), depth + 1})));
}

Value Value::Dict(jinja::Dict dict) {
  int depth = 0;
  for (const auto& item : dict.items) depth = std::max(depth, item.second.depth());
  CheckDepth(depth + 1);
  return Value(DictPtr(std::make_shared<const DictBox>(DictBox{std::move(dict), depth + 1})));
}

int Value::depth() const {
  switch (kind()) {
    case Kind::kList:
      return std::get<ListPtr>(v_)->depth;
    case Kind::kDict:
      return std::get<DictPtr>(v_)->depth;
    case Kind::kNamespace:
      return 1;
    default:
      return 0;
  }
}

bool Truthy(const Value& v) {
  using K = Value::Kind;
  switch (v.kind()) {
    case K::kUndefined:
    case K::kNone:
      return false;
    case K::kBool:
      return v.boolean();
    case K::kInt:
      return v.integer() != 0;
    case K::kFloat:
      return v.floating() != 0.0;
    case K::kString:
      return !v.str().empty();
    case K::kList:
      return !v.list().empty();
    case K::kDict:
      return !v.dict().items.empty();
    case K::kNamespace:
    case K::kFunction:
      return true;
  }
  return false;
}

bool Equals(const Value& a, const Value& b, int64_t* work) {
  int64_t done = 0;
  const bool equal = EqualsAt(a, b, 0, done);
  if (work != nullptr) *work += done;
  return equal;
}

const char* TypeName(const Value& v) {
  static constexpr const char* kNames[] = {
      "undefined", "NoneType", "bool", "int",       "float",
      "str",       "list",     "dict", "Namespace", "builtin_function_or_method"};
  return kNames[static_cast<int>(v.kind())];
}

void AppendStr(const Value& v, std::string& out, size_t limit) { AppendStrAt(v, out, limit, 0); }

std::string Str(const Value& v, size_t limit) {
  std::string out;
  AppendStr(v, out, limit);
  return out;
}

void AppendRepr(std::string_view s, std::string& out) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const char quote = has_single && s.find('"') == std::string_view::npos ? '"' : '\'';
  out += quote;
  for (size_t at = 0; at < s.size();) {
    const unicode::Decoded d = unicode::DecodeUtf8(s, at);
    const uint32_t c = d.code_point;
    if (c == '\\' || c == static_cast<uint32_t>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || (c >= 0x7F && c <= 0xA0)) {
      AppendHexEscape("\\x", c, 2, out);
    } else {
      out.append(s.substr(at, d.n_bytes));
    }
    at += d.n_bytes;
  }
  out += quote;
}

void AppendFloat(double f, std::string& out) {
  if (std::isnan(f)) {
    out += "nan";
    return;
  }
  if (std::isinf(f)) {
    out += f < 0 ? "-inf" : "inf";
    return;
  }
  // The shortest round-trip digits (fmt's "{}": Dragonbox; libc++ has no floating to_chars),
  // then Python's layout of them (float_repr_style 'short').
  const std::string shortest = fmt::format("{}", f);
  std::string_view text = shortest;
  if (!text.empty() && text[0] == '-') {
    out += '-';
    text.remove_prefix(1);
  }
  const size_t e = text.find('e');
  const std::string_view mantissa = text.substr(0, e);
  const int exponent10 =
      e == std::string_view::npos ? 0 : std::stoi(std::string(text.substr(e + 1)));
  std::string digits;
  int point = -1;  // digits before the decimal point
  for (const char c : mantissa) {
    if (c == '.') {
      point = static_cast<int>(digits.size());
    } else {
      digits += c;
    }
  }
  if (point < 0) point = static_cast<int>(digits.size());
  point += exponent10;
  while (!digits.empty() && digits.front() == '0') digits.erase(0, 1), --point;
  while (!digits.empty() && digits.back() == '0') digits.pop_back();
  if (digits.empty()) {
    out += "0.0";
    return;
  }
  const int exponent = point - 1;
  const int n = static_cast<int>(digits.size());
  if (point > -4 && point <= 16) {
    if (point <= 0) {
      out += "0.";
      out.append(static_cast<size_t>(-point), '0');
      out += digits;
    } else if (point >= n) {
      out += digits;
      out.append(static_cast<size_t>(point - n), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(point));
      out += '.';
      out += digits.substr(static_cast<size_t>(point));
    }
    return;
  }
  out += digits[0];
  if (n > 1) {
    out += '.';
    out += digits.substr(1);
  }
  out += exponent < 0 ? "e-" : "e+";
  const std::string exp_digits = std::to_string(exponent < 0 ? -exponent : exponent);
  if (exp_digits.size() < 2) out += '0';
  out += exp_digits;
}

void AppendJson(const Value& v, const JsonStyle& style, std::string& out, size_t limit, int depth) {
  CheckDepth(depth);
  CheckLength(out, v.is_string() ? v.str().size() + 2 : 0, limit);
  using K = Value::Kind;
  switch (v.kind()) {
    case K::kUndefined:
    case K::kNone:
      out += "null";
      return;
    case K::kBool:
      out += v.boolean() ? "true" : "false";
      return;
    case K::kInt:
      out += std::to_string(v.integer());
      return;
    case K::kFloat:
      if (std::isnan(v.floating())) {
        out += "NaN";
      } else if (std::isinf(v.floating())) {
        out += v.floating() < 0 ? "-Infinity" : "Infinity";
      } else {
        AppendFloat(v.floating(), out);
      }
      return;
    case K::kString:
      AppendJsonString(v.str(), style.ensure_ascii, out);
      return;
    case K::kList: {
      const auto& items = v.list();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += style.item_separator;
        if (style.indent >= 0) AppendJsonNewline(style, depth + 1, out);
        AppendJson(items[i], style, out, limit, depth + 1);
      }
      if (style.indent >= 0) AppendJsonNewline(style, depth, out);
      out += ']';
      return;
    }
    case K::kDict:
    case K::kNamespace: {
      const Dict& d = v.kind() == K::kDict ? v.dict() : v.attributes();
      if (d.items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : d.items) items.push_back(&item);
      if (style.sort_keys) {
        std::sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += style.item_separator;
        if (style.indent >= 0) AppendJsonNewline(style, depth + 1, out);
        AppendJsonString(items[i]->first, style.ensure_ascii, out);
        out += style.key_separator;
        AppendJson(items[i]->second, style, out, limit, depth + 1);
      }
      if (style.indent >= 0) AppendJsonNewline(style, depth, out);
      out += '}';
      return;
    }
    case K::kFunction:
      throw Error("a function is not JSON serializable");
  }
}

size_t CharCount(std::string_view s) {
  size_t n = 0;
  for (size_t at = 0; at < s.size(); at += unicode::DecodeUtf8(s, at).n_bytes) ++n;
  return n;
}

bool IsPySpace(uint32_t code_point) {
  if (code_point < 0x80)
    return code_point == ' ' || (code_point >= 0x09 && code_point <= 0x0D) ||
           (code_point >= 0x1C && code_point <= 0x1F);
  return unicode::IsWhitespace(code_point) || (code_point >= 0x1C && code_point <= 0x1F);
}

}  // namespace kvq::jinja
