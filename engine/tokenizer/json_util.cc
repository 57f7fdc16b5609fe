#include "engine/tokenizer/json_util.h"

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/string_view_compat.h"

namespace specd::tok {

absl::StatusOr<Json> ParseJson(std::string_view text, std::string_view what) {
  Json j = Json::parse(text.begin(), text.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat(AsAbsl(what), ": invalid JSON"));
  return j;
}

const Json* JsonFind(const Json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<std::string> JsonString(const Json& obj, std::string_view key) {
  const Json* v = JsonFind(obj, key);
  if (v == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("missing field '", AsAbsl(key), "'"));
  if (!v->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("field '", AsAbsl(key), "' must be a string"));
  }
  return v->get_ref<const std::string&>();
}

absl::StatusOr<int64_t> JsonInt(const Json& obj, std::string_view key) {
  const Json* v = JsonFind(obj, key);
  if (v == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("missing field '", AsAbsl(key), "'"));
  if (!v->is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat("field '", AsAbsl(key), "' must be an integer"));
  }
  return v->get<int64_t>();
}

absl::StatusOr<std::string> JsonStringOr(const Json& obj, std::string_view key,
                                         std::string fallback) {
  if (JsonFind(obj, key) == nullptr) return fallback;
  return JsonString(obj, key);
}

absl::StatusOr<bool> JsonBoolOr(const Json& obj, std::string_view key, bool fallback) {
  const Json* v = JsonFind(obj, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) {
    return absl::InvalidArgumentError(absl::StrCat("field '", AsAbsl(key), "' must be a boolean"));
  }
  return v->get<bool>();
}

absl::StatusOr<int64_t> JsonIntOr(const Json& obj, std::string_view key, int64_t fallback) {
  if (JsonFind(obj, key) == nullptr) return fallback;
  return JsonInt(obj, key);
}

absl::Status JsonPattern(const Json& obj, std::string* pattern, bool* is_regex) {
  const Json* p = JsonFind(obj, "pattern");
  if (p == nullptr || !p->is_object()) {
    return absl::InvalidArgumentError("field 'pattern' must be an object");
  }
  if (const Json* s = JsonFind(*p, "String"); s != nullptr && s->is_string()) {
    *pattern = s->get<std::string>();
    *is_regex = false;
    return absl::OkStatus();
  }
  if (const Json* r = JsonFind(*p, "Regex"); r != nullptr && r->is_string()) {
    *pattern = r->get<std::string>();
    *is_regex = true;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError("'pattern' needs a String or Regex member");
}

}  // namespace specd::tok
