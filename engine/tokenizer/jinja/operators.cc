// Arithmetic, membership and slicing with Python semantics (see operators.h).
#include "engine/tokenizer/jinja/operators.h"

#include <cmath>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/base/status.h"
#include "engine/tokenizer/jinja/library.h"
#include "engine/tokenizer/jinja/utf8.h"

namespace specd::jinja {
namespace {

absl::string_view OpSymbol(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd:
      return "+";
    case BinaryOp::kSub:
      return "-";
    case BinaryOp::kMul:
      return "*";
    case BinaryOp::kDiv:
      return "/";
    case BinaryOp::kFloorDiv:
      return "//";
    case BinaryOp::kMod:
      return "%";
    case BinaryOp::kPow:
      return "**";
  }
  return "?";
}

absl::Status Unsupported(BinaryOp op, const Value& a, const Value& b) {
  return TypeError(absl::StrCat("unsupported operand type(s) for ", OpSymbol(op), ": '",
                                TypeName(a), "' and '", TypeName(b), "'"));
}

absl::Status Overflow() { return absl::InvalidArgumentError("integer overflow"); }

absl::StatusOr<Value> IntPow(int64_t base, int64_t exp) {
  if (exp < 0) return Value::Float(std::pow(static_cast<double>(base), static_cast<double>(exp)));
  int64_t result = 1;
  while (exp > 0) {
    if (exp & 1) {
      if (__builtin_mul_overflow(result, base, &result)) return Overflow();
    }
    exp >>= 1;
    if (exp > 0 && __builtin_mul_overflow(base, base, &base)) return Overflow();
  }
  return Value::Int(result);
}

absl::StatusOr<Value> IntArith(BinaryOp op, int64_t x, int64_t y) {
  int64_t r = 0;
  switch (op) {
    case BinaryOp::kAdd:
      if (__builtin_add_overflow(x, y, &r)) return Overflow();
      return Value::Int(r);
    case BinaryOp::kSub:
      if (__builtin_sub_overflow(x, y, &r)) return Overflow();
      return Value::Int(r);
    case BinaryOp::kMul:
      if (__builtin_mul_overflow(x, y, &r)) return Overflow();
      return Value::Int(r);
    case BinaryOp::kDiv:
      if (y == 0) return absl::InvalidArgumentError("division by zero");
      return Value::Float(static_cast<double>(x) / static_cast<double>(y));
    case BinaryOp::kFloorDiv:
    case BinaryOp::kMod: {
      if (y == 0) return absl::InvalidArgumentError("integer division or modulo by zero");
      if (x == std::numeric_limits<int64_t>::min() && y == -1) return Overflow();
      int64_t q = x / y;
      int64_t m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return Value::Int(op == BinaryOp::kFloorDiv ? q : m);
    }
    case BinaryOp::kPow:
      return IntPow(x, y);
  }
  return Overflow();
}

absl::StatusOr<Value> FloatArith(BinaryOp op, double x, double y) {
  switch (op) {
    case BinaryOp::kAdd:
      return Value::Float(x + y);
    case BinaryOp::kSub:
      return Value::Float(x - y);
    case BinaryOp::kMul:
      return Value::Float(x * y);
    case BinaryOp::kDiv:
      if (y == 0) return absl::InvalidArgumentError("float division by zero");
      return Value::Float(x / y);
    case BinaryOp::kFloorDiv:
      if (y == 0) return absl::InvalidArgumentError("float floor division by zero");
      return Value::Float(std::floor(x / y));
    case BinaryOp::kMod: {
      if (y == 0) return absl::InvalidArgumentError("float modulo");
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::Float(m);
    }
    case BinaryOp::kPow:
      return Value::Float(std::pow(x, y));
  }
  return Value::Float(0);
}

absl::StatusOr<Value> Repeat(const Value& seq, int64_t times, size_t max_bytes) {
  if (times <= 0) return seq.is_string() ? Value::String("") : Value::List({});
  const size_t unit = seq.is_string() ? seq.str().size() : seq.list().size() * sizeof(Value);
  if (unit > 0 && static_cast<uint64_t>(times) > max_bytes / unit) {
    return absl::InvalidArgumentError(
        absl::StrCat("repetition result exceeds the limit of ", max_bytes, " bytes"));
  }
  if (seq.is_string()) {
    std::string out;
    out.reserve(unit * times);
    for (int64_t i = 0; i < times; ++i) out += seq.str();
    return Value::String(std::move(out));
  }
  ValueList out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
  return seq.kind() == Value::Kind::kTuple ? Value::Tuple(std::move(out))
                                           : Value::List(std::move(out));
}

// Python's slice.indices(): normalized start and stop for a sequence of `len` items.
void AdjustSlice(int64_t len, int64_t step, const Value& start_v, const Value& stop_v,
                 int64_t* start, int64_t* stop) {
  const int64_t lower = step < 0 ? -1 : 0;
  const int64_t upper = step < 0 ? len - 1 : len;
  auto adjust = [&](const Value& v, int64_t omitted) {
    if (v.is_none() || v.is_undefined()) return omitted;
    int64_t i = v.int_value();
    if (i < 0) i = std::max(i + len, lower);
    return std::min(std::max(i, lower), upper);
  };
  *start = adjust(start_v, step < 0 ? upper : lower);
  *stop = adjust(stop_v, step < 0 ? lower : upper);
}

}  // namespace

