// Exception-free typed field access for nlohmann::json objects parsed from model files
// (config.json, safetensors headers, shard indexes). Every error names the file and the
// field. Pure functions; any thread.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specd {

// Debian's Abseil has its own string_view type; this bridges std::string_view into
// absl::StrCat and heterogeneous absl hash-map lookups.
inline absl::string_view AbslView(std::string_view s) { return {s.data(), s.size()}; }

// Parses text without throwing; InvalidArgument naming `file` on malformed JSON or when
// the top level is not an object.
absl::StatusOr<nlohmann::json> ParseJsonObject(std::string_view text, std::string_view file);

// A view of one JSON object that reads typed fields. `path` prefixes field names in
// errors (e.g. "rope_parameters.").
class JsonFields {
 public:
  JsonFields(const nlohmann::json& object, std::string_view file, std::string path = "")
      : object_(object), file_(file), path_(std::move(path)) {}

  // Absent and null fields read as nullopt; a present field of the wrong type is an error.
  absl::StatusOr<std::optional<int64_t>> OptionalInt(std::string_view key) const;
  absl::StatusOr<std::optional<double>> OptionalDouble(std::string_view key) const;
  absl::StatusOr<std::optional<bool>> OptionalBool(std::string_view key) const;
  absl::StatusOr<std::optional<std::string>> OptionalString(std::string_view key) const;
  // An int or a list of ints (eos_token_id); absent/null gives nullopt.
  absl::StatusOr<std::optional<std::vector<int64_t>>> OptionalIntList(std::string_view key) const;

  // Required fields: absent or null is an error.
  absl::StatusOr<int64_t> Int(std::string_view key) const;
  absl::StatusOr<double> Double(std::string_view key) const;

  // The object at key, or nullptr when absent/null; error when present but not an object.
  absl::StatusOr<const nlohmann::json*> OptionalObject(std::string_view key) const;

  // InvalidArgument "<file>: field '<path><key>': <what>".
  absl::Status Error(std::string_view key, std::string_view what) const;

 private:
  const nlohmann::json* Find(std::string_view key) const;

  const nlohmann::json& object_;
  std::string_view file_;
  std::string path_;
};

// An integral JSON number (int, or a float with an integral value) as int64.
std::optional<int64_t> JsonToInt(const nlohmann::json& value);

}  // namespace specd
