// Reads the key/value metadata of a GGUF file (versions 1-3) with a bounds check on every
// read, so a truncated or corrupt file is an error, never an out-of-bounds access. Only
// the metadata section is parsed (tensor infos and data are never touched), which is all
// a tokenizer needs. Arrays of strings/ints/floats are kept; nested arrays are skipped.
// The result is immutable; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace specd::tok {

// One metadata value. Integers of every width widen to int64 (uint64 values above
// INT64_MAX keep their bits), floats to double, bools to int64 in arrays.
using GgufValue = std::variant<std::monostate,  // skipped (nested array)
                               int64_t, double, bool, std::string, std::vector<int64_t>,
                               std::vector<double>, std::vector<std::string>>;

class GgufMetadata {
 public:
  static absl::StatusOr<GgufMetadata> Parse(std::span<const uint8_t> bytes);
  static absl::StatusOr<GgufMetadata> ReadFile(const std::string& path);

  uint32_t version() const { return version_; }
  const GgufValue* Find(std::string_view key) const;

  // Typed getters: nullopt if absent; InvalidArgument if present with another type.
  absl::StatusOr<std::optional<std::string>> GetString(std::string_view key) const;
  absl::StatusOr<std::optional<int64_t>> GetInt(std::string_view key) const;
  absl::StatusOr<std::optional<bool>> GetBool(std::string_view key) const;
  const std::vector<std::string>* GetStringArray(std::string_view key) const;
  const std::vector<int64_t>* GetIntArray(std::string_view key) const;
  const std::vector<double>* GetFloatArray(std::string_view key) const;

 private:
  uint32_t version_ = 0;
  absl::flat_hash_map<std::string, GgufValue> values_;
};

}  // namespace specd::tok
