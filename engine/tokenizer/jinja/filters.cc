// String and scalar filters of the chat-template interpreter and the filter table (see
// library.h). Semantics follow jinja2 3.1's filters; `tojson` is transformers' override
// (json.dumps with ensure_ascii=False).
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/base/status.h"
#include "engine/tokenizer/jinja/filters_internal.h"
#include "engine/tokenizer/jinja/interpreter.h"
#include "engine/tokenizer/jinja/json_bridge.h"
#include "engine/tokenizer/jinja/library.h"
#include "engine/tokenizer/jinja/operators.h"
#include "engine/tokenizer/jinja/strings.h"
#include "engine/tokenizer/jinja/utf8.h"

namespace specd::jinja {
namespace {

absl::StatusOr<Value> FilterAbs(Interpreter&, const Value& input, CallArgs args) {
  SPECD_RETURN_IF_ERROR(BindArgs("abs", std::move(args), {}).status());
  if (input.is_undefined()) return UndefinedError(input);
  if (input.is_float()) return Value::Float(std::fabs(input.float_value()));
  if (!input.is_number()) {
    return TypeError(absl::StrCat("bad operand type for abs(): '", TypeName(input), "'"));
  }
  if (input.int_value() == std::numeric_limits<int64_t>::min()) {
    return absl::InvalidArgumentError("integer overflow");
  }
  return Value::Int(std::abs(input.int_value()));
}

absl::StatusOr<Value> FilterAttr(Interpreter& interp, const Value& input, CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a, BindArgs("attr", std::move(args), {"name"}));
  SPECD_ASSIGN_OR_RETURN(std::string name, StringArg("attr", a[0]));
  return interp.GetAttr(input, name);
}

absl::StatusOr<Value> FilterDefault(Interpreter&, const Value& input, CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a,
                         BindArgs("default", std::move(args), {"default_value", "boolean"}));
  const bool use_default = input.is_undefined() || (Truthy(a[1]) && !Truthy(input));
  if (!use_default) return input;
  return a[0].is_undefined() ? Value::String("") : a[0];
}

absl::StatusOr<Value> FilterEscape(Interpreter&, const Value& input, CallArgs args) {
  SPECD_RETURN_IF_ERROR(BindArgs("escape", std::move(args), {}).status());
  std::string out;
  for (char c : PyStr(input)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return Value::String(std::move(out));
}

// Python float(str): surrounding whitespace allowed, also "inf" and "nan".
bool ParsePyFloat(absl::string_view text, double* out) {
  const std::string stripped = PyStrip(text, std::nullopt, true, true);
  return !stripped.empty() && absl::SimpleAtod(stripped, out);
}

absl::StatusOr<Value> FilterFloat(Interpreter&, const Value& input, CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a, BindArgs("float", std::move(args), {"default"}));
  if (input.is_undefined()) return UndefinedError(input);
  const Value fallback = a[0].is_undefined() ? Value::Float(0.0) : a[0];
  if (input.is_number()) return Value::Float(input.float_value());
  double d = 0;
  if (input.is_string() && ParsePyFloat(input.str(), &d)) return Value::Float(d);
  return fallback;
}

absl::StatusOr<Value> FilterInt(Interpreter&, const Value& input, CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a,
                         BindArgs("int", std::move(args), {"default", "base"}));
  if (input.is_undefined()) return UndefinedError(input);
  const Value fallback = a[0].is_undefined() ? Value::Int(0) : a[0];
  int64_t base = 10;
  if (!a[1].is_undefined()) {
    SPECD_ASSIGN_OR_RETURN(base, IntArg("int", a[1]));
  }
  if (input.is_int() || input.is_bool()) return Value::Int(input.int_value());
  double d = 0;
  if (input.is_float()) {
    d = input.float_value();
  } else if (input.is_string()) {
    std::string text = PyStrip(input.str(), std::nullopt, true, true);
    std::erase(text, '_');
    int64_t i = 0;
    if (base == 10 && absl::SimpleAtoi(text, &i)) return Value::Int(i);
    if (base == 16 && absl::SimpleHexAtoi(text, &i)) return Value::Int(i);
    if (!ParsePyFloat(text, &d)) return fallback;
  } else {
    return fallback;
  }
  if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return fallback;
  return Value::Int(static_cast<int64_t>(d));
}

