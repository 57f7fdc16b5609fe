// Python str operations (see strings.h).
#include "engine/tokenizer/jinja/strings.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/base/status.h"
#include "engine/tokenizer/jinja/interpreter.h"
#include "engine/tokenizer/jinja/library.h"
#include "engine/tokenizer/jinja/utf8.h"

namespace specd::jinja {
namespace {

bool IsLineBreak(char32_t cp) {
  return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D ||
         cp == 0x1E || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

// Code-point index of the byte offset `byte` in `s`.
int64_t CodePointIndex(absl::string_view s, size_t byte) {
  return static_cast<int64_t>(CodePointCount(s.substr(0, byte)));
}

std::vector<std::string> SplitOnSeparator(absl::string_view s, absl::string_view sep,
                                          int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (!from_right) {
    size_t start = 0;
    for (size_t at = s.find(sep); at != absl::string_view::npos && maxsplit != 0;
         at = s.find(sep, start), --maxsplit) {
      parts.emplace_back(s.substr(start, at - start));
      start = at + sep.size();
    }
    parts.emplace_back(s.substr(start));
    return parts;
  }
  size_t end = s.size();
  while (maxsplit != 0 && end >= sep.size()) {
    const size_t at = s.rfind(sep, end - sep.size());
    if (at == absl::string_view::npos) break;
    parts.emplace_back(s.substr(at + sep.size(), end - at - sep.size()));
    end = at;
    --maxsplit;
  }
  parts.emplace_back(s.substr(0, end));
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> SplitOnWhitespace(absl::string_view s, int64_t maxsplit, bool from_right) {
  std::u32string cps = DecodeUtf8(s);
  if (from_right) std::reverse(cps.begin(), cps.end());
  std::vector<std::string> parts;
  size_t i = 0;
  const size_t n = cps.size();
  auto emit = [&](size_t from, size_t to) {
    std::u32string piece = cps.substr(from, to - from);
    if (from_right) std::reverse(piece.begin(), piece.end());
    parts.push_back(EncodeUtf8(piece));
  };
  while (i < n && IsPySpace(cps[i])) ++i;
  while (i < n) {
    if (maxsplit == 0) {
      emit(i, n);  // the rest, trailing whitespace included, as Python
      break;
    }
    size_t j = i;
    while (j < n && !IsPySpace(cps[j])) ++j;
    emit(i, j);
    --maxsplit;
    i = j;
    while (i < n && IsPySpace(cps[i])) ++i;
  }
  if (from_right) std::reverse(parts.begin(), parts.end());
  return parts;
}

absl::StatusOr<std::optional<std::string>> OptionalString(absl::string_view fn, const Value& v) {
  if (v.is_undefined() || v.is_none()) return std::optional<std::string>();
  SPECD_ASSIGN_OR_RETURN(std::string s, StringArg(fn, v));
  return std::optional<std::string>(std::move(s));
}

Value StringList(std::vector<std::string> parts) {
  ValueList items;
  items.reserve(parts.size());
  for (std::string& part : parts) items.push_back(Value::String(std::move(part)));
  return Value::List(std::move(items));
}

// `{field}` of str.format: a positional index or keyword name, then .attr / [key].
absl::StatusOr<Value> FormatField(Interpreter& interp, absl::string_view field,
                                  const CallArgs& args, size_t* auto_index) {
  size_t end = std::min(field.find('.'), field.find('['));
  absl::string_view head = field.substr(0, end);
  Value value;
  int64_t index = 0;
  if (head.empty()) {
    index = static_cast<int64_t>((*auto_index)++);
  } else if (!absl::SimpleAtoi(head, &index)) {
    index = -1;
    for (const auto& [name, v] : args.keyword) {
      if (name == head) value = v;
    }
    if (value.is_undefined())
      return absl::InvalidArgumentError(absl::StrCat("KeyError: '", head, "'"));
  }
  if (index >= 0) {
    if (index >= static_cast<int64_t>(args.positional.size())) {
      return absl::InvalidArgumentError("Replacement index out of range for positional args");
    }
    value = args.positional[index];
  }
  while (end < field.size()) {
    if (field[end] == '.') {
      const size_t next = std::min(field.find('.', end + 1), field.find('[', end + 1));
      SPECD_ASSIGN_OR_RETURN(value, interp.GetAttr(value, field.substr(end + 1, next - end - 1)));
      end = next;
    } else {
      const size_t close = field.find(']', end);
      if (close == absl::string_view::npos)
        return absl::InvalidArgumentError("Missing ']' in format string");
      absl::string_view key = field.substr(end + 1, close - end - 1);
      int64_t i = 0;
      const Value key_value =
          absl::SimpleAtoi(key, &i) ? Value::Int(i) : Value::String(std::string(key));
      SPECD_ASSIGN_OR_RETURN(value, interp.GetItem(value, key_value));
      end = close + 1;
    }
  }
  return value;
}

absl::StatusOr<Value> PyFormat(Interpreter& interp, absl::string_view format,
                               const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    const char c = format[i];
    if (c == '}') {
      if (i + 1 < format.size() && format[i + 1] == '}')
        ++i;
      else
        return absl::InvalidArgumentError("Single '}' encountered in format string");
      out.push_back('}');
      continue;
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = format.find('}', i);
    if (close == absl::string_view::npos)
      return absl::InvalidArgumentError("expected '}' before end of string");
    absl::string_view field = format.substr(i + 1, close - i - 1);
    char conversion = 's';
    if (const size_t bang = field.find('!'); bang != absl::string_view::npos) {
      conversion = bang + 1 < field.size() ? field[bang + 1] : 's';
      field = field.substr(0, bang);
    }
    if (field.find(':') != absl::string_view::npos) {
      return absl::InvalidArgumentError("format specs are not supported in str.format");
    }
    SPECD_ASSIGN_OR_RETURN(Value value, FormatField(interp, field, args, &auto_index));
    if (conversion == 'r') {
      AppendPyRepr(value, &out, interp.max_output_bytes());
    } else {
      AppendPyStr(value, &out, interp.max_output_bytes());
    }
    SPECD_RETURN_IF_ERROR(interp.CheckSize(out.size()));
    i = close;
  }
  return Value::String(std::move(out));
}

absl::StatusOr<bool> AffixMatch(absl::string_view s, const Value& affixes, bool prefix) {
  std::vector<std::string> candidates;
  if (affixes.is_sequence()) {
    for (const Value& v : affixes.list()) {
      SPECD_ASSIGN_OR_RETURN(std::string a, StringArg(prefix ? "startswith" : "endswith", v));
      candidates.push_back(std::move(a));
    }
  } else {
    SPECD_ASSIGN_OR_RETURN(std::string a, StringArg(prefix ? "startswith" : "endswith", affixes));
    candidates.push_back(std::move(a));
  }
  for (const std::string& a : candidates) {
    if (a.size() <= s.size() &&
        (prefix ? s.substr(0, a.size()) : s.substr(s.size() - a.size())) == a) {
      return true;
    }
  }
  return false;
}

// isdigit / isalpha / ...: true for a non-empty string whose characters all qualify.
bool AllChars(absl::string_view s, bool (*pred)(char32_t)) {
  const std::u32string cps = DecodeUtf8(s);
  return !cps.empty() && std::all_of(cps.begin(), cps.end(), pred);
}

bool IsDigitCp(char32_t cp) { return cp >= '0' && cp <= '9'; }
bool IsAlphaCp(char32_t cp) { return IsCasedCp(cp) || (cp >= 0x80 && !IsPySpace(cp)); }
bool IsAlnumCp(char32_t cp) { return IsDigitCp(cp) || IsAlphaCp(cp); }

absl::StatusOr<Value> Predicate(absl::string_view s, absl::string_view name) {
  if (name == "isdigit" || name == "isnumeric" || name == "isdecimal") {
    return Value::Bool(AllChars(s, &IsDigitCp));
  }
  if (name == "isalpha") return Value::Bool(AllChars(s, &IsAlphaCp));
  if (name == "isalnum") return Value::Bool(AllChars(s, &IsAlnumCp));
  if (name == "isspace") return Value::Bool(AllChars(s, &IsPySpace));
  if (name == "istitle") return Value::Bool(!s.empty() && PyTitle(s) == s && PyLower(s) != s);
  const std::u32string cps = DecodeUtf8(s);
  bool any_cased = false;
  for (char32_t cp : cps) {
    if (!IsCasedCp(cp)) continue;
    any_cased = true;
    if ((name == "isupper") != (ToUpperCp(cp) == cp)) return Value::Bool(false);
  }
  return Value::Bool(any_cased);
}

int64_t CountOccurrences(absl::string_view s, absl::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(CodePointCount(s)) + 1;
  int64_t n = 0;
  for (size_t at = s.find(sub); at != absl::string_view::npos; at = s.find(sub, at + sub.size())) {
    ++n;
  }
  return n;
}

absl::Status CheckReplaceSize(const Interpreter& interp, absl::string_view s, absl::string_view old,
                              absl::string_view replacement) {
  if (replacement.size() <= old.size()) return absl::OkStatus();
  const auto n = static_cast<size_t>(CountOccurrences(s, old));
  const size_t growth = replacement.size() - old.size();
  if (n > 0 && growth > (size_t{1} << 40) / n) return interp.CheckSize(size_t{1} << 40);
  return interp.CheckSize(s.size() + n * growth);
}

}  // namespace

std::string PyStrip(absl::string_view s, const std::optional<std::string>& chars, bool left,
                    bool right) {
  const std::u32string cps = DecodeUtf8(s);
  const std::u32string set = chars ? DecodeUtf8(*chars) : std::u32string();
  auto strippable = [&](char32_t cp) {
    return chars ? set.find(cp) != std::u32string::npos : IsPySpace(cp);
  };
  size_t begin = 0;
  size_t end = cps.size();
  while (left && begin < end && strippable(cps[begin])) ++begin;
  while (right && end > begin && strippable(cps[end - 1])) --end;
  return EncodeUtf8(std::u32string_view(cps).substr(begin, end - begin));
}

std::vector<std::string> PySplit(absl::string_view s, const std::optional<std::string>& sep,
                                 int64_t maxsplit, bool from_right) {
  if (sep) return SplitOnSeparator(s, *sep, maxsplit, from_right);
  return SplitOnWhitespace(s, maxsplit, from_right);
}

std::vector<std::string> PySplitLines(absl::string_view s, bool keepends) {
  const std::u32string cps = DecodeUtf8(s);
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (!IsLineBreak(cps[i])) continue;
    size_t end = i + 1;
    if (cps[i] == '\r' && end < cps.size() && cps[end] == '\n') ++end;
    lines.push_back(
        EncodeUtf8(std::u32string_view(cps).substr(start, (keepends ? end : i) - start)));
    start = end;
    i = end - 1;
  }
  if (start < cps.size()) lines.push_back(EncodeUtf8(std::u32string_view(cps).substr(start)));
  return lines;
}

std::string PyReplace(absl::string_view s, absl::string_view old, absl::string_view replacement,
                      int64_t count) {
  std::string out;
  if (old.empty()) {
    const std::u32string cps = DecodeUtf8(s);
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count != 0) {
        absl::StrAppend(&out, replacement);
        --count;
      }
      if (i < cps.size()) AppendUtf8(cps[i], &out);
    }
    return out;
  }
  size_t start = 0;
  for (size_t at = s.find(old); at != absl::string_view::npos && count != 0;
       at = s.find(old, start), --count) {
    absl::StrAppend(&out, s.substr(start, at - start));
    absl::StrAppend(&out, replacement);
    start = at + old.size();
  }
  absl::StrAppend(&out, s.substr(start));
  return out;
}

