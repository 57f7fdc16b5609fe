#include "server/http/json_fields.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "server/http/errors.h"

namespace specd::http {
namespace {

absl::Status WrongType(const std::string& key, absl::string_view expected) {
  return SchemaError(key, absl::StrCat("'", key, "' must be ", expected));
}

absl::Status OutOfRange(const std::string& key, int64_t min, int64_t max) {
  return InvalidParam(key,
                      absl::StrCat("'", key, "' must be an integer in [", min, ", ", max, "]"));
}

absl::StatusOr<int64_t> AsInt(const Json& v, const std::string& key, int64_t min, int64_t max) {
  if (!v.is_number_integer()) return WrongType(key, "an integer");
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(max)) return OutOfRange(key, min, max);
    if (static_cast<int64_t>(u) < min) return OutOfRange(key, min, max);
    return static_cast<int64_t>(u);
  }
  const int64_t i = v.get<int64_t>();
  if (i < min || i > max) return OutOfRange(key, min, max);
  return i;
}

}  // namespace

absl::StatusOr<Json> ParseJsonObject(std::string_view body) {
  Json j = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return InvalidParam("", "request body is not valid JSON (or has invalid UTF-8)");
  }
  if (!j.is_object()) return SchemaError("", "request body must be a JSON object");
  return j;
}

const Json* FindField(const Json& object, const std::string& key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status ReadBool(const Json& object, const std::string& key, bool* out) {
  const Json* v = FindField(object, key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_boolean()) return WrongType(key, "a boolean");
  *out = v->get<bool>();
  return absl::OkStatus();
}

absl::Status ReadString(const Json& object, const std::string& key, std::string* out) {
  const Json* v = FindField(object, key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_string()) return WrongType(key, "a string");
  *out = v->get<std::string>();
  return absl::OkStatus();
}

absl::Status ReadInt(const Json& object, const std::string& key, int64_t min, int64_t max,
                     int64_t* out) {
  const Json* v = FindField(object, key);
  if (v == nullptr) return absl::OkStatus();
  absl::StatusOr<int64_t> i = AsInt(*v, key, min, max);
  if (!i.ok()) return i.status();
  *out = *i;
  return absl::OkStatus();
}

absl::Status ReadInt32(const Json& object, const std::string& key, int32_t min, int32_t max,
                       int32_t* out) {
  int64_t value = *out;
  absl::Status s = ReadInt(object, key, min, max, &value);
  *out = static_cast<int32_t>(value);
  return s;
}

absl::Status ReadFloat(const Json& object, const std::string& key, double min, double max,
                       float* out) {
  const Json* v = FindField(object, key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number()) return WrongType(key, "a number");
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < min || d > max) {
    return InvalidParam(key, absl::StrCat("'", key, "' must be in [", min, ", ", max, "]"));
  }
  *out = static_cast<float>(d);
  return absl::OkStatus();
}

absl::Status ReadStringOrList(const Json& object, const std::string& key,
                              std::vector<std::string>* out) {
  const Json* v = FindField(object, key);
  if (v == nullptr) return absl::OkStatus();
  out->clear();
  if (v->is_string()) {
    out->push_back(v->get<std::string>());
    return absl::OkStatus();
  }
  if (!v->is_array()) return WrongType(key, "a string or an array of strings");
  for (const Json& item : *v) {
    if (!item.is_string()) return WrongType(key, "a string or an array of strings");
    out->push_back(item.get<std::string>());
  }
  return absl::OkStatus();
}

absl::Status ReadIntList(const Json& object, const std::string& key, int64_t min, int64_t max,
                         std::vector<int32_t>* out) {
  const Json* v = FindField(object, key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_array()) return WrongType(key, "an array of integers");
  out->clear();
  for (const Json& item : *v) {
    absl::StatusOr<int64_t> i = AsInt(item, key, min, max);
    if (!i.ok()) return i.status();
    out->push_back(static_cast<int32_t>(*i));
  }
  return absl::OkStatus();
}

}  // namespace specd::http