absl::StatusOr<Value> FilterIndent(Interpreter& interp, const Value& input, CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a,
                         BindArgs("indent", std::move(args), {"width", "first", "blank"}));
  if (input.is_undefined()) return UndefinedError(input);
  if (!input.is_string()) {
    return TypeError(
        absl::StrCat("unsupported operand type(s) for +=: '", TypeName(input), "' and 'str'"));
  }
  std::string indentation(4, ' ');
  if (a[0].is_string()) {
    indentation = a[0].str();
  } else if (!a[0].is_undefined()) {
    SPECD_ASSIGN_OR_RETURN(int64_t width, IntArg("indent", a[0]));
    SPECD_RETURN_IF_ERROR(interp.CheckSize(static_cast<size_t>(std::max<int64_t>(width, 0))));
    indentation.assign(static_cast<size_t>(std::max<int64_t>(width, 0)), ' ');
  }
  const std::vector<std::string> lines = PySplitLines(input.str() + "\n", false);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out.push_back('\n');
    const bool indent = i == 0 ? Truthy(a[1]) : (Truthy(a[2]) || !lines[i].empty());
    if (indent) out += indentation;
    out += lines[i];
    SPECD_RETURN_IF_ERROR(interp.CheckSize(out.size()));
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FilterCase(const Value& input, CallArgs args, absl::string_view name) {
  SPECD_RETURN_IF_ERROR(BindArgs(name, std::move(args), {}).status());
  const std::string s = PyStr(input);
  if (name == "lower") return Value::String(PyLower(s));
  if (name == "upper") return Value::String(PyUpper(s));
  if (name == "title") return Value::String(JinjaTitle(s));
  return Value::String(PyCapitalize(s));
}

absl::StatusOr<Value> FilterLower(Interpreter&, const Value& input, CallArgs args) {
  return FilterCase(input, std::move(args), "lower");
}
absl::StatusOr<Value> FilterUpper(Interpreter&, const Value& input, CallArgs args) {
  return FilterCase(input, std::move(args), "upper");
}
absl::StatusOr<Value> FilterTitle(Interpreter&, const Value& input, CallArgs args) {
  return FilterCase(input, std::move(args), "title");
}
absl::StatusOr<Value> FilterCapitalize(Interpreter&, const Value& input, CallArgs args) {
  return FilterCase(input, std::move(args), "capitalize");
}

absl::StatusOr<Value> FilterReplace(Interpreter& interp, const Value& input, CallArgs args) {
  CallArgs method_args = std::move(args);
  return CallMethod(interp, Value::String(PyStr(input)), "replace", std::move(method_args));
}

// Python's round(int, ndigits): ndigits < 0 rounds to a power of ten, half to even.
Value RoundInt(int64_t value, int64_t precision) {
  if (precision >= 0) return Value::Int(value);
  if (precision < -18) return Value::Int(0);
  int64_t unit = 1;
  for (int64_t i = 0; i < -precision; ++i) unit *= 10;
  int64_t quotient = value / unit;
  int64_t remainder = value % unit;
  if (remainder < 0) {
    --quotient;
    remainder += unit;
  }
  if (remainder * 2 > unit || (remainder * 2 == unit && quotient % 2 != 0)) ++quotient;
  return Value::Int(quotient * unit);
}

absl::StatusOr<Value> FilterRound(Interpreter&, const Value& input, CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a,
                         BindArgs("round", std::move(args), {"precision", "method"}));
  if (input.is_undefined()) return UndefinedError(input);
  if (!input.is_number()) return TypeError("round(): expected a number");
  int64_t precision = 0;
  if (!a[0].is_undefined()) {
    SPECD_ASSIGN_OR_RETURN(precision, IntArg("round", a[0]));
  }
  const std::string method = a[1].is_undefined() ? "common" : PyStr(a[1]);
  if (method != "common" && method != "ceil" && method != "floor") {
    return absl::InvalidArgumentError("method must be common, ceil or floor");
  }
  if (method == "common" && !input.is_float()) return RoundInt(input.int_value(), precision);
  const double x = input.float_value();
  if (!std::isfinite(x)) return Value::Float(x);
  precision = std::clamp<int64_t>(precision, -308, 308);
  if (method != "common") {
    const double scale = std::pow(10.0, static_cast<double>(precision));
    return Value::Float((method == "ceil" ? std::ceil(x * scale) : std::floor(x * scale)) / scale);
  }
  if (precision <= 0) {
    const double scale = std::pow(10.0, static_cast<double>(-precision));
    return Value::Float(std::nearbyint(x / scale) * scale);
  }
  // printf rounds the exact binary value half-to-even, as Python's round() does.
  char buf[400];
  std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision), x);
  double rounded = 0;
  absl::SimpleAtod(buf, &rounded);
  return Value::Float(rounded);
}

