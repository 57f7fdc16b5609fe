// Typed, range-checked reads of optional fields of a JSON request object. A missing or
// null field leaves the output untouched (the caller's default); a field of the wrong JSON
// type is a SchemaError (422) and a value out of range an InvalidParam (400), both naming
// the field. Pure; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace specd::http {

using Json = nlohmann::ordered_json;

// Request bodies nested deeper than this (objects and arrays), or holding an object with
// more keys than this, are refused while parsing (400), before any deep value exists: every
// later recursion over request JSON (copies, dumps, the chat template's conversion) is then
// at most this deep, and no object insertion scans more than this many keys.
inline constexpr int kMaxJsonDepth = 64;
inline constexpr int kMaxJsonObjectKeys = 1024;

// Parses a request body that must be one JSON object, in time linear in its size
// (nlohmann's own ordered_json parser scans every object's keys on each insertion).
// Invalid JSON (including invalid UTF-8 in strings) or a limit above exceeded -> 400.
// Duplicate keys keep the first key's place and the last value, as nlohmann does.
absl::StatusOr<Json> ParseJsonObject(std::string_view body);

// The field or nullptr when absent or null.
const Json* FindField(const Json& object, const std::string& key);

absl::Status ReadBool(const Json& object, const std::string& key, bool* out);
absl::Status ReadString(const Json& object, const std::string& key, std::string* out);
// Integers only (1.0 is not an integer), within [min, max].
absl::Status ReadInt(const Json& object, const std::string& key, int64_t min, int64_t max,
                     int64_t* out);
absl::Status ReadInt32(const Json& object, const std::string& key, int32_t min, int32_t max,
                       int32_t* out);
// Any finite number within [min, max].
absl::Status ReadFloat(const Json& object, const std::string& key, double min, double max,
                       float* out);
// A string or an array of strings (OpenAI's `stop`).
absl::Status ReadStringOrList(const Json& object, const std::string& key,
                              std::vector<std::string>* out);
// An array of integers within [min, max].
absl::Status ReadIntList(const Json& object, const std::string& key, int64_t min, int64_t max,
                         std::vector<int32_t>* out);

}  // namespace specd::http