std::string PyTitle(absl::string_view s) {
  std::u32string cps = DecodeUtf8(s);
  bool previous_cased = false;
  for (char32_t& cp : cps) {
    const bool cased = IsCasedCp(cp);
    if (cased) cp = previous_cased ? ToLowerCp(cp) : ToUpperCp(cp);
    previous_cased = cased;
  }
  return EncodeUtf8(cps);
}

std::string JinjaTitle(absl::string_view s) {
  std::u32string cps = DecodeUtf8(s);
  bool word_start = true;
  for (char32_t& cp : cps) {
    const bool separator =
        IsPySpace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
    cp = word_start ? ToUpperCp(cp) : ToLowerCp(cp);
    word_start = separator;
  }
  return EncodeUtf8(cps);
}

std::string PyCapitalize(absl::string_view s) {
  std::u32string cps = DecodeUtf8(s);
  for (size_t i = 0; i < cps.size(); ++i) cps[i] = i == 0 ? ToUpperCp(cps[i]) : ToLowerCp(cps[i]);
  return EncodeUtf8(cps);
}

namespace {

using StrMethodFn = absl::StatusOr<Value> (*)(Interpreter& interp, const std::string& s,
                                              absl::string_view name, CallArgs args);

absl::StatusOr<Value> StripMethod(Interpreter&, const std::string& s, absl::string_view name,
                                  CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a, BindArgs(name, std::move(args), {"chars"}));
  SPECD_ASSIGN_OR_RETURN(std::optional<std::string> chars, OptionalString(name, a[0]));
  return Value::String(PyStrip(s, chars, name != "rstrip", name != "lstrip"));
}

