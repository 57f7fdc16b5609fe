// Expression evaluation and member access of the chat-template interpreter (see
// interpreter.h).
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/base/status.h"
#include "engine/tokenizer/jinja/interpreter.h"
#include "engine/tokenizer/jinja/json_bridge.h"
#include "engine/tokenizer/jinja/library.h"
#include "engine/tokenizer/jinja/operators.h"
#include "engine/tokenizer/jinja/utf8.h"

namespace specd::jinja {
namespace {

absl::Status CheckDepth(const Value& v) {
  if (v.depth() <= kMaxValueDepth) return absl::OkStatus();
  return absl::InvalidArgumentError("value is nested too deeply");
}

Value MissingMember(const Value& obj, const Value& key) {
  if (key.is_string()) {
    return Value::Undefined(
        absl::StrCat("'", TypeName(obj), " object' has no attribute '", key.str(), "'"));
  }
  return Value::Undefined(
      absl::StrCat("'", TypeName(obj), " object' has no element ", ShortRepr(key)));
}

}  // namespace

absl::StatusOr<Value> Interpreter::Eval(const Expr& expr) {
  absl::StatusOr<Value> result = EvalImpl(expr);
  if (!result.ok()) return Locate(result.status(), expr.line, expr.column);
  return result;
}

absl::StatusOr<Value> Interpreter::EvalImpl(const Expr& expr) {
  SPECD_RETURN_IF_ERROR(Step());
  switch (expr.kind) {
    case ExprKind::kLiteral:
      return expr.literal;
    case ExprKind::kName:
      return Lookup(expr.name);
    case ExprKind::kList:
    case ExprKind::kTuple:
      return EvalSequence(expr);
    case ExprKind::kDict:
      return EvalDict(expr);
    case ExprKind::kGetAttr:
    case ExprKind::kGetItem:
      return EvalAccess(expr);
    case ExprKind::kSlice:
      return EvalSlice(expr);
    case ExprKind::kUnary:
      return EvalUnary(expr);
    case ExprKind::kBinary: {
      SPECD_ASSIGN_OR_RETURN(Value left, Eval(*expr.children[0]));
      SPECD_ASSIGN_OR_RETURN(Value right, Eval(*expr.children[1]));
      SPECD_ASSIGN_OR_RETURN(Value result, ApplyBinary(static_cast<BinaryOp>(expr.op), left, right,
                                                       limits_.max_output_bytes));
      SPECD_RETURN_IF_ERROR(ChargeCopy(result));
      return result;
    }
    case ExprKind::kConcat:
      return EvalConcat(expr);
    case ExprKind::kAnd:
    case ExprKind::kOr:
    case ExprKind::kNot:
      return EvalLogic(expr);
    case ExprKind::kCompare:
      return EvalCompare(expr);
    case ExprKind::kCondExpr:
      return EvalCondExpr(expr);
    case ExprKind::kFilter:
      return EvalFilter(expr, nullptr);
    case ExprKind::kTest:
      return EvalTest(expr);
    case ExprKind::kCall:
      return EvalCall(expr);
  }
  return absl::InternalError("unknown expression kind");
}

absl::StatusOr<Value> Interpreter::EvalAccess(const Expr& expr) {
  SPECD_ASSIGN_OR_RETURN(Value obj, Eval(*expr.children[0]));
  if (expr.kind == ExprKind::kGetAttr) return GetAttr(obj, expr.name);
  SPECD_ASSIGN_OR_RETURN(Value key, Eval(*expr.children[1]));
  return GetItem(obj, key);
}

absl::StatusOr<Value> Interpreter::EvalLogic(const Expr& expr) {
  SPECD_ASSIGN_OR_RETURN(Value left, Eval(*expr.children[0]));
  if (expr.kind == ExprKind::kNot) return Value::Bool(!Truthy(left));
  // Python's and/or return an operand, not a bool.
  const bool decided = Truthy(left) == (expr.kind == ExprKind::kOr);
  if (decided) return left;
  return Eval(*expr.children[1]);
}

absl::StatusOr<Value> Interpreter::EvalCondExpr(const Expr& expr) {
  SPECD_ASSIGN_OR_RETURN(Value cond, Eval(*expr.children[1]));
  if (Truthy(cond)) return Eval(*expr.children[0]);
  if (expr.children[2] == nullptr) {
    return Value::Undefined(
        "the inline if-expression evaluated to false and no else section was defined");
  }
  return Eval(*expr.children[2]);
}

absl::StatusOr<Value> Interpreter::EvalSequence(const Expr& expr) {
  ValueList items;
  items.reserve(expr.children.size());
  for (const ExprPtr& child : expr.children) {
    SPECD_ASSIGN_OR_RETURN(Value item, Eval(*child));
    items.push_back(std::move(item));
  }
  Value v = expr.kind == ExprKind::kTuple ? Value::Tuple(std::move(items))
                                          : Value::List(std::move(items));
  SPECD_RETURN_IF_ERROR(CheckDepth(v));
  SPECD_RETURN_IF_ERROR(ChargeCopy(v));
  return v;
}

absl::StatusOr<Value> Interpreter::EvalDict(const Expr& expr) {
  ValueDict dict;
  for (size_t i = 0; i + 1 < expr.children.size(); i += 2) {
    SPECD_ASSIGN_OR_RETURN(Value key, Eval(*expr.children[i]));
    SPECD_ASSIGN_OR_RETURN(Value value, Eval(*expr.children[i + 1]));
    if (!key.is_string()) {
      return TypeError(
          absl::StrCat("dict keys must be strings in chat templates, got '", TypeName(key), "'"));
    }
    dict.Set(key.str(), std::move(value));
  }
  Value v = Value::Dict(std::move(dict));
  SPECD_RETURN_IF_ERROR(CheckDepth(v));
  return v;
}

absl::StatusOr<Value> Interpreter::EvalSlice(const Expr& expr) {
  SPECD_ASSIGN_OR_RETURN(Value obj, Eval(*expr.children[0]));
  Value bounds[3];
  for (int i = 0; i < 3; ++i) {
    if (expr.children[i + 1] == nullptr) continue;
    SPECD_ASSIGN_OR_RETURN(bounds[i], Eval(*expr.children[i + 1]));
    if (bounds[i].is_undefined()) return UndefinedError(bounds[i]);
  }
  SPECD_ASSIGN_OR_RETURN(Value result, SliceValue(obj, bounds[0], bounds[1], bounds[2]));
  SPECD_RETURN_IF_ERROR(ChargeCopy(result));
  return result;
}

absl::StatusOr<Value> Interpreter::EvalUnary(const Expr& expr) {
  SPECD_ASSIGN_OR_RETURN(Value operand, Eval(*expr.children[0]));
  return ApplyUnary(static_cast<UnaryOp>(expr.op), operand);
}

absl::StatusOr<Value> Interpreter::EvalConcat(const Expr& expr) {
  std::string out;
  for (const ExprPtr& child : expr.children) {
    SPECD_ASSIGN_OR_RETURN(Value part, Eval(*child));
    AppendPyStr(part, &out, limits_.max_output_bytes);
    SPECD_RETURN_IF_ERROR(CheckSize(out.size()));
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> Interpreter::EvalCompare(const Expr& expr) {
  SPECD_ASSIGN_OR_RETURN(Value left, Eval(*expr.children[0]));
  for (size_t i = 0; i < expr.compare_ops.size(); ++i) {
    SPECD_ASSIGN_OR_RETURN(Value right, Eval(*expr.children[i + 1]));
    bool result = false;
    const CompareOp op = expr.compare_ops[i];
    if (op == CompareOp::kEq || op == CompareOp::kNe) {
      result = PyEquals(left, right) == (op == CompareOp::kEq);
    } else if (op == CompareOp::kIn || op == CompareOp::kNotIn) {
      SPECD_RETURN_IF_ERROR(ChargeCopy(right));  // a scan, as long as a copy
      SPECD_ASSIGN_OR_RETURN(bool found, Contains(right, left));
      result = found == (op == CompareOp::kIn);
    } else {
      if (left.is_undefined()) return UndefinedError(left);
      if (right.is_undefined()) return UndefinedError(right);
      SPECD_ASSIGN_OR_RETURN(int c, PyCompare(left, right));
      if (c == 2) {
        result = false;  // NaN is unordered
      } else if (op == CompareOp::kLt) {
        result = c < 0;
      } else if (op == CompareOp::kLe) {
        result = c <= 0;
      } else if (op == CompareOp::kGt) {
        result = c > 0;
      } else {
        result = c >= 0;
      }
    }
    if (!result) return Value::Bool(false);
    left = std::move(right);
  }
  return Value::Bool(true);
}

absl::StatusOr<CallArgs> Interpreter::EvalArgs(const Expr& expr, size_t first_arg) {
  CallArgs args;
  for (size_t i = first_arg; i < expr.children.size(); ++i) {
    SPECD_ASSIGN_OR_RETURN(Value v, Eval(*expr.children[i]));
    args.positional.push_back(std::move(v));
  }
  for (const auto& [name, value_expr] : expr.kwargs) {
    SPECD_ASSIGN_OR_RETURN(Value v, Eval(*value_expr));
    args.keyword.emplace_back(name, std::move(v));
  }
  return args;
}

absl::StatusOr<Value> Interpreter::EvalFilter(const Expr& expr, const Value* block_input) {
  Value input;
  const Expr* inner = expr.children[0].get();
  if (inner == nullptr) {
    input = *block_input;
  } else if (inner->kind == ExprKind::kFilter && block_input != nullptr) {
    SPECD_ASSIGN_OR_RETURN(input, EvalFilter(*inner, block_input));
  } else {
    SPECD_ASSIGN_OR_RETURN(input, Eval(*inner));
  }
  SPECD_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(expr, 1));
  return ApplyFilter(expr.name, input, std::move(args));
}

absl::StatusOr<Value> Interpreter::EvalTest(const Expr& expr) {
  SPECD_ASSIGN_OR_RETURN(Value input, Eval(*expr.children[0]));
  SPECD_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(expr, 1));
  SPECD_ASSIGN_OR_RETURN(bool result, ApplyTest(expr.name, input, std::move(args)));
  return Value::Bool(result != expr.negated);
}

absl::StatusOr<Value> Interpreter::EvalCall(const Expr& expr) {
  const Expr& callee_expr = *expr.children[0];
  if (callee_expr.kind == ExprKind::kGetAttr) {
    // obj.method(...) without materializing a bound method.
    SPECD_ASSIGN_OR_RETURN(Value obj, Eval(*callee_expr.children[0]));
    if (HasMethod(obj, callee_expr.name)) {
      SPECD_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(expr, 1));
      return CallMethod(*this, obj, callee_expr.name, std::move(args));
    }
    SPECD_ASSIGN_OR_RETURN(Value callee, GetAttr(obj, callee_expr.name));
    SPECD_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(expr, 1));
    return CallValue(callee, std::move(args));
  }
  SPECD_ASSIGN_OR_RETURN(Value callee, Eval(callee_expr));
  SPECD_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(expr, 1));
  return CallValue(callee, std::move(args));
}

