// Sequence filters of the chat-template interpreter: length, list, first/last, items,
// join, map, select/reject(attr), sort, dictsort, unique, min/max, sum, reverse (see
// filters_internal.h). Semantics follow jinja2 3.1.
#include <algorithm>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "engine/base/status.h"
#include "engine/tokenizer/jinja/filters_internal.h"
#include "engine/tokenizer/jinja/interpreter.h"
#include "engine/tokenizer/jinja/library.h"
#include "engine/tokenizer/jinja/operators.h"
#include "engine/tokenizer/jinja/utf8.h"

namespace specd::jinja {
namespace {

// Sort key: the attribute when given, lower-cased when comparing case-insensitively.
absl::StatusOr<Value> SortKey(Interpreter& interp, const Value& item, const Value& attribute,
                              bool case_sensitive) {
  Value key = item;
  if (!attribute.is_undefined() && !attribute.is_none()) {
    SPECD_ASSIGN_OR_RETURN(key, GetAttribute(interp, item, attribute));
  }
  if (!case_sensitive && key.is_string()) return Value::String(PyLower(key.str()));
  return key;
}

// Stable sort of `items` by `keys`; the first comparison error wins.
absl::Status SortByKeys(ValueList* items, const ValueList& keys, bool reverse) {
  std::vector<size_t> order(items->size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  absl::Status error;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (!error.ok()) return false;
    absl::StatusOr<int> c = PyCompare(keys[reverse ? b : a], keys[reverse ? a : b]);
    if (!c.ok()) {
      error = c.status();
      return false;
    }
    return *c == -1;
  });
  SPECD_RETURN_IF_ERROR(error);
  ValueList sorted;
  sorted.reserve(items->size());
  for (size_t i : order) sorted.push_back((*items)[i]);
  *items = std::move(sorted);
  return absl::OkStatus();
}

// select / reject / selectattr / rejectattr.
absl::StatusOr<Value> SelectOrReject(Interpreter& interp, const Value& input, CallArgs args,
                                     bool select, bool by_attribute) {
  SPECD_ASSIGN_OR_RETURN(ValueList items, interp.Iterate(input));
  Value attribute;
  if (by_attribute) {
    if (args.positional.empty()) return TypeError("selectattr/rejectattr need an attribute");
    attribute = args.positional[0];
    args.positional.erase(args.positional.begin());
  }
  std::string test_name;
  if (!args.positional.empty()) {
    SPECD_ASSIGN_OR_RETURN(test_name, StringArg("select", args.positional[0]));
    args.positional.erase(args.positional.begin());
  }
  ValueList kept;
  for (const Value& item : items) {
    SPECD_RETURN_IF_ERROR(interp.Step());
    Value subject = item;
    if (by_attribute) {
      SPECD_ASSIGN_OR_RETURN(subject, GetAttribute(interp, item, attribute));
    }
    bool passed = false;
    if (test_name.empty()) {
      passed = Truthy(subject);
    } else {
      SPECD_ASSIGN_OR_RETURN(passed, interp.ApplyTest(test_name, subject, args));
    }
    if (passed == select) kept.push_back(item);
  }
  return Value::Generator(std::move(kept));
}

absl::StatusOr<Value> MinOrMax(Interpreter& interp, const Value& input, CallArgs args,
                               bool want_max) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a, BindArgs(want_max ? "max" : "min", std::move(args),
                                                        {"case_sensitive", "attribute"}));
  SPECD_ASSIGN_OR_RETURN(ValueList items, interp.Iterate(input));
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  SPECD_ASSIGN_OR_RETURN(Value best_key, SortKey(interp, items[0], a[1], Truthy(a[0])));
  for (size_t i = 1; i < items.size(); ++i) {
    SPECD_ASSIGN_OR_RETURN(Value key, SortKey(interp, items[i], a[1], Truthy(a[0])));
    SPECD_ASSIGN_OR_RETURN(int c, PyCompare(key, best_key));
    if (c == (want_max ? 1 : -1)) {
      best = i;
      best_key = std::move(key);
    }
  }
  return items[best];
}

}  // namespace

absl::StatusOr<Value> GetAttribute(Interpreter& interp, const Value& item, const Value& attribute) {
  if (attribute.is_int()) return interp.GetItem(item, attribute);
  SPECD_ASSIGN_OR_RETURN(std::string path, StringArg("attribute", attribute));
  Value value = item;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    int64_t index = 0;
    const Value key =
        absl::SimpleAtoi(part, &index) ? Value::Int(index) : Value::String(std::string(part));
    SPECD_ASSIGN_OR_RETURN(value, interp.GetItem(value, key));
  }
  return value;
}