absl::StatusOr<Value> SplitMethod(Interpreter& interp, const std::string& s, absl::string_view name,
                                  CallArgs args) {
  if (name == "splitlines") {
    SPECD_ASSIGN_OR_RETURN(std::vector<Value> a, BindArgs(name, std::move(args), {"keepends"}));
    return StringList(PySplitLines(s, Truthy(a[0])));
  }
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a,
                         BindArgs(name, std::move(args), {"sep", "maxsplit"}));
  SPECD_ASSIGN_OR_RETURN(std::optional<std::string> sep, OptionalString(name, a[0]));
  if (sep && sep->empty()) return absl::InvalidArgumentError("empty separator");
  int64_t maxsplit = -1;
  if (!a[1].is_undefined()) {
    SPECD_ASSIGN_OR_RETURN(maxsplit, IntArg(name, a[1]));
  }
  SPECD_RETURN_IF_ERROR(interp.Step(static_cast<int64_t>(s.size() / 64)));
  return StringList(PySplit(s, sep, maxsplit, name == "rsplit"));
}

absl::StatusOr<Value> AffixMethod(Interpreter&, const std::string& s, absl::string_view name,
                                  CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a, BindArgs(name, std::move(args), {"affix"}));
  const bool prefix = name == "startswith" || name == "removeprefix";
  SPECD_ASSIGN_OR_RETURN(bool match, AffixMatch(s, a[0], prefix));
  if (name == "startswith" || name == "endswith") return Value::Bool(match);
  if (!match) return Value::String(s);
  const size_t n = a[0].str().size();
  return Value::String(prefix ? s.substr(n) : s.substr(0, s.size() - n));
}