absl::StatusOr<Value> Interpreter::CallValue(const Value& callee, CallArgs args) {
  if (callee.is_undefined()) return UndefinedError(callee);
  if (!callee.is_callable()) {
    return TypeError(absl::StrCat("'", TypeName(callee), "' object is not callable"));
  }
  SPECD_RETURN_IF_ERROR(Step());
  return callee.callable().Call(*this, std::move(args));
}

absl::StatusOr<Value> Interpreter::ApplyFilter(absl::string_view name, const Value& input,
                                               CallArgs args) {
  const FilterFn fn = FindFilter(name);
  if (fn == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("no filter named '", name, "'"));
  SPECD_ASSIGN_OR_RETURN(Value result, fn(*this, input, std::move(args)));
  if (result.is_string()) SPECD_RETURN_IF_ERROR(CheckSize(result.str().size()));
  SPECD_RETURN_IF_ERROR(ChargeCopy(result));
  return result;
}

absl::StatusOr<bool> Interpreter::ApplyTest(absl::string_view name, const Value& input,
                                            CallArgs args) {
  const TestFn fn = FindTest(name);
  if (fn == nullptr) return absl::InvalidArgumentError(absl::StrCat("no test named '", name, "'"));
  return fn(*this, input, std::move(args));
}

absl::StatusOr<Value> Interpreter::GetAttr(const Value& obj, absl::string_view name) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if (HasMethod(obj, name)) return BoundMethod(obj, name);
  const ValueDict* dict = obj.is_dict()        ? &obj.dict()
                          : obj.is_namespace() ? &obj.namespace_attrs()
                                               : nullptr;
  if (dict != nullptr) {
    if (const Value* v = dict->Find(name)) return *v;
  }
  return MissingMember(obj, Value::String(std::string(name)));
}

