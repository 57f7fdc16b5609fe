// Value construction and Python semantics of values (see value.h).
#include "engine/tokenizer/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/tokenizer/jinja/utf8.h"

namespace specd::jinja {
namespace {

const std::string& EmptyString() {
  static const std::string* const kEmpty = new std::string();
  return *kEmpty;
}

int Sign(double d) { return d < 0 ? -1 : (d > 0 ? 1 : 0); }

int CompareNumbers(const Value& a, const Value& b) {
  if (!a.is_float() && !b.is_float()) {
    const int64_t x = a.int_value();
    const int64_t y = b.int_value();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  return Sign(a.float_value() - b.float_value());
}

void AppendReprString(absl::string_view s, std::string* out) {
  const bool has_single = s.find('\'') != absl::string_view::npos;
  const bool has_double = s.find('"') != absl::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  out->push_back(quote);
  for (char32_t cp : DecodeUtf8(s)) {
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(cp));
    } else if (cp == '\n') {
      out->append("\\n");
    } else if (cp == '\r') {
      out->append("\\r");
    } else if (cp == '\t') {
      out->append("\\t");
    } else if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(cp));
      out->append(buf);
    } else if (cp >= 0xD800 && cp <= 0xDFFF) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      out->append(buf);
    } else {
      AppendUtf8(cp, out);
    }
  }
  out->push_back(quote);
}

void AppendSequence(const ValueList& items, bool tuple, std::string* out, size_t max_bytes) {
  out->push_back(tuple ? '(' : '[');
  for (size_t i = 0; i < items.size(); ++i) {
    if (out->size() > max_bytes) return;
    if (i > 0) out->append(", ");
    AppendPyRepr(items[i], out, max_bytes);
  }
  if (tuple && items.size() == 1) out->push_back(',');
  out->push_back(tuple ? ')' : ']');
}

void AppendDict(const ValueDict& dict, std::string* out, size_t max_bytes) {
  out->push_back('{');
  bool first = true;
  for (const auto& [key, value] : dict.entries()) {
    if (out->size() > max_bytes) return;
    if (!first) out->append(", ");
    first = false;
    AppendReprString(key, out);
    out->append(": ");
    AppendPyRepr(value, out, max_bytes);
  }
  out->push_back('}');
}

}  // namespace

Value Value::Undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.ptr_ = std::make_shared<std::string>(std::move(hint));
  return v;
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.scalar_.b = b;
  return v;
}

Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.scalar_.i = i;
  return v;
}

Value Value::Float(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.scalar_.d = d;
  return v;
}

Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.ptr_ = std::make_shared<std::string>(std::move(s));
  return v;
}

void Value::SetChildrenInfo(const ValueList& items) {
  int depth = 1;
  for (const Value& item : items) {
    depth = std::max(depth, item.depth_ + 1);
    has_namespace_ = has_namespace_ || item.has_namespace_;
  }
  depth_ = static_cast<uint16_t>(std::min(depth, 65535));
}

Value Value::List(ValueList items) {
  Value v;
  v.kind_ = Kind::kList;
  v.SetChildrenInfo(items);
  v.ptr_ = std::make_shared<ValueList>(std::move(items));
  return v;
}

Value Value::Tuple(ValueList items) {
  Value v = List(std::move(items));
  v.kind_ = Kind::kTuple;
  return v;
}

Value Value::Generator(ValueList items) {
  Value v = List(std::move(items));
  v.generator_ = true;
  return v;
}

Value Value::Dict(ValueDict dict) {
  Value v;
  v.kind_ = Kind::kDict;
  int depth = 1;
  for (const auto& [key, item] : dict.entries()) {
    depth = std::max(depth, item.depth_ + 1);
    v.has_namespace_ = v.has_namespace_ || item.has_namespace_;
  }
  v.depth_ = static_cast<uint16_t>(std::min(depth, 65535));
  v.ptr_ = std::make_shared<ValueDict>(std::move(dict));
  return v;
}

Value Value::Namespace(ValueDict attrs) {
  Value v = Dict(std::move(attrs));
  v.kind_ = Kind::kNamespace;
  v.has_namespace_ = true;
  return v;
}

Value Value::Function(std::shared_ptr<const Callable> fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.ptr_ = std::const_pointer_cast<Callable>(std::move(fn));
  return v;
}

double Value::float_value() const {
  return is_float() ? scalar_.d : static_cast<double>(int_value());
}

const std::string& Value::str() const {
  if (ptr_ == nullptr || (kind_ != Kind::kString && kind_ != Kind::kUndefined)) {
    return EmptyString();
  }
  return *static_cast<const std::string*>(ptr_.get());
}

const ValueList& Value::list() const { return *static_cast<const ValueList*>(ptr_.get()); }

const ValueDict& Value::dict() const { return *static_cast<const ValueDict*>(ptr_.get()); }

ValueDict& Value::namespace_attrs() const { return *static_cast<ValueDict*>(ptr_.get()); }

const Callable& Value::callable() const { return *static_cast<const Callable*>(ptr_.get()); }

const Value* ValueDict::Find(absl::string_view key) const {
  if (index_.empty()) {
    for (const auto& entry : entries_) {
      if (entry.first == key) return &entry.second;
    }
    return nullptr;
  }
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

void ValueDict::Set(std::string key, Value value) {
  if (Value* existing = const_cast<Value*>(Find(key))) {
    *existing = std::move(value);
    return;
  }
  entries_.emplace_back(std::move(key), std::move(value));
  if (!index_.empty()) {
    index_.emplace(entries_.back().first, entries_.size() - 1);
  } else if (entries_.size() > kIndexThreshold) {
    for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].first, i);
  }
}