absl::StatusOr<Value> ReplaceMethod(Interpreter& interp, const std::string& s,
                                    absl::string_view name, CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a,
                         BindArgs(name, std::move(args), {"old", "new", "count"}));
  SPECD_ASSIGN_OR_RETURN(std::string old, StringArg(name, a[0]));
  SPECD_ASSIGN_OR_RETURN(std::string replacement, StringArg(name, a[1]));
  int64_t count = -1;
  if (!a[2].is_undefined()) {
    SPECD_ASSIGN_OR_RETURN(count, IntArg(name, a[2]));
  }
  SPECD_RETURN_IF_ERROR(CheckReplaceSize(interp, s, old, replacement));
  return Value::String(PyReplace(s, old, replacement, count));
}

absl::StatusOr<Value> SearchMethod(Interpreter&, const std::string& s, absl::string_view name,
                                   CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a, BindArgs(name, std::move(args), {"sub"}));
  SPECD_ASSIGN_OR_RETURN(std::string sub, StringArg(name, a[0]));
  if (name == "count") return Value::Int(CountOccurrences(s, sub));
  const size_t at = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
  if (at != std::string::npos) return Value::Int(CodePointIndex(s, at));
  if (name == "index" || name == "rindex") {
    return absl::InvalidArgumentError("substring not found");
  }
  return Value::Int(-1);
}

