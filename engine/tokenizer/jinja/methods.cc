// Python methods of str, dict and list values as chat templates call them
// (`content.strip()`, `d.items()`, ...). Templates are immutable, as under transformers'
// ImmutableSandboxedEnvironment: mutating methods exist but refuse to run.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/base/status.h"
#include "engine/tokenizer/jinja/interpreter.h"
#include "engine/tokenizer/jinja/library.h"
#include "engine/tokenizer/jinja/strings.h"
#include "engine/tokenizer/jinja/utf8.h"

namespace specd::jinja {
namespace {

const absl::flat_hash_set<absl::string_view>& DictMethods() {
  static const auto* const kMethods =
      new absl::flat_hash_set<absl::string_view>{"get", "items", "keys", "values", "copy",
                                                 // Mutating: present, but refused.
                                                 "pop", "popitem", "setdefault", "update", "clear"};
  return *kMethods;
}

const absl::flat_hash_set<absl::string_view>& ListMethods() {
  static const auto* const kMethods = new absl::flat_hash_set<absl::string_view>{
      "index", "count", "copy",
      // Mutating: present, but refused.
      "append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear"};
  return *kMethods;
}

bool IsMutating(absl::string_view name) {
  static const auto* const kMutating = new absl::flat_hash_set<absl::string_view>{
      "pop",    "popitem", "setdefault", "update",  "clear", "append",
      "extend", "insert",  "remove",     "reverse", "sort"};
  return kMutating->contains(name);
}

class BoundMethodValue : public Callable {
 public:
  BoundMethodValue(Value obj, std::string name) : obj_(std::move(obj)), name_(std::move(name)) {}
  absl::string_view name() const override { return name_; }
  absl::StatusOr<Value> Call(Interpreter& interp, CallArgs args) const override {
    return CallMethod(interp, obj_, name_, std::move(args));
  }

 private:
  Value obj_;
  std::string name_;
};

absl::StatusOr<Value> CallDictMethod(const Value& obj, absl::string_view name, CallArgs args) {
  const ValueDict& dict = obj.dict();
  if (name == "get") {
    SPECD_ASSIGN_OR_RETURN(std::vector<Value> a,
                           BindArgs("get", std::move(args), {"key", "default"}));
    if (a[0].is_string()) {
      if (const Value* v = dict.Find(a[0].str())) return *v;
    }
    return a[1].is_undefined() ? Value::None() : a[1];
  }
  SPECD_RETURN_IF_ERROR(BindArgs(name, std::move(args), {}).status());
  if (name == "copy") return obj;
  ValueList out;
  out.reserve(dict.size());
  for (const auto& [key, value] : dict.entries()) {
    if (name == "keys") {
      out.push_back(Value::String(key));
    } else if (name == "values") {
      out.push_back(value);
    } else {
      out.push_back(Value::Tuple({Value::String(key), value}));
    }
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> CallListMethod(const Value& obj, absl::string_view name, CallArgs args) {
  if (name == "copy") return obj;
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a, BindArgs(name, std::move(args), {"value"}));
  const ValueList& items = obj.list();
  if (name == "count") {
    return Value::Int(std::count_if(items.begin(), items.end(),
                                    [&](const Value& v) { return PyEquals(v, a[0]); }));
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if (PyEquals(items[i], a[0])) return Value::Int(static_cast<int64_t>(i));
  }
  return absl::InvalidArgumentError(absl::StrCat(ShortRepr(a[0]), " is not in list"));
}

}  // namespace

bool HasMethod(const Value& obj, absl::string_view name) {
  switch (obj.kind()) {
    case Value::Kind::kString:
      return IsStrMethod(name);
    case Value::Kind::kDict:
      return DictMethods().contains(name);
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return ListMethods().contains(name);
    default:
      return false;
  }
}

Value BoundMethod(const Value& obj, absl::string_view name) {
  return Value::Function(std::make_shared<BoundMethodValue>(obj, std::string(name)));
}

absl::StatusOr<Value> CallMethod(Interpreter& interp, const Value& obj, absl::string_view name,
                                 CallArgs args) {
  SPECD_RETURN_IF_ERROR(interp.Step());
  if (!obj.is_string() && IsMutating(name)) {
    return absl::InvalidArgumentError(absl::StrCat("access to attribute '", name, "' of '",
                                                   TypeName(obj),
                                                   "' object is unsafe (templates are immutable)"));
  }
  absl::StatusOr<Value> result;
  switch (obj.kind()) {
    case Value::Kind::kString:
      result = CallStrMethod(interp, obj.str(), name, std::move(args));
      break;
    case Value::Kind::kDict:
      result = CallDictMethod(obj, name, std::move(args));
      break;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      result = CallListMethod(obj, name, std::move(args));
      break;
    default:
      return TypeError(absl::StrCat("'", TypeName(obj), "' object has no method '", name, "'"));
  }
  if (result.ok()) SPECD_RETURN_IF_ERROR(interp.ChargeCopy(*result));
  return result;
}

}  // namespace specd::jinja
