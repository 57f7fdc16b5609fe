// Exception-free accessors over nlohmann::json for the tokenizer loaders: every lookup
// checks the type and returns a Status naming the offending field, so a malformed
// tokenizer.json is an error, never a throw. Any thread.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace specd::tok {

using Json = nlohmann::json;

// Parses `text`; a syntax error becomes InvalidArgument mentioning `what`.
absl::StatusOr<Json> ParseJson(std::string_view text, std::string_view what);

// Required members.
absl::StatusOr<std::string> JsonString(const Json& obj, std::string_view key);
absl::StatusOr<int64_t> JsonInt(const Json& obj, std::string_view key);

// Optional members: absent or null gives `fallback`; a wrong type is an error.
absl::StatusOr<std::string> JsonStringOr(const Json& obj, std::string_view key,
                                         std::string fallback);
absl::StatusOr<bool> JsonBoolOr(const Json& obj, std::string_view key, bool fallback);
absl::StatusOr<int64_t> JsonIntOr(const Json& obj, std::string_view key, int64_t fallback);

// The member if present and not null, else nullptr.
const Json* JsonFind(const Json& obj, std::string_view key);

// Reads an HF "pattern" object: {"String": s} or {"Regex": r}. `is_regex` says which.
absl::Status JsonPattern(const Json& obj, std::string* pattern, bool* is_regex);

}  // namespace specd::tok