absl::StatusOr<Value> FilterLength(Interpreter&, const Value& input, CallArgs args) {
  SPECD_RETURN_IF_ERROR(BindArgs("length", std::move(args), {}).status());
  switch (input.kind()) {
    case Value::Kind::kUndefined:
      return Value::Int(0);
    case Value::Kind::kString:
      return Value::Int(static_cast<int64_t>(CodePointCount(input.str())));
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      if (input.is_generator()) break;
      return Value::Int(static_cast<int64_t>(input.list().size()));
    case Value::Kind::kDict:
      return Value::Int(static_cast<int64_t>(input.dict().size()));
    default:
      break;
  }
  return TypeError(absl::StrCat("object of type '", TypeName(input), "' has no len()"));
}

absl::StatusOr<Value> FilterList(Interpreter& interp, const Value& input, CallArgs args) {
  SPECD_RETURN_IF_ERROR(BindArgs("list", std::move(args), {}).status());
  SPECD_ASSIGN_OR_RETURN(ValueList items, interp.Iterate(input));
  return Value::List(std::move(items));
}

absl::StatusOr<Value> FilterFirst(Interpreter& interp, const Value& input, CallArgs args) {
  SPECD_RETURN_IF_ERROR(BindArgs("first", std::move(args), {}).status());
  SPECD_ASSIGN_OR_RETURN(ValueList items, interp.Iterate(input));
  if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
  return items.front();
}

absl::StatusOr<Value> FilterLast(Interpreter& interp, const Value& input, CallArgs args) {
  SPECD_RETURN_IF_ERROR(BindArgs("last", std::move(args), {}).status());
  if (input.is_generator()) return TypeError("'generator' object is not reversible");
  SPECD_ASSIGN_OR_RETURN(ValueList items, interp.Iterate(input));
  if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
  return items.back();
}

absl::StatusOr<Value> FilterItems(Interpreter&, const Value& input, CallArgs args) {
  SPECD_RETURN_IF_ERROR(BindArgs("items", std::move(args), {}).status());
  if (input.is_undefined()) return Value::Generator({});
  if (!input.is_dict()) return TypeError("Can only get item pairs from a mapping.");
  ValueList pairs;
  for (const auto& [key, value] : input.dict().entries()) {
    pairs.push_back(Value::Tuple({Value::String(key), value}));
  }
  return Value::Generator(std::move(pairs));
}

absl::StatusOr<Value> FilterJoin(Interpreter& interp, const Value& input, CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a,
                         BindArgs("join", std::move(args), {"d", "attribute"}));
  SPECD_ASSIGN_OR_RETURN(ValueList items, interp.Iterate(input));
  const std::string separator = a[0].is_undefined() ? "" : PyStr(a[0]);
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += separator;
    Value item = items[i];
    if (!a[1].is_undefined() && !a[1].is_none()) {
      SPECD_ASSIGN_OR_RETURN(item, GetAttribute(interp, item, a[1]));
    }
    AppendPyStr(item, &out, interp.max_output_bytes());
    SPECD_RETURN_IF_ERROR(interp.CheckSize(out.size()));
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FilterMap(Interpreter& interp, const Value& input, CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(ValueList items, interp.Iterate(input));
  ValueList out;
  out.reserve(items.size());
  if (args.positional.empty()) {
    SPECD_ASSIGN_OR_RETURN(std::vector<Value> a,
                           BindArgs("map", std::move(args), {"attribute", "default"}));
    if (a[0].is_undefined()) return TypeError("map() needs a filter name or attribute=");
    for (const Value& item : items) {
      SPECD_ASSIGN_OR_RETURN(Value v, GetAttribute(interp, item, a[0]));
      out.push_back(v.is_undefined() && !a[1].is_undefined() ? a[1] : v);
    }
    return Value::Generator(std::move(out));
  }
  SPECD_ASSIGN_OR_RETURN(std::string filter, StringArg("map", args.positional[0]));
  args.positional.erase(args.positional.begin());
  for (const Value& item : items) {
    SPECD_RETURN_IF_ERROR(interp.Step());
    SPECD_ASSIGN_OR_RETURN(Value v, interp.ApplyFilter(filter, item, args));
    out.push_back(std::move(v));
  }
  return Value::Generator(std::move(out));
}

absl::StatusOr<Value> FilterSelect(Interpreter& interp, const Value& input, CallArgs args) {
  return SelectOrReject(interp, input, std::move(args), /*select=*/true, /*by_attribute=*/false);
}
absl::StatusOr<Value> FilterReject(Interpreter& interp, const Value& input, CallArgs args) {
  return SelectOrReject(interp, input, std::move(args), /*select=*/false, /*by_attribute=*/false);
}
absl::StatusOr<Value> FilterSelectAttr(Interpreter& interp, const Value& input, CallArgs args) {
  return SelectOrReject(interp, input, std::move(args), /*select=*/true, /*by_attribute=*/true);
}
absl::StatusOr<Value> FilterRejectAttr(Interpreter& interp, const Value& input, CallArgs args) {
  return SelectOrReject(interp, input, std::move(args), /*select=*/false, /*by_attribute=*/true);
}

