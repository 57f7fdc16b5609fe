// Typed reads of one optional field of a JSON object, shared by the `--speculative-config` reader
// (engine/speculation/spec_config_json.cc) and the HTTP front end's request fields
// (server/http/json_fields.h). A field that is absent or null leaves the output alone (the
// caller's default); otherwise the reader says what was wrong and each caller words its own
// error (InvalidArgument naming the config field; the API's 422 / 400). Templates over the JSON
// type (nlohmann::json, nlohmann::ordered_json), so base/ itself needs no JSON library. Pure;
// any thread.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

namespace specd {

enum class JsonFieldError {
  kNone,        // read, or absent / null (output untouched)
  kWrongType,   // not the JSON type asked for
  kOutOfRange,  // the right type, outside [lo, hi]
};

// The field, or nullptr when absent or null.
template <typename Json>
const Json* FindJsonField(const Json& object, const std::string& key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

// An integer value (1.0 is not one) within [lo, hi] into *out (untouched unless kNone).
template <typename Json>
JsonFieldError JsonToInt(const Json& v, int64_t lo, int64_t hi, int64_t* out) {
  if (!v.is_number_integer()) return JsonFieldError::kWrongType;
  int64_t i = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.template get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return JsonFieldError::kOutOfRange;
    i = static_cast<int64_t>(u);
  } else {
    i = v.template get<int64_t>();
  }
  if (i < lo || i > hi) return JsonFieldError::kOutOfRange;
  *out = i;
  return JsonFieldError::kNone;
}

template <typename Json>
JsonFieldError ReadJsonInt(const Json& object, const std::string& key, int64_t lo, int64_t hi,
                           int64_t* out) {
  const Json* v = FindJsonField(object, key);
  return v == nullptr ? JsonFieldError::kNone : JsonToInt(*v, lo, hi, out);
}

// Any finite number within [lo, hi].
template <typename Json>
JsonFieldError ReadJsonNumber(const Json& object, const std::string& key, double lo, double hi,
                              double* out) {
  const Json* v = FindJsonField(object, key);
  if (v == nullptr) return JsonFieldError::kNone;
  if (!v->is_number()) return JsonFieldError::kWrongType;
  const double d = v->template get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) return JsonFieldError::kOutOfRange;
  *out = d;
  return JsonFieldError::kNone;
}

template <typename Json>
JsonFieldError ReadJsonString(const Json& object, const std::string& key, std::string* out) {
  const Json* v = FindJsonField(object, key);
  if (v == nullptr) return JsonFieldError::kNone;
  if (!v->is_string()) return JsonFieldError::kWrongType;
  *out = v->template get<std::string>();
  return JsonFieldError::kNone;
}

template <typename Json>
JsonFieldError ReadJsonBool(const Json& object, const std::string& key, bool* out) {
  const Json* v = FindJsonField(object, key);
  if (v == nullptr) return JsonFieldError::kNone;
  if (!v->is_boolean()) return JsonFieldError::kWrongType;
  *out = v->template get<bool>();
  return JsonFieldError::kNone;
}

}  // namespace specd
