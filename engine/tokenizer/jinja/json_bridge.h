// Conversion between nlohmann JSON and template values, and the `tojson` serializer with
// the semantics of Python's json.dumps(ensure_ascii=False) that transformers installs as
// the chat-template `tojson` filter (", " and ": " separators, "," with an indent). Any
// thread.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/tokenizer/jinja/value.h"
#include "nlohmann/json.hpp"

namespace specd::jinja {

// Containers nested deeper than this are rejected (keeps printing and comparison
// recursions shallow).
inline constexpr int kMaxValueDepth = 256;

struct JsonDumpOptions {
  // None: one line. Otherwise each item goes on its own line, indented by this string.
  std::optional<std::string> indent;
  // Defaults as Python: ", " without an indent, "," with one.
  std::optional<std::string> item_separator;
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
  // Longer output is an error (containers may share storage, so their JSON can be far
  // larger than their memory).
  size_t max_bytes = size_t{64} << 20;
};

// json.dumps(v); an error for values JSON cannot hold (Undefined, namespaces, macros).
absl::StatusOr<std::string> DumpJson(const Value& v, const JsonDumpOptions& options);

// Request JSON to a template value; object key order is kept as the JSON type keeps it
// (nlohmann::ordered_json keeps insertion order, nlohmann::json sorts).
absl::StatusOr<Value> ValueFromJson(const nlohmann::json& json);
absl::StatusOr<Value> ValueFromJson(const nlohmann::ordered_json& json);

}  // namespace specd::jinja