absl::StatusOr<Value> FilterString(Interpreter&, const Value& input, CallArgs args) {
  SPECD_RETURN_IF_ERROR(BindArgs("string", std::move(args), {}).status());
  return Value::String(PyStr(input));
}

absl::StatusOr<Value> FilterToJson(Interpreter& interp, const Value& input, CallArgs args) {
  // transformers' signature: tojson(x, ensure_ascii=False, indent=None, separators=None,
  // sort_keys=False).
  SPECD_ASSIGN_OR_RETURN(
      std::vector<Value> a,
      BindArgs("tojson", std::move(args), {"ensure_ascii", "indent", "separators", "sort_keys"}));
  JsonDumpOptions options;
  options.ensure_ascii = Truthy(a[0]);
  if (a[1].is_string()) {
    options.indent = a[1].str();
  } else if (!a[1].is_undefined() && !a[1].is_none()) {
    SPECD_ASSIGN_OR_RETURN(int64_t width, IntArg("tojson", a[1]));
    options.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(width, 0, 64)), ' ');
  }
  if (a[2].is_sequence() && a[2].list().size() == 2 && a[2].list()[0].is_string() &&
      a[2].list()[1].is_string()) {
    options.item_separator = a[2].list()[0].str();
    options.key_separator = a[2].list()[1].str();
  } else if (!a[2].is_undefined() && !a[2].is_none()) {
    return TypeError("tojson(): separators must be a pair of strings");
  }
  options.sort_keys = Truthy(a[3]);
  options.max_bytes = interp.max_output_bytes();
  SPECD_ASSIGN_OR_RETURN(std::string json, DumpJson(input, options));
  return Value::String(std::move(json));
}

absl::StatusOr<Value> FilterTrim(Interpreter&, const Value& input, CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a, BindArgs("trim", std::move(args), {"chars"}));
  std::optional<std::string> chars;
  if (!a[0].is_undefined() && !a[0].is_none()) {
    SPECD_ASSIGN_OR_RETURN(chars, StringArg("trim", a[0]));
  }
  return Value::String(PyStrip(PyStr(input), chars, true, true));
}

absl::StatusOr<Value> FilterWordCount(Interpreter&, const Value& input, CallArgs args) {
  SPECD_RETURN_IF_ERROR(BindArgs("wordcount", std::move(args), {}).status());
  int64_t words = 0;
  bool in_word = false;
  for (char32_t cp : DecodeUtf8(PyStr(input))) {
    const bool word_char =
        cp == '_' || (cp >= '0' && cp <= '9') || IsCasedCp(cp) || (cp >= 0x80 && !IsPySpace(cp));
    if (word_char && !in_word) ++words;
    in_word = word_char;
  }
  return Value::Int(words);
}

}  // namespace

FilterFn FindFilter(absl::string_view name) {
  static const auto* const kFilters = new absl::flat_hash_map<absl::string_view, FilterFn>{
      {"abs", &FilterAbs},
      {"attr", &FilterAttr},
      {"capitalize", &FilterCapitalize},
      {"count", &FilterLength},
      {"d", &FilterDefault},
      {"default", &FilterDefault},
      {"dictsort", &FilterDictSort},
      {"e", &FilterEscape},
      {"escape", &FilterEscape},
      {"first", &FilterFirst},
      {"float", &FilterFloat},
      {"forceescape", &FilterEscape},
      {"indent", &FilterIndent},
      {"int", &FilterInt},
      {"items", &FilterItems},
      {"join", &FilterJoin},
      {"last", &FilterLast},
      {"length", &FilterLength},
      {"list", &FilterList},
      {"lower", &FilterLower},
      {"map", &FilterMap},
      {"max", &FilterMax},
      {"min", &FilterMin},
      {"reject", &FilterReject},
      {"rejectattr", &FilterRejectAttr},
      {"replace", &FilterReplace},
      {"reverse", &FilterReverse},
      {"round", &FilterRound},
      {"safe", &FilterString},
      {"select", &FilterSelect},
      {"selectattr", &FilterSelectAttr},
      {"sort", &FilterSort},
      {"string", &FilterString},
      {"sum", &FilterSum},
      {"title", &FilterTitle},
      {"tojson", &FilterToJson},
      {"trim", &FilterTrim},
      {"unique", &FilterUnique},
      {"upper", &FilterUpper},
      {"wordcount", &FilterWordCount},
  };
  auto it = kFilters->find(name);
  return it == kFilters->end() ? nullptr : it->second;
}

}  // namespace specd::jinja
