#include "engine/model/json_fields.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace specd {

absl::StatusOr<nlohmann::json> ParseJsonObject(std::string_view text, std::string_view file) {
  nlohmann::json value = nlohmann::json::parse(text.begin(), text.end(), /*cb=*/nullptr,
                                               /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(AbslView(file), ": malformed JSON"));
  }
  if (!value.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(AbslView(file), ": top level is not a JSON object"));
  }
  return value;
}

std::optional<int64_t> JsonToInt(const nlohmann::json& value) {
  if (value.is_number_integer()) {
    if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return std::nullopt;
    }
    return value.get<int64_t>();
  }
  if (value.is_number_float()) {
    const double d = value.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
      return static_cast<int64_t>(d);
    }
  }
  return std::nullopt;
}

namespace {

// What a value is, for error messages. dump() is used only for numbers and booleans,
// which cannot make it throw.
std::string Describe(const nlohmann::json& v) {
  if (v.is_number() || v.is_boolean()) return v.dump();
  return v.type_name();
}

}  // namespace

absl::Status JsonFields::Error(std::string_view key, std::string_view what) const {
  return absl::InvalidArgumentError(
      absl::StrCat(AbslView(file_), ": field '", path_, AbslView(key), "': ", AbslView(what)));
}

const nlohmann::json* JsonFields::Find(std::string_view key) const {
  auto it = object_.find(std::string(key));
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<std::optional<int64_t>> JsonFields::OptionalInt(std::string_view key) const {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return std::optional<int64_t>();
  std::optional<int64_t> i = JsonToInt(*v);
  if (!i.has_value()) return Error(key, absl::StrCat("expected an integer, got ", Describe(*v)));
  return i;
}

absl::StatusOr<std::optional<double>> JsonFields::OptionalDouble(std::string_view key) const {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return std::optional<double>();
  if (!v->is_number()) return Error(key, absl::StrCat("expected a number, got ", Describe(*v)));
  const double d = v->get<double>();
  if (!std::isfinite(d)) return Error(key, "not finite");
  return std::optional<double>(d);
}

absl::StatusOr<std::optional<bool>> JsonFields::OptionalBool(std::string_view key) const {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return std::optional<bool>();
  if (!v->is_boolean()) return Error(key, absl::StrCat("expected a boolean, got ", Describe(*v)));
  return std::optional<bool>(v->get<bool>());
}

absl::StatusOr<std::optional<std::string>> JsonFields::OptionalString(std::string_view key) const {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string()) return Error(key, absl::StrCat("expected a string, got ", Describe(*v)));
  return std::optional<std::string>(v->get<std::string>());
}

absl::StatusOr<std::optional<std::vector<int64_t>>> JsonFields::OptionalIntList(
    std::string_view key) const {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return std::optional<std::vector<int64_t>>();
  std::vector<int64_t> out;
  if (std::optional<int64_t> one = JsonToInt(*v); one.has_value()) {
    out.push_back(*one);
    return std::optional<std::vector<int64_t>>(std::move(out));
  }
  if (!v->is_array()) return Error(key, "expected an integer or a list of integers");
  for (const nlohmann::json& item : *v) {
    std::optional<int64_t> i = JsonToInt(item);
    if (!i.has_value()) return Error(key, "expected a list of integers");
    out.push_back(*i);
  }
  return std::optional<std::vector<int64_t>>(std::move(out));
}

absl::StatusOr<int64_t> JsonFields::Int(std::string_view key) const {
  absl::StatusOr<std::optional<int64_t>> v = OptionalInt(key);
  if (!v.ok()) return v.status();
  if (!v->has_value()) return Error(key, "missing");
  return **v;
}

absl::StatusOr<double> JsonFields::Double(std::string_view key) const {
  absl::StatusOr<std::optional<double>> v = OptionalDouble(key);
  if (!v.ok()) return v.status();
  if (!v->has_value()) return Error(key, "missing");
  return **v;
}

absl::StatusOr<const nlohmann::json*> JsonFields::OptionalObject(std::string_view key) const {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return v;
  if (!v->is_object()) return Error(key, absl::StrCat("expected an object, got ", Describe(*v)));
  return v;
}

}  // namespace specd