void ValueDict::Clear() {
  entries_.clear();
  index_.clear();
}

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return v.bool_value();
    case Value::Kind::kInt:
      return v.int_value() != 0;
    case Value::Kind::kFloat:
      return v.float_value() != 0.0;
    case Value::Kind::kString:
      return !v.str().empty();
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return v.is_generator() || !v.list().empty();
    case Value::Kind::kDict:
      return !v.dict().empty();
    case Value::Kind::kNamespace:
    case Value::Kind::kCallable:
      return true;
  }
  return false;
}

absl::string_view TypeName(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      return v.is_generator() ? "generator" : "list";
    case Value::Kind::kTuple:
      return "tuple";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kNamespace:
      return "Namespace";
    case Value::Kind::kCallable:
      return "function";
  }
  return "object";
}

std::string FormatPyFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  absl::string_view sci(buf, res.ptr - buf);
  std::string out;
  if (sci.front() == '-') {
    out.push_back('-');
    sci.remove_prefix(1);
  }
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos)) {
    if (c != '.') digits.push_back(c);
  }
  int exponent = 0;
  absl::string_view exp_text = sci.substr(e_pos + 1);
  if (exp_text.front() == '+') exp_text.remove_prefix(1);
  std::from_chars(exp_text.data(), exp_text.data() + exp_text.size(), exponent);
  const int decpt = exponent + 1;
  const int num_digits = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      absl::StrAppend(&out, "0.", std::string(-decpt, '0'), digits);
    } else if (decpt >= num_digits) {
      absl::StrAppend(&out, digits, std::string(decpt - num_digits, '0'), ".0");
    } else {
      absl::StrAppend(&out, digits.substr(0, decpt), ".", digits.substr(decpt));
    }
    return out;
  }
  out.push_back(digits[0]);
  if (num_digits > 1) absl::StrAppend(&out, ".", digits.substr(1));
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  out.append(exp_buf);
  return out;
}

void AppendPyStr(const Value& v, std::string* out, size_t max_bytes) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return;
    case Value::Kind::kString:
      out->append(v.str());
      return;
    default:
      AppendPyRepr(v, out, max_bytes);
  }
}

std::string PyStr(const Value& v) {
  if (v.is_string()) return v.str();
  std::string out;
  AppendPyStr(v, &out);
  return out;
}

void AppendPyRepr(const Value& v, std::string* out, size_t max_bytes) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      out->append("Undefined");
      return;
    case Value::Kind::kNone:
      out->append("None");
      return;
    case Value::Kind::kBool:
      out->append(v.bool_value() ? "True" : "False");
      return;
    case Value::Kind::kInt:
      absl::StrAppend(out, v.int_value());
      return;
    case Value::Kind::kFloat:
      out->append(FormatPyFloat(v.float_value()));
      return;
    case Value::Kind::kString:
      AppendReprString(v.str(), out);
      return;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      AppendSequence(v.list(), v.kind() == Value::Kind::kTuple, out, max_bytes);
      return;
    case Value::Kind::kDict:
      AppendDict(v.dict(), out, max_bytes);
      return;
    case Value::Kind::kNamespace:
      out->append("<Namespace ");
      AppendDict(v.namespace_attrs(), out, max_bytes);
      out->append(">");
      return;
    case Value::Kind::kCallable:
      absl::StrAppend(out, "<function ", v.callable().name(), ">");
      return;
  }
}

std::string PyRepr(const Value& v) {
  std::string out;
  AppendPyRepr(v, &out);
  return out;
}

std::string ShortRepr(const Value& v) {
  constexpr size_t kMax = 100;
  std::string out;
  AppendPyRepr(v, &out, kMax);
  if (out.size() > kMax) {
    out.resize(kMax);
    out += "...";
  }
  return out;
}

bool PyEquals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return CompareNumbers(a, b) == 0;
  if (a.kind() != b.kind() || a.is_generator() || b.is_generator()) return false;
  if (a.SharesStorage(b)) return true;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.str() == b.str();
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      const ValueList& x = a.list();
      const ValueList& y = b.list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!PyEquals(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const ValueDict& x = a.dict();
      const ValueDict& y = b.dict();
      if (x.size() != y.size()) return false;
      for (const auto& [key, value] : x.entries()) {
        const Value* other = y.Find(key);
        if (other == nullptr || !PyEquals(value, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace:
      return &a.namespace_attrs() == &b.namespace_attrs();
    case Value::Kind::kCallable:
      return &a.callable() == &b.callable();
    default:
      return false;
  }
}

absl::StatusOr<int> PyCompare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (std::isnan(a.float_value()) || std::isnan(b.float_value())) return 2;  // unordered
    return CompareNumbers(a, b);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_sequence() && a.kind() == b.kind()) {
    if (a.SharesStorage(b)) return 0;
    const ValueList& x = a.list();
    const ValueList& y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (PyEquals(x[i], y[i])) continue;
      return PyCompare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  return absl::InvalidArgumentError(absl::StrCat("comparison not supported between instances of '",
                                                 TypeName(a), "' and '", TypeName(b), "'"));
}

}  // namespace specd::jinja
