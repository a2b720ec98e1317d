// The values a chat template computes with: Jinja2's Python objects, cut to what chat templates
// use (undefined, none, bool, int, float, str, list, dict, namespace, a few global functions), and
// the Python semantics the interpreter needs of them (truth, ==, str(), repr(), json.dumps).
// Strings, lists and dicts are immutable and shared: copying a Value is a reference-count
// increment, as transformers' ImmutableSandboxedEnvironment forbids mutating them anyway. A
// namespace is the one mutable object (`{% set ns.x = ... %}`), shared by reference.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace kvq::jinja {

/// How deep lists, dicts and namespaces may nest inside each other (and so how deep the recursive
/// printers, comparisons and destructors below may go). Real templates nest tool schemas a few
/// levels; the input messages are two levels deep.
inline constexpr int kMaxValueDepth = 100;

/// A template error: thrown inside the interpreter, turned into a Status at ChatTemplate's
/// boundary (chat_template.cc), never thrown across kvq's API. `raised` marks raise_exception()
/// (the message is then the template's own text). The offset (into the template's source, after
/// newline normalisation) is filled in by the innermost template node the error passes through,
/// and reported as line:column.
class Error : public std::exception {
 public:
  explicit Error(std::string message, bool raised = false)
      : message_(std::move(message)), raised_(raised) {}
  const char* what() const noexcept override { return message_.c_str(); }
  const std::string& message() const { return message_; }
  bool raised() const { return raised_; }
  bool has_offset() const { return has_offset_; }
  size_t offset() const { return offset_; }
  void set_offset(size_t offset) { offset_ = offset, has_offset_ = true; }

 private:
  std::string message_;
  bool raised_;
  bool has_offset_ = false;
  size_t offset_ = 0;
};

class Value;

/// A dict: string keys in insertion order (Python's); template dicts are small, so lookups are
/// linear. Also the attributes of a namespace.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* Find(std::string_view key) const;
  void Set(std::string_view key, Value value);  ///< replaces an existing key in place
};

/// The global functions a template can call.
enum class Builtin : uint8_t { kNamespace, kRange, kRaiseException, kStrftimeNow, kDict };

class Value {
 public:
  /// The order is the variant's (kind() is its index).
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kFunction
  };

  Value() = default;  ///< undefined
  static Value None() { return Value(nullptr); }
  static Value Bool(bool b) { return Value(b); }
  static Value Int(int64_t i) { return Value(i); }
  static Value Float(double f) { return Value(f); }
  static Value String(std::string s) {
    return Value(std::make_shared<const std::string>(std::move(s)));
  }
  /// Lists and dicts deeper than kMaxValueDepth throw Error.
  static Value List(std::vector<Value> items);
  static Value Dict(jinja::Dict dict);
  static Value Namespace(std::shared_ptr<jinja::Dict> attributes) {
    return Value(NamespaceRef{std::move(attributes)});
  }
  static Value Function(Builtin f) { return Value(f); }

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_number() const { return kind() == Kind::kInt || kind() == Kind::kFloat; }

  /// The accessors require the matching kind.
  bool boolean() const { return std::get<bool>(v_); }
  int64_t integer() const { return std::get<int64_t>(v_); }
  double floating() const { return std::get<double>(v_); }
  const std::string& str() const { return *std::get<StringPtr>(v_); }
  const std::vector<Value>& list() const { return std::get<ListPtr>(v_)->items; }
  const jinja::Dict& dict() const { return std::get<DictPtr>(v_)->dict; }
  jinja::Dict& attributes() const { return *std::get<NamespaceRef>(v_).attributes; }
  Builtin function() const { return std::get<Builtin>(v_); }
  /// Nesting depth: 1 for a list or dict of scalars, 0 for a scalar (a namespace counts as 1:
  /// it is a reference, and the printers below bound their own depth through it).
  int depth() const;

 private:
  struct ListBox {
    std::vector<Value> items;
    int depth;
  };
  struct DictBox {
    jinja::Dict dict;
    int depth;
  };
  struct NamespaceRef {
    std::shared_ptr<jinja::Dict> attributes;
  };
  using StringPtr = std::shared_ptr<const std::string>;
  using ListPtr = std::shared_ptr<const ListBox>;
  using DictPtr = std::shared_ptr<const DictBox>;
  template <typename T>
  explicit Value(T v) : v_(std::move(v)) {}

  std::variant<std::monostate, std::nullptr_t, bool, int64_t, double, StringPtr, ListPtr, DictPtr,
               NamespaceRef, Builtin>
      v_;
};

/// Python's truth: undefined, none, false, 0, 0.0 and empty strings, lists and dicts are false.
bool Truthy(const Value& v);
/// Python's == (1 == 1.0 == true; lists and dicts compare by value; undefined equals only
/// undefined). Jinja2, not @huggingface/jinja, which uses JavaScript's loose == on primitives and
/// identity on objects. Adds the work done (items visited + string bytes / 64) to *work.
bool Equals(const Value& a, const Value& b, int64_t* work = nullptr);
/// Python's type name, for error messages: "str", "int", "list", "NoneType", "undefined"...
const char* TypeName(const Value& v);
/// What `{{ v }}` prints: Python's str() (None -> "None", True -> "True", floats as repr(),
/// lists and dicts as repr()), and nothing for undefined. Throws Error rather than let `out`
/// grow past `limit` bytes (a list can hold the same long string many times).
void AppendStr(const Value& v, std::string& out, size_t limit);
std::string Str(const Value& v, size_t limit);
/// Python's repr() of a string: quoted, with \\, \n, \r, \t and other control characters escaped.
void AppendRepr(std::string_view s, std::string& out);
/// Python's repr() of a float: the shortest text that reads back to the same double, "1.0" for
/// integral values, exponent form outside 1e-4 <= |f| < 1e16 ("1e+16", "1e-05"), "inf", "nan".
void AppendFloat(double f, std::string& out);

/// json.dumps(v, ensure_ascii=False, indent=indent, separators=..., sort_keys=...) as
/// transformers' tojson filter calls it. Undefined becomes null (as @huggingface/jinja writes it;
/// Python would refuse it); a namespace is written as a dict.
struct JsonStyle {
  int indent = -1;            ///< < 0: one line
  bool ensure_ascii = false;  ///< non-ASCII characters as \\uXXXX (surrogate pairs beyond U+FFFF)
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};
void AppendJson(const Value& v, const JsonStyle& style, std::string& out, size_t limit,
                int depth = 0);

// UTF-8 helpers (the text is never validated: invalid bytes are characters of their own, as
// unicode::DecodeUtf8 reads them).

size_t CharCount(std::string_view s);
/// str.isspace() of one code point: Unicode White_Space plus U+001C..U+001F.
bool IsPySpace(uint32_t code_point);

}  // namespace kvq::jinja