absl::StatusOr<Value> Interpreter::GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return UndefinedError(obj);
  // An undefined key finds nothing (Jinja looks it up like any other hashable key).
  if (key.is_undefined()) return MissingMember(obj, key);
  if ((obj.is_dict() || obj.is_namespace()) && key.is_string()) {
    const ValueDict& dict = obj.is_dict() ? obj.dict() : obj.namespace_attrs();
    if (const Value* v = dict.Find(key.str())) return *v;
  }
  if (((obj.is_sequence() && !obj.is_generator()) || obj.is_string()) &&
      (key.is_int() || key.is_bool())) {
    int64_t i = key.int_value();
    if (obj.is_string()) {
      const std::u32string cps = DecodeUtf8(obj.str());
      const auto n = static_cast<int64_t>(cps.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value::String(EncodeUtf8(cps.substr(i, 1)));
    } else {
      const auto n = static_cast<int64_t>(obj.list().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.list()[i];
    }
  }
  if (key.is_string() && HasMethod(obj, key.str())) return BoundMethod(obj, key.str());
  return MissingMember(obj, key);
}

absl::Status Interpreter::ChargeCopy(const Value& v) {
  if (v.is_sequence()) return Step(static_cast<int64_t>(v.list().size()));
  if (v.is_dict()) return Step(static_cast<int64_t>(v.dict().size()));
  if (v.is_string()) return Step(static_cast<int64_t>(v.str().size() / 64));
  return absl::OkStatus();
}

absl::StatusOr<ValueList> Interpreter::Iterate(const Value& value) {
  if (value.is_sequence() || value.is_dict()) SPECD_RETURN_IF_ERROR(ChargeCopy(value));
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return ValueList();
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return value.list();  // generators too
    case Value::Kind::kDict: {
      ValueList keys;
      keys.reserve(value.dict().size());
      for (const auto& [key, item] : value.dict().entries()) keys.push_back(Value::String(key));
      return keys;
    }
    case Value::Kind::kString: {
      ValueList chars;
      for (char32_t cp : DecodeUtf8(value.str())) {
        std::string c;
        AppendUtf8(cp, &c);
        chars.push_back(Value::String(std::move(c)));
      }
      return chars;
    }
    default:
      return TypeError(absl::StrCat("'", TypeName(value), "' object is not iterable"));
  }
}

}  // namespace specd::jinja