absl::StatusOr<Value> FilterSort(Interpreter& interp, const Value& input, CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(
      std::vector<Value> a,
      BindArgs("sort", std::move(args), {"reverse", "case_sensitive", "attribute"}));
  SPECD_ASSIGN_OR_RETURN(ValueList items, interp.Iterate(input));
  SPECD_RETURN_IF_ERROR(interp.Step(static_cast<int64_t>(items.size())));
  ValueList keys;
  for (const Value& item : items) {
    SPECD_ASSIGN_OR_RETURN(Value key, SortKey(interp, item, a[2], Truthy(a[1])));
    keys.push_back(std::move(key));
  }
  SPECD_RETURN_IF_ERROR(SortByKeys(&items, keys, Truthy(a[0])));
  return Value::List(std::move(items));
}

absl::StatusOr<Value> FilterDictSort(Interpreter& interp, const Value& input, CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a, BindArgs("dictsort", std::move(args),
                                                        {"case_sensitive", "by", "reverse"}));
  if (!input.is_dict()) return TypeError("dictsort(): expected a mapping");
  const std::string by = a[1].is_undefined() ? "key" : PyStr(a[1]);
  if (by != "key" && by != "value") {
    return absl::InvalidArgumentError("You can only sort by either \"key\" or \"value\"");
  }
  SPECD_ASSIGN_OR_RETURN(Value pairs, FilterItems(interp, input, CallArgs()));
  ValueList items = pairs.list();
  ValueList keys;
  for (const Value& pair : items) {
    const Value& key = pair.list()[by == "key" ? 0 : 1];
    SPECD_ASSIGN_OR_RETURN(Value sort_key, SortKey(interp, key, Value(), Truthy(a[0])));
    keys.push_back(std::move(sort_key));
  }
  SPECD_RETURN_IF_ERROR(SortByKeys(&items, keys, Truthy(a[2])));
  return Value::List(std::move(items));
}

absl::StatusOr<Value> FilterUnique(Interpreter& interp, const Value& input, CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a,
                         BindArgs("unique", std::move(args), {"case_sensitive", "attribute"}));
  SPECD_ASSIGN_OR_RETURN(ValueList items, interp.Iterate(input));
  absl::flat_hash_set<std::string> seen;
  ValueList out;
  for (const Value& item : items) {
    SPECD_ASSIGN_OR_RETURN(Value key, SortKey(interp, item, a[1], Truthy(a[0])));
    std::string repr;
    AppendPyRepr(key, &repr, interp.max_output_bytes());
    SPECD_RETURN_IF_ERROR(interp.Step(1 + static_cast<int64_t>(repr.size() / 64)));
    if (seen.insert(std::move(repr)).second) out.push_back(item);
  }
  return Value::Generator(std::move(out));
}

absl::StatusOr<Value> FilterMin(Interpreter& interp, const Value& input, CallArgs args) {
  return MinOrMax(interp, input, std::move(args), /*want_max=*/false);
}
absl::StatusOr<Value> FilterMax(Interpreter& interp, const Value& input, CallArgs args) {
  return MinOrMax(interp, input, std::move(args), /*want_max=*/true);
}

absl::StatusOr<Value> FilterSum(Interpreter& interp, const Value& input, CallArgs args) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Value> a,
                         BindArgs("sum", std::move(args), {"attribute", "start"}));
  SPECD_ASSIGN_OR_RETURN(ValueList items, interp.Iterate(input));
  Value total = a[1].is_undefined() ? Value::Int(0) : a[1];
  for (const Value& item : items) {
    Value term = item;
    if (!a[0].is_undefined() && !a[0].is_none()) {
      SPECD_ASSIGN_OR_RETURN(term, GetAttribute(interp, item, a[0]));
    }
    SPECD_RETURN_IF_ERROR(interp.Step());
    SPECD_ASSIGN_OR_RETURN(total,
                           ApplyBinary(BinaryOp::kAdd, total, term, interp.max_output_bytes()));
  }
  return total;
}

absl::StatusOr<Value> FilterReverse(Interpreter& interp, const Value& input, CallArgs args) {
  SPECD_RETURN_IF_ERROR(BindArgs("reverse", std::move(args), {}).status());
  if (input.is_string()) {
    std::u32string cps = DecodeUtf8(input.str());
    std::reverse(cps.begin(), cps.end());
    return Value::String(EncodeUtf8(cps));
  }
  if (input.is_generator()) return TypeError("'generator' object is not reversible");
  SPECD_ASSIGN_OR_RETURN(ValueList items, interp.Iterate(input));
  std::reverse(items.begin(), items.end());
  return Value::Generator(std::move(items));
}

}  // namespace specd::jinja
