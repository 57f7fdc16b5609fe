// Dynamic values of the chat-template interpreter, with Python semantics for
// truthiness, equality, ordering, str() and repr() (templates are written against
// Python objects: JSON from the request plus Jinja's own types). Values are cheap to copy
// (shared immutable storage); only a Namespace is mutable. A Value lives within one
// render on one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specd::jinja {

class Value;
class ValueDict;
class Callable;
class Interpreter;

using ValueList = std::vector<Value>;

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kTuple,
    kDict,
    kNamespace,
    kCallable,
  };

  // Undefined; `hint` is the message an error about it reports ("'x' is undefined").
  Value() = default;
  static Value Undefined(std::string hint);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  static Value List(ValueList items);
  static Value Tuple(ValueList items);
  // What Jinja's lazy filters (map, select, reject, selectattr, rejectattr, unique, items,
  // reverse) return: a Python generator. It iterates like a list, but is always true and
  // has no len().
  static Value Generator(ValueList items);
  static Value Dict(ValueDict dict);
  static Value Namespace(ValueDict attrs);
  static Value Function(std::shared_ptr<const Callable> fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  // Python numbers.Number: bool, int and float.
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  bool is_string() const { return kind_ == Kind::kString; }
  // list or tuple.
  bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }
  bool is_generator() const { return generator_; }

  bool bool_value() const { return scalar_.b; }
  // int value of a bool or int.
  int64_t int_value() const { return is_bool() ? scalar_.b : scalar_.i; }
  // float value of any number.
  double float_value() const;
  // The string (kString) or the undefined hint (kUndefined).
  const std::string& str() const;
  const ValueList& list() const;
  const ValueDict& dict() const;
  ValueDict& namespace_attrs() const;
  const Callable& callable() const;

  // Nesting depth of containers (0 for scalars); bounded by the interpreter so that
  // printing and comparing stay shallow recursions.
  int depth() const { return depth_; }
  // True when a Namespace is reachable from this value (assigning it into a namespace
  // could form a cycle).
  bool has_namespace() const { return has_namespace_; }
  // True when both values are containers backed by the same storage.
  bool SharesStorage(const Value& other) const {
    return ptr_ != nullptr && ptr_ == other.ptr_ && kind_ != Kind::kString;
  }

 private:
  void SetChildrenInfo(const ValueList& items);

  Kind kind_ = Kind::kUndefined;
  bool has_namespace_ = false;
  bool generator_ = false;
  uint16_t depth_ = 0;
  union {
    bool b;
    int64_t i;
    double d;
  } scalar_{};
  std::shared_ptr<void> ptr_;
};

// Insertion-ordered dict with string keys (a Python dict decoded from JSON). Small
// dicts are searched linearly; a hash index is built once they grow.
class ValueDict {
 public:
  const Value* Find(absl::string_view key) const;
  // Replaces the value of an existing key in place, or appends.
  void Set(std::string key, Value value);
  // Removes all entries, keeping capacity.
  void Clear();
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }

 private:
  static constexpr size_t kIndexThreshold = 16;

  std::vector<std::pair<std::string, Value>> entries_;
  absl::flat_hash_map<std::string, size_t> index_;  // empty below kIndexThreshold entries
};

// Positional and keyword arguments of a call.
struct CallArgs {
  ValueList positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// Anything a template can call: macros, built-in functions, bound methods.
class Callable {
 public:
  virtual ~Callable() = default;
  virtual absl::string_view name() const = 0;
  virtual absl::StatusOr<Value> Call(Interpreter& interp, CallArgs args) const = 0;
};

// Python truthiness (Undefined is false).
bool Truthy(const Value& v);
// Python type name as Jinja's messages use it ("str", "dict", "NoneType", ...).
absl::string_view TypeName(const Value& v);
// Printing a container stops once the output passes this many bytes (containers may share
// storage, so their text can be far larger than their memory); callers that care check
// the size afterwards.
inline constexpr size_t kMaxReprBytes = size_t{64} << 20;

// str(v) as Jinja prints it: Undefined is "", None is "None", lists use repr().
std::string PyStr(const Value& v);
void AppendPyStr(const Value& v, std::string* out, size_t max_bytes = kMaxReprBytes);
std::string PyRepr(const Value& v);
void AppendPyRepr(const Value& v, std::string* out, size_t max_bytes = kMaxReprBytes);
// repr() cut to about 100 bytes, for error messages.
std::string ShortRepr(const Value& v);
// repr() of a Python float: shortest round-trip digits, "1.0", "1e-05", "1e+16", "inf".
std::string FormatPyFloat(double d);
// ==, with bool == int == float numerically; containers sharing storage are equal
// without a walk (Python's identity shortcut).
bool PyEquals(const Value& a, const Value& b);
// <, <=, ... : -1, 0 or 1; an error for types Python cannot order ("'<' not supported").
absl::StatusOr<int> PyCompare(const Value& a, const Value& b);

}  // namespace specd::jinja
