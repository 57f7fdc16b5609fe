// Globals of the chat-template interpreter (range, namespace, dict, raise_exception,
// strftime_now) and the argument helpers of the built-in library (see library.h).
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "engine/base/status.h"
#include "engine/tokenizer/jinja/interpreter.h"
#include "engine/tokenizer/jinja/library.h"

namespace specd::jinja {
namespace {

// As jinja2's sandbox: larger ranges are refused.
constexpr int64_t kMaxRange = 100000;

using BuiltinFn = absl::StatusOr<Value> (*)(Interpreter& interp, CallArgs args);

class BuiltinFunction : public Callable {
 public:
  BuiltinFunction(absl::string_view name, BuiltinFn fn) : name_(name), fn_(fn) {}
  absl::string_view name() const override { return name_; }
  absl::StatusOr<Value> Call(Interpreter& interp, CallArgs args) const override {
    return fn_(interp, std::move(args));
  }

 private:
  absl::string_view name_;
  BuiltinFn fn_;
};

absl::StatusOr<Value> Range(Interpreter& interp, CallArgs args) {
  if (!args.keyword.empty()) return TypeError("range() takes no keyword arguments");
  const size_t n = args.positional.size();
  if (n < 1 || n > 3) return TypeError(absl::StrCat("range expected 1 to 3 arguments, got ", n));
  int64_t bounds[3] = {0, 0, 1};
  for (size_t i = 0; i < n; ++i) {
    SPECD_ASSIGN_OR_RETURN(bounds[n == 1 ? 1 : i], IntArg("range", args.positional[i]));
  }
  const int64_t start = bounds[0], stop = bounds[1], step = bounds[2];
  if (step == 0) return absl::InvalidArgumentError("range() arg 3 must not be zero");
  const __int128 span =
      step > 0 ? static_cast<__int128>(stop) - start : static_cast<__int128>(start) - stop;
  const __int128 abs_step = step > 0 ? step : -static_cast<__int128>(step);
  const __int128 count = span <= 0 ? 0 : (span + abs_step - 1) / abs_step;
  if (count > kMaxRange) {
    return absl::InvalidArgumentError(
        absl::StrCat("range too big: the sandbox blocks ranges larger than ", kMaxRange));
  }
  SPECD_RETURN_IF_ERROR(interp.Step(static_cast<int64_t>(count)));
  ValueList items;
  items.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < static_cast<int64_t>(count); ++i)
    items.push_back(Value::Int(start + i * step));
  return Value::List(std::move(items));
}

absl::StatusOr<ValueDict> KeywordDict(absl::string_view fn, CallArgs args) {
  ValueDict dict;
  if (args.positional.size() > 1) {
    return TypeError(absl::StrCat(fn, "() takes at most 1 positional argument"));
  }
  if (!args.positional.empty()) {
    const Value& init = args.positional[0];
    if (!init.is_dict()) return TypeError(absl::StrCat(fn, "() argument must be a mapping"));
    for (const auto& [key, value] : init.dict().entries()) dict.Set(key, value);
  }
  for (auto& [key, value] : args.keyword) dict.Set(key, std::move(value));
  return dict;
}

absl::StatusOr<Value> MakeNamespace(Interpreter&, CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(ValueDict attrs, KeywordDict("namespace", std::move(args)));
  for (const auto& [key, value] : attrs.entries()) {
    if (value.has_namespace()) {
      return absl::InvalidArgumentError("a namespace cannot be stored inside a namespace");
    }
  }
  return Value::Namespace(std::move(attrs));
}

absl::StatusOr<Value> MakeDict(Interpreter&, CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(ValueDict dict, KeywordDict("dict", std::move(args)));
  return Value::Dict(std::move(dict));
}

absl::StatusOr<Value> RaiseException(Interpreter& interp, CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> bound,
                         BindArgs("raise_exception", std::move(args), {"message"}));
  return interp.Raise(PyStr(bound[0]));
}

absl::StatusOr<Value> StrftimeNow(Interpreter& interp, CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> bound,
                         BindArgs("strftime_now", std::move(args), {"format"}));
  SPECD_ASSIGN_OR_RETURN(std::string format, StringArg("strftime_now", bound[0]));
  return Value::String(absl::FormatTime(format, interp.now(), interp.time_zone()));
}

}  // namespace

std::vector<std::pair<std::string, Value>> BuiltinGlobals() {
  static const auto* const kFunctions = new std::vector<std::pair<std::string, Value>>{
      {"range", Value::Function(std::make_shared<BuiltinFunction>("range", &Range))},
      {"namespace",
       Value::Function(std::make_shared<BuiltinFunction>("namespace", &MakeNamespace))},
      {"dict", Value::Function(std::make_shared<BuiltinFunction>("dict", &MakeDict))},
      {"raise_exception",
       Value::Function(std::make_shared<BuiltinFunction>("raise_exception", &RaiseException))},
      {"strftime_now",
       Value::Function(std::make_shared<BuiltinFunction>("strftime_now", &StrftimeNow))},
  };
  return *kFunctions;
}

absl::StatusOr<std::vector<Value>> BindArgs(absl::string_view fn, CallArgs args,
                                            const std::vector<absl::string_view>& params) {
  if (args.positional.size() > params.size()) {
    return TypeError(absl::StrCat(fn, "() takes at most ", params.size(), " argument(s) (",
                                  args.positional.size(), " given)"));
  }
  std::vector<Value> bound(params.size());
  for (size_t i = 0; i < args.positional.size(); ++i) bound[i] = std::move(args.positional[i]);
  for (auto& [name, value] : args.keyword) {
    size_t index = 0;
    while (index < params.size() && params[index] != name) ++index;
    if (index == params.size()) {
      return TypeError(absl::StrCat(fn, "() got an unexpected keyword argument '", name, "'"));
    }
    if (index < args.positional.size()) {
      return TypeError(absl::StrCat(fn, "() got multiple values for argument '", name, "'"));
    }
    bound[index] = std::move(value);
  }
  return bound;
}

absl::StatusOr<int64_t> IntArg(absl::string_view fn, const Value& v) {
  if (v.is_int() || v.is_bool()) return v.int_value();
  if (v.is_undefined()) return absl::InvalidArgumentError(v.str());
  return TypeError(absl::StrCat(fn, "(): expected an integer, got '", TypeName(v), "'"));
}

absl::StatusOr<std::string> StringArg(absl::string_view fn, const Value& v) {
  if (v.is_string()) return v.str();
  if (v.is_undefined() && !v.str().empty()) return absl::InvalidArgumentError(v.str());
  return TypeError(absl::StrCat(fn, "(): expected a string, got '", TypeName(v), "'"));
}

absl::Status TypeError(absl::string_view message) { return absl::InvalidArgumentError(message); }

}  // namespace specd::jinja
