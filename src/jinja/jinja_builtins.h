// What the interpreter (jinja_eval.cc) calls on values: operators, attribute and item access,
// iteration (jinja_operators.cc), filters and tests (jinja_filters.cc), string and dict methods
// and the global functions (jinja_methods.cc), with Jinja2's (Python's) semantics. Also the
// budget every render is held to, since templates come from downloaded files: each operation
// charges its work and the bytes it creates, and the render fails cleanly past the limits.
#pragma once

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jinja/jinja_ast.h"
#include "jinja/jinja_value.h"

namespace kvq::jinja {

/// The limits of one render (ChatRenderLimits in chat_template.h documents them).
struct Limits {
  int64_t max_steps = 10'000'000;  ///< evaluations, loop iterations, scanned bytes / 64
  size_t max_created_bytes = size_t{256} << 20;  ///< strings and list slots created, in all
  size_t max_output_bytes = size_t{16} << 20;    ///< the rendered text
};

/// What a string costs besides its text (the shared allocation), as the budget counts it.
inline constexpr size_t kStringOverheadBytes = 64;

class Budget {
 public:
  explicit Budget(const Limits& limits) : limits_(limits) {}
  const Limits& limits() const { return limits_; }

  /// Charges `n` steps of work; throws Error past the limit.
  void Step(int64_t n = 1) {
    steps_ += n;
    if (steps_ > limits_.max_steps)
      Exceeded("steps of work", static_cast<size_t>(limits_.max_steps));
  }
  /// Charges scanning `n` bytes (one step per 64).
  void Scan(size_t n) { Step(static_cast<int64_t>(n / 64) + 1); }
  /// Charges creating `n` bytes; throws Error past the limit (call it before allocating).
  void Bytes(size_t n) {
    if (n > limits_.max_created_bytes - created_bytes_) {
      Exceeded("bytes of values", limits_.max_created_bytes);
    }
    created_bytes_ += n;
  }
  /// Charges `count` things of `unit` bytes each (the product may overflow).
  void Bytes(size_t count, size_t unit) {
    Bytes(unit != 0 && count > limits_.max_created_bytes / unit ? limits_.max_created_bytes + 1
                                                                : count * unit);
  }
  void ListSlots(size_t n) { Bytes(n, sizeof(Value)); }

 private:
  [[noreturn]] static void Exceeded(const char* what, size_t limit);
  Limits limits_;
  int64_t steps_ = 0;
  size_t created_bytes_ = 0;
};

/// What builtins need of the render: its budget and its clock.
struct Context {
  explicit Context(const Limits& limits) : budget(limits) {}
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  /// Empties every namespace the render created: a namespace may hold itself (`{% set ns.x = ns
  /// %}`), a cycle of shared pointers that would otherwise never be freed.
  ~Context() {
    for (const Value& ns : namespaces) ns.attributes().items.clear();
  }

  Budget budget;
  std::chrono::sys_seconds now;  ///< what strftime_now() formats (UTC)
  std::vector<Value> namespaces;
};

/// Arguments of a call, filter or test (without the operand).
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

/// Binds Args to a builtin's parameters as Python does (positionally, then by name) and refuses
/// extra or unknown arguments: "trim() got an unexpected keyword argument 'x'".
class ArgReader {
 public:
  ArgReader(const Args& args, std::string_view callee,
            std::initializer_list<std::string_view> params);
  /// The i-th parameter's value, or nullptr when not passed.
  const Value* Get(size_t i) const { return i < bound_.size() ? bound_[i] : nullptr; }
  /// The i-th parameter, which must be passed.
  const Value& Required(size_t i) const;
  /// The i-th parameter as a string / int / bool, `fallback` when not passed (or none, where
  /// Python's default is None).
  std::string String(size_t i, std::string_view fallback) const;
  int64_t Int(size_t i, int64_t fallback) const;
  bool Bool(size_t i, bool fallback) const;

 private:
  std::string callee_;
  std::vector<std::string_view> params_;
  std::vector<const Value*> bound_;
};

/// Where each character of a string starts: the byte index itself for ASCII text, else a table
/// of offsets (charged to the budget), for indexing and slicing by character as Python does.
class Chars {
 public:
  Chars(std::string_view s, Context& ctx);
  size_t size() const { return ascii_ ? n_bytes_ : offsets_.size() - 1; }
  /// Byte offset of character i (i == size(): the end of the string).
  size_t offset(size_t i) const { return ascii_ ? i : offsets_[i]; }

 private:
  bool ascii_;
  size_t n_bytes_;
  std::vector<size_t> offsets_;
};

/// A new string, charged to the budget.
Value NewString(std::string s, Context& ctx);
/// A new list, charged to the budget.
Value NewList(std::vector<Value> items, Context& ctx);

// jinja_operators.cc
Value Binary(Op op, const Value& a, const Value& b, Context& ctx);
/// One comparison of a chain (== != < <= > >= in, not in).
bool Compare(Op op, const Value& a, const Value& b, Context& ctx);
Value Negate(const Value& v, bool minus);
/// `x.name`: a dict's key, a namespace's attribute, undefined otherwise (undefined.name is
/// undefined too, as @huggingface/jinja has it; jinja2 would raise).
Value GetAttribute(const Value& object, std::string_view name);
/// `x[key]`: a dict's key, a list's or string's index (negative from the end), undefined when
/// absent or out of range.
Value GetItem(const Value& object, const Value& key, Context& ctx);
/// `x[start:stop:step]` of a list or string (characters), Python's rules; null parts are omitted.
Value Slice(const Value& object, const Value* start, const Value* stop, const Value* step,
            Context& ctx);
/// What `for` iterates: a list's items, a dict's keys, a string's characters, nothing for
/// undefined. Other values throw.
std::vector<Value> Iterate(const Value& v, Context& ctx);
/// `needle in haystack`.
bool Contains(const Value& haystack, const Value& needle, Context& ctx);
/// `a == b`, charging the work of comparing large values.
bool EqualsCharged(const Value& a, const Value& b, Context& ctx);

// jinja_filters.cc
bool IsKnownFilter(std::string_view name);
bool IsKnownTest(std::string_view name);
Value ApplyFilter(std::string_view name, const Value& operand, const Args& args, Context& ctx);
bool ApplyTest(std::string_view name, const Value& operand, const Args& args, Context& ctx);

// jinja_methods.cc
/// `receiver.name(args)`: str and dict methods.
Value CallMethod(const Value& receiver, std::string_view name, const Args& args, Context& ctx);
/// range(), namespace(), dict(), raise_exception(), strftime_now().
Value CallFunction(Builtin f, const Args& args, Context& ctx);
/// Python's str.strip/lstrip/rstrip: `chars` null strips whitespace.
std::string Strip(std::string_view s, const std::string* chars, bool left, bool right);
/// ASCII-only case mapping (non-ASCII letters are kept as they are; Python would map them).
std::string Upper(std::string_view s);
std::string Lower(std::string_view s);
std::string Capitalize(std::string_view s);
std::string Title(std::string_view s);

}  // namespace kvq::jinja
