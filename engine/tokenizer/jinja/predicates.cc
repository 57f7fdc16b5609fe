// Jinja tests of the chat-template interpreter (`x is defined`, `x is string`, ...) and
// their table (see library.h). Semantics follow jinja2 3.1's tests on Python values.
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/base/status.h"
#include "engine/tokenizer/jinja/interpreter.h"
#include "engine/tokenizer/jinja/library.h"
#include "engine/tokenizer/jinja/operators.h"
#include "engine/tokenizer/jinja/utf8.h"

namespace specd::jinja {
namespace {

// A test of the input alone.
template <bool (*Pred)(const Value&)>
absl::StatusOr<bool> Unary(Interpreter&, const Value& input, CallArgs args) {
  SPECD_RETURN_IF_ERROR(BindArgs("test", std::move(args), {}).status());
  return Pred(input);
}

bool IsDefined(const Value& v) { return !v.is_undefined(); }
bool IsUndefined(const Value& v) { return v.is_undefined(); }
bool IsNone(const Value& v) { return v.is_none(); }
bool IsBoolean(const Value& v) { return v.is_bool(); }
bool IsTrue(const Value& v) { return v.is_bool() && v.bool_value(); }
bool IsFalse(const Value& v) { return v.is_bool() && !v.bool_value(); }
bool IsInteger(const Value& v) { return v.is_int(); }
bool IsFloat(const Value& v) { return v.is_float(); }
bool IsNumber(const Value& v) { return v.is_number(); }
bool IsString(const Value& v) { return v.is_string(); }
bool IsMapping(const Value& v) { return v.is_dict(); }
bool IsCallable(const Value& v) { return v.is_callable(); }
bool IsEscaped(const Value&) { return false; }
// Python iter() works on these (Jinja's Undefined iterates as empty).
bool IsIterable(const Value& v) {
  return v.is_string() || v.is_sequence() || v.is_dict() || v.is_undefined();
}
// len() and __getitem__ exist.
bool IsSequence(const Value& v) {
  return v.is_string() || (v.is_sequence() && !v.is_generator()) || v.is_dict() || v.is_undefined();
}
bool IsLower(const Value& v) {
  if (!v.is_string()) return false;
  bool cased = false;
  for (char32_t cp : DecodeUtf8(v.str())) {
    if (!IsCasedCp(cp)) continue;
    cased = true;
    if (ToLowerCp(cp) != cp) return false;
  }
  return cased;
}
bool IsUpper(const Value& v) {
  if (!v.is_string()) return false;
  bool cased = false;
  for (char32_t cp : DecodeUtf8(v.str())) {
    if (!IsCasedCp(cp)) continue;
    cased = true;
    if (ToUpperCp(cp) != cp) return false;
  }
  return cased;
}

// value % 2 == 1 (odd) or == 0 (even), floats included.
absl::StatusOr<bool> Parity(const Value& input, CallArgs args, bool want_odd) {
  SPECD_RETURN_IF_ERROR(BindArgs(want_odd ? "odd" : "even", std::move(args), {}).status());
  SPECD_ASSIGN_OR_RETURN(Value rest, ApplyBinary(BinaryOp::kMod, input, Value::Int(2), 0));
  return PyEquals(rest, Value::Int(want_odd ? 1 : 0));
}

absl::StatusOr<bool> TestOdd(Interpreter&, const Value& input, CallArgs args) {
  return Parity(input, std::move(args), true);
}
absl::StatusOr<bool> TestEven(Interpreter&, const Value& input, CallArgs args) {
  return Parity(input, std::move(args), false);
}

absl::StatusOr<bool> TestDivisibleBy(Interpreter&, const Value& input, CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a, BindArgs("divisibleby", std::move(args), {"num"}));
  SPECD_ASSIGN_OR_RETURN(Value rest, ApplyBinary(BinaryOp::kMod, input, a[0], 0));
  return !Truthy(rest);
}

// ==, !=, <, <=, >, >= as tests.
template <int kOp>
absl::StatusOr<bool> Compare(Interpreter&, const Value& input, CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a, BindArgs("compare", std::move(args), {"other"}));
  if (kOp == 0) return PyEquals(input, a[0]);
  if (kOp == 1) return !PyEquals(input, a[0]);
  if (input.is_undefined()) return UndefinedError(input);
  if (a[0].is_undefined()) return UndefinedError(a[0]);
  SPECD_ASSIGN_OR_RETURN(int c, PyCompare(input, a[0]));
  if (c == 2) return false;
  switch (kOp) {
    case 2:
      return c < 0;
    case 3:
      return c <= 0;
    case 4:
      return c > 0;
    default:
      return c >= 0;
  }
}

absl::StatusOr<bool> TestIn(Interpreter&, const Value& input, CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a, BindArgs("in", std::move(args), {"seq"}));
  return Contains(a[0], input);
}

absl::StatusOr<bool> TestSameAs(Interpreter&, const Value& input, CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a, BindArgs("sameas", std::move(args), {"other"}));
  return input.kind() == a[0].kind() && PyEquals(input, a[0]);
}

absl::StatusOr<bool> TestFilterExists(Interpreter&, const Value& input, CallArgs args) {
  SPECD_RETURN_IF_ERROR(BindArgs("filter", std::move(args), {}).status());
  return input.is_string() && FindFilter(input.str()) != nullptr;
}

absl::StatusOr<bool> TestTestExists(Interpreter&, const Value& input, CallArgs args) {
  SPECD_RETURN_IF_ERROR(BindArgs("test", std::move(args), {}).status());
  return input.is_string() && FindTest(input.str()) != nullptr;
}

}  // namespace

TestFn FindTest(absl::string_view name) {
  static const auto* const kTests = new absl::flat_hash_map<absl::string_view, TestFn>{
      {"defined", &Unary<IsDefined>},
      {"undefined", &Unary<IsUndefined>},
      {"none", &Unary<IsNone>},
      {"boolean", &Unary<IsBoolean>},
      {"true", &Unary<IsTrue>},
      {"false", &Unary<IsFalse>},
      {"integer", &Unary<IsInteger>},
      {"float", &Unary<IsFloat>},
      {"number", &Unary<IsNumber>},
      {"string", &Unary<IsString>},
      {"mapping", &Unary<IsMapping>},
      {"iterable", &Unary<IsIterable>},
      {"sequence", &Unary<IsSequence>},
      {"callable", &Unary<IsCallable>},
      {"escaped", &Unary<IsEscaped>},
      {"lower", &Unary<IsLower>},
      {"upper", &Unary<IsUpper>},
      {"odd", &TestOdd},
      {"even", &TestEven},
      {"divisibleby", &TestDivisibleBy},
      {"eq", &Compare<0>},
      {"equalto", &Compare<0>},
      {"==", &Compare<0>},
      {"ne", &Compare<1>},
      {"!=", &Compare<1>},
      {"lt", &Compare<2>},
      {"lessthan", &Compare<2>},
      {"<", &Compare<2>},
      {"le", &Compare<3>},
      {"<=", &Compare<3>},
      {"gt", &Compare<4>},
      {"greaterthan", &Compare<4>},
      {">", &Compare<4>},
      {"ge", &Compare<5>},
      {">=", &Compare<5>},
      {"in", &TestIn},
      {"sameas", &TestSameAs},
      {"filter", &TestFilterExists},
      {"test", &TestTestExists},
  };
  auto it = kTests->find(name);
  return it == kTests->end() ? nullptr : it->second;
}

}  // namespace specd::jinja