absl::Status UndefinedError(const Value& v) {
  return absl::InvalidArgumentError(v.str().empty() ? "value is undefined" : v.str());
}

absl::StatusOr<Value> ApplyBinary(BinaryOp op, const Value& a, const Value& b, size_t max_bytes) {
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) return IntArith(op, a.int_value(), b.int_value());
    return FloatArith(op, a.float_value(), b.float_value());
  }
  if (op == BinaryOp::kAdd && a.is_string() && b.is_string()) {
    if (a.str().size() + b.str().size() > max_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("string result exceeds the limit of ", max_bytes, " bytes"));
    }
    return Value::String(absl::StrCat(a.str(), b.str()));
  }
  if (op == BinaryOp::kAdd && a.is_sequence() && a.kind() == b.kind() && !a.is_generator() &&
      !b.is_generator()) {
    ValueList items = a.list();
    items.insert(items.end(), b.list().begin(), b.list().end());
    return a.kind() == Value::Kind::kTuple ? Value::Tuple(std::move(items))
                                           : Value::List(std::move(items));
  }
  if (op == BinaryOp::kMul) {
    const bool a_seq = a.is_string() || a.is_sequence();
    const bool b_seq = b.is_string() || b.is_sequence();
    if (a_seq && (b.is_int() || b.is_bool())) return Repeat(a, b.int_value(), max_bytes);
    if (b_seq && (a.is_int() || a.is_bool())) return Repeat(b, a.int_value(), max_bytes);
  }
  return Unsupported(op, a, b);
}

absl::StatusOr<Value> ApplyUnary(UnaryOp op, const Value& v) {
  if (v.is_undefined()) return UndefinedError(v);
  if (!v.is_number()) {
    return TypeError(absl::StrCat("bad operand type for unary ", op == UnaryOp::kNeg ? "-" : "+",
                                  ": '", TypeName(v), "'"));
  }
  if (v.is_float()) return Value::Float(op == UnaryOp::kNeg ? -v.float_value() : v.float_value());
  if (op == UnaryOp::kPos) return Value::Int(v.int_value());
  if (v.int_value() == std::numeric_limits<int64_t>::min()) return Overflow();
  return Value::Int(-v.int_value());
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        return TypeError(
            absl::StrCat("'in <string>' requires string as left operand, not ", TypeName(item)));
      }
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      for (const Value& element : container.list()) {
        if (PyEquals(element, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      if (item.is_sequence() || item.is_dict() || item.is_namespace()) {
        return TypeError(absl::StrCat("unhashable type: '", TypeName(item), "'"));
      }
      return item.is_string() && container.dict().Find(item.str()) != nullptr;
    default:
      return TypeError(
          absl::StrCat("argument of type '", TypeName(container), "' is not iterable"));
  }
}

absl::StatusOr<Value> SliceValue(const Value& obj, const Value& start, const Value& stop,
                                 const Value& step) {
  if (obj.is_undefined()) return UndefinedError(obj);
  for (const Value* bound : {&start, &stop, &step}) {
    if (!bound->is_none() && !bound->is_undefined() && !bound->is_int() && !bound->is_bool()) {
      return TypeError("slice indices must be integers or None");
    }
  }
  const int64_t step_n = (step.is_none() || step.is_undefined()) ? 1 : step.int_value();
  if (step_n == 0) return absl::InvalidArgumentError("slice step cannot be zero");
  if (obj.is_string()) {
    const std::u32string cps = DecodeUtf8(obj.str());
    int64_t from = 0, to = 0;
    AdjustSlice(static_cast<int64_t>(cps.size()), step_n, start, stop, &from, &to);
    std::u32string out;
    for (int64_t i = from; step_n > 0 ? i < to : i > to; i += step_n) out.push_back(cps[i]);
    return Value::String(EncodeUtf8(out));
  }
  if (obj.is_dict()) return TypeError("unhashable type: 'slice'");
  if (!obj.is_sequence() || obj.is_generator()) {
    // Jinja compiles slices to plain Python subscripts, which fail on other types.
    return TypeError(absl::StrCat("'", TypeName(obj), "' object is not subscriptable"));
  }
  const ValueList& items = obj.list();
  int64_t from = 0, to = 0;
  AdjustSlice(static_cast<int64_t>(items.size()), step_n, start, stop, &from, &to);
  ValueList out;
  for (int64_t i = from; step_n > 0 ? i < to : i > to; i += step_n) out.push_back(items[i]);
  return obj.kind() == Value::Kind::kTuple ? Value::Tuple(std::move(out))
                                           : Value::List(std::move(out));
}

}  // namespace specd::jinja
