// Python semantics of the chat-template operators: arithmetic (+ - * / // % **) with
// int overflow checks, `in`, and slicing of lists and strings (by code point). Any
// thread.
#pragma once

#include "absl/status/statusor.h"
#include "engine/tokenizer/jinja/ast.h"
#include "engine/tokenizer/jinja/value.h"

namespace specd::jinja {

// a <op> b. `max_bytes` bounds strings and lists built by + and *.
absl::StatusOr<Value> ApplyBinary(BinaryOp op, const Value& a, const Value& b, size_t max_bytes);
// -v / +v.
absl::StatusOr<Value> ApplyUnary(UnaryOp op, const Value& v);
// item in container.
absl::StatusOr<bool> Contains(const Value& container, const Value& item);
// obj[start:stop:step]; None/Undefined bounds are omitted ones.
absl::StatusOr<Value> SliceValue(const Value& obj, const Value& start, const Value& stop,
                                 const Value& step);
// The error for using an Undefined where a value is needed ("'x' is undefined").
absl::Status UndefinedError(const Value& v);

}  // namespace specd::jinja