absl::StatusOr<Value> JoinMethod(Interpreter& interp, const std::string& s, absl::string_view name,
                                 CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a, BindArgs(name, std::move(args), {"iterable"}));
  SPECD_ASSIGN_OR_RETURN(ValueList items, interp.Iterate(a[0]));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += s;
    SPECD_ASSIGN_OR_RETURN(std::string item, StringArg("join", items[i]));
    out += item;
    SPECD_RETURN_IF_ERROR(interp.CheckSize(out.size()));
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> ZfillMethod(Interpreter& interp, const std::string& s, absl::string_view name,
                                  CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a, BindArgs(name, std::move(args), {"width"}));
  SPECD_ASSIGN_OR_RETURN(int64_t width, IntArg(name, a[0]));
  const auto len = static_cast<int64_t>(CodePointCount(s));
  if (width <= len) return Value::String(s);
  SPECD_RETURN_IF_ERROR(interp.CheckSize(static_cast<size_t>(width)));
  const size_t sign = (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
  return Value::String(
      absl::StrCat(s.substr(0, sign), std::string(width - len, '0'), s.substr(sign)));
}

absl::StatusOr<Value> FormatMethod(Interpreter& interp, const std::string& s, absl::string_view,
                                   CallArgs args) {
  return PyFormat(interp, s, args);
}

absl::StatusOr<Value> CaseMethod(Interpreter&, const std::string& s, absl::string_view name,
                                 CallArgs args) {
  SPECD_RETURN_IF_ERROR(BindArgs(name, std::move(args), {}).status());
  if (name == "upper") return Value::String(PyUpper(s));
  if (name == "lower") return Value::String(PyLower(s));
  if (name == "title") return Value::String(PyTitle(s));
  if (name == "capitalize") return Value::String(PyCapitalize(s));
  if (name == "swapcase") {
    std::u32string cps = DecodeUtf8(s);
    for (char32_t& cp : cps) cp = ToUpperCp(cp) == cp ? ToLowerCp(cp) : ToUpperCp(cp);
    return Value::String(EncodeUtf8(cps));
  }
  return Predicate(s, name);
}

StrMethodFn FindStrMethod(absl::string_view name) {
  static const auto* const kMethods = new absl::flat_hash_map<absl::string_view, StrMethodFn>{
      {"strip", &StripMethod},        {"lstrip", &StripMethod},    {"rstrip", &StripMethod},
      {"split", &SplitMethod},        {"rsplit", &SplitMethod},    {"splitlines", &SplitMethod},
      {"startswith", &AffixMethod},   {"endswith", &AffixMethod},  {"removeprefix", &AffixMethod},
      {"removesuffix", &AffixMethod}, {"replace", &ReplaceMethod}, {"find", &SearchMethod},
      {"rfind", &SearchMethod},       {"index", &SearchMethod},    {"rindex", &SearchMethod},
      {"count", &SearchMethod},       {"join", &JoinMethod},       {"zfill", &ZfillMethod},
      {"format", &FormatMethod},      {"upper", &CaseMethod},      {"lower", &CaseMethod},
      {"title", &CaseMethod},         {"capitalize", &CaseMethod}, {"swapcase", &CaseMethod},
      {"isdigit", &CaseMethod},       {"isnumeric", &CaseMethod},  {"isdecimal", &CaseMethod},
      {"isalpha", &CaseMethod},       {"isalnum", &CaseMethod},    {"isspace", &CaseMethod},
      {"istitle", &CaseMethod},       {"isupper", &CaseMethod},    {"islower", &CaseMethod},
  };
  auto it = kMethods->find(name);
  return it == kMethods->end() ? nullptr : it->second;
}

}  // namespace

bool IsStrMethod(absl::string_view name) { return FindStrMethod(name) != nullptr; }

absl::StatusOr<Value> CallStrMethod(Interpreter& interp, const std::string& s,
                                    absl::string_view name, CallArgs args) {
  const StrMethodFn fn = FindStrMethod(name);
  if (fn == nullptr) return TypeError(absl::StrCat("'str' object has no method '", name, "'"));
  return fn(interp, s, name, std::move(args));
}

}  // namespace specd::jinja
