// Internal to the filter implementation: sequence filters defined in filters_seq.cc and
// registered by filters.cc, plus helpers they share. Any thread.
#pragma once

#include "absl/status/statusor.h"
#include "engine/tokenizer/jinja/value.h"

namespace specd::jinja {

class Interpreter;

// item[attribute] for Jinja's attribute= arguments ("a.b", "0" indexes).
absl::StatusOr<Value> GetAttribute(Interpreter& interp, const Value& item, const Value& attribute);

absl::StatusOr<Value> FilterLength(Interpreter& interp, const Value& input, CallArgs args);
absl::StatusOr<Value> FilterList(Interpreter& interp, const Value& input, CallArgs args);
absl::StatusOr<Value> FilterFirst(Interpreter& interp, const Value& input, CallArgs args);
absl::StatusOr<Value> FilterLast(Interpreter& interp, const Value& input, CallArgs args);
absl::StatusOr<Value> FilterItems(Interpreter& interp, const Value& input, CallArgs args);
absl::StatusOr<Value> FilterJoin(Interpreter& interp, const Value& input, CallArgs args);
absl::StatusOr<Value> FilterMap(Interpreter& interp, const Value& input, CallArgs args);
absl::StatusOr<Value> FilterSelect(Interpreter& interp, const Value& input, CallArgs args);
absl::StatusOr<Value> FilterReject(Interpreter& interp, const Value& input, CallArgs args);
absl::StatusOr<Value> FilterSelectAttr(Interpreter& interp, const Value& input, CallArgs args);
absl::StatusOr<Value> FilterRejectAttr(Interpreter& interp, const Value& input, CallArgs args);
absl::StatusOr<Value> FilterSort(Interpreter& interp, const Value& input, CallArgs args);
absl::StatusOr<Value> FilterDictSort(Interpreter& interp, const Value& input, CallArgs args);
absl::StatusOr<Value> FilterUnique(Interpreter& interp, const Value& input, CallArgs args);
absl::StatusOr<Value> FilterMin(Interpreter& interp, const Value& input, CallArgs args);
absl::StatusOr<Value> FilterMax(Interpreter& interp, const Value& input, CallArgs args);
absl::StatusOr<Value> FilterSum(Interpreter& interp, const Value& input, CallArgs args);
absl::StatusOr<Value> FilterReverse(Interpreter& interp, const Value& input, CallArgs args);

}  // namespace specd::jinja
