// The built-in library of the chat-template interpreter: Jinja filters and tests, the
// Python methods templates call on str/dict/list values, and the globals transformers
// provides (range, namespace, dict, raise_exception, strftime_now), plus the argument
// helpers they share. Stateless tables; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/tokenizer/jinja/value.h"

namespace specd::jinja {

class Interpreter;

// A filter or test gets its input and the call's arguments (after the input).
using FilterFn = absl::StatusOr<Value> (*)(Interpreter& interp, const Value& input, CallArgs args);
using TestFn = absl::StatusOr<bool> (*)(Interpreter& interp, const Value& input, CallArgs args);

// Filter / test by name (aliases included), or null.
FilterFn FindFilter(absl::string_view name);
TestFn FindTest(absl::string_view name);

// True when `obj.name` is a Python method of obj's type (str, dict, list methods).
bool HasMethod(const Value& obj, absl::string_view name);
absl::StatusOr<Value> CallMethod(Interpreter& interp, const Value& obj, absl::string_view name,
                                 CallArgs args);
// obj.name as a value: a bound method callable.
Value BoundMethod(const Value& obj, absl::string_view name);

// The global names every template sees.
std::vector<std::pair<std::string, Value>> BuiltinGlobals();

// Binds positional and keyword arguments to `params` in order; unbound ones are
// Undefined. Errors name `fn` for unknown keywords or too many arguments.
absl::StatusOr<std::vector<Value>> BindArgs(absl::string_view fn, CallArgs args,
                                            const std::vector<absl::string_view>& params);
// Argument conversion with Python-style error messages.
absl::StatusOr<int64_t> IntArg(absl::string_view fn, const Value& v);
absl::StatusOr<std::string> StringArg(absl::string_view fn, const Value& v);

absl::Status TypeError(absl::string_view message);

}  // namespace specd::jinja
