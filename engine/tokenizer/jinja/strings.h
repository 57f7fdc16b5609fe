// Python str operations for the chat-template interpreter, shared by str methods
// (`s.strip()`, `s.split(',')`, `'{}'.format(x)`) and filters (trim, title, replace).
// Code-point based, with Python's definitions of whitespace and line breaks. Any thread.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/tokenizer/jinja/value.h"

namespace specd::jinja {

class Interpreter;

// str.strip / lstrip / rstrip; `chars` unset means whitespace.
std::string PyStrip(absl::string_view s, const std::optional<std::string>& chars, bool left,
                    bool right);
// str.split / rsplit; `sep` unset splits on whitespace runs. maxsplit < 0: no limit.
std::vector<std::string> PySplit(absl::string_view s, const std::optional<std::string>& sep,
                                 int64_t maxsplit, bool from_right);
std::vector<std::string> PySplitLines(absl::string_view s, bool keepends);
// str.replace; count < 0: all.
std::string PyReplace(absl::string_view s, absl::string_view old, absl::string_view replacement,
                      int64_t count);
// str.title (Python) and the title filter (Jinja: words start after space, -, (, {, [, <).
std::string PyTitle(absl::string_view s);
std::string JinjaTitle(absl::string_view s);
std::string PyCapitalize(absl::string_view s);

// True when `name` is a supported str method.
bool IsStrMethod(absl::string_view name);
// Calls the str method `name` on `s`.
absl::StatusOr<Value> CallStrMethod(Interpreter& interp, const std::string& s,
                                    absl::string_view name, CallArgs args);

}  // namespace specd::jinja
