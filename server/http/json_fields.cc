#include "server/http/json_fields.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "engine/base/json_fields.h"
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

// The API's error for an integer field the shared reader (engine/base/json_fields.h) refused.
absl::Status IntError(JsonFieldError e, const std::string& key, int64_t min, int64_t max) {
  switch (e) {
    case JsonFieldError::kNone:
      return absl::OkStatus();
    case JsonFieldError::kWrongType:
      return WrongType(key, "an integer");
    case JsonFieldError::kOutOfRange:
      return OutOfRange(key, min, max);
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> AsInt(const Json& v, const std::string& key, int64_t min, int64_t max) {
  int64_t i = 0;
  if (const JsonFieldError e = JsonToInt(v, min, max, &i); e != JsonFieldError::kNone) {
    return IntError(e, key, min, max);
  }
  return i;
}

// nlohmann's SAX events -> a Json value, refusing depth and key counts past the limits as
// they arrive. Objects find duplicate keys through a hash index once they outgrow a short
// linear scan, so a body with many keys costs linear time. Pointers into parents stay
// valid: a parent gets no new member while its child is open.
class BoundedJsonBuilder {
 public:
  using number_integer_t = Json::number_integer_t;
  using number_unsigned_t = Json::number_unsigned_t;
  using number_float_t = Json::number_float_t;
  using string_t = Json::string_t;
  using binary_t = Json::binary_t;

  bool null() { return Add(Json(nullptr)) != nullptr; }
  bool boolean(bool b) { return Add(Json(b)) != nullptr; }
  bool number_integer(number_integer_t v) { return Add(Json(v)) != nullptr; }
  bool number_unsigned(number_unsigned_t v) { return Add(Json(v)) != nullptr; }
  bool number_float(number_float_t v, const string_t& /*text*/) { return Add(Json(v)) != nullptr; }
  bool string(string_t& s) { return Add(Json(std::move(s))) != nullptr; }
  bool binary(binary_t& /*b*/) { return false; }  // JSON text has none
  bool start_object(std::size_t /*size*/) { return Open(Json::object()); }
  bool start_array(std::size_t /*size*/) { return Open(Json::array()); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }
  bool key(string_t& k) {
    Frame& f = stack_.back();
    if (++f.num_keys > kMaxJsonObjectKeys) {
      return Fail(
          absl::StrCat("request JSON has an object with more than ", kMaxJsonObjectKeys, " keys"));
    }
    f.key = std::move(k);
    return true;
  }
  bool parse_error(std::size_t /*pos*/, const std::string& /*token*/,
                   const nlohmann::detail::exception& /*e*/) {
    return Fail("request body is not valid JSON (or has invalid UTF-8)");
  }

  absl::Status status() const { return status_; }
  Json Take() { return std::move(root_); }

 private:
  // Objects up to this many keys find duplicates by scanning; larger ones get an index.
  static constexpr size_t kLinearKeys = 16;
  using Members = Json::object_t::Container;  // ordered_map's vector of (key, value)

  struct Frame {
    Json* value = nullptr;
    int num_keys = 0;
    std::string key;                                 // objects: the member being read
    absl::flat_hash_map<std::string, size_t> index;  // key -> member; empty while small
  };

  bool Fail(absl::string_view message) {
    if (status_.ok()) status_ = InvalidParam("", message);
    return false;
  }

  bool Open(Json container) {
    if (stack_.size() >= static_cast<size_t>(kMaxJsonDepth)) {
      return Fail(absl::StrCat("request JSON is nested deeper than ", kMaxJsonDepth, " levels"));
    }
    Json* value = Add(std::move(container));
    stack_.emplace_back();
    stack_.back().value = value;
    return true;
  }

  bool Close() {
    stack_.pop_back();
    return true;
  }

  Json* Add(Json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Frame& f = stack_.back();
    if (f.value->is_array()) {
      Json::array_t& items = f.value->get_ref<Json::array_t&>();
      items.push_back(std::move(v));
      return &items.back();
    }
    Members& members = f.value->get_ref<Json::object_t&>();
    if (std::optional<size_t> i = FindMember(f, members)) {
      members[*i].second = std::move(v);
      return &members[*i].second;
    }
    if (!f.index.empty() || members.size() >= kLinearKeys) {
      if (f.index.empty()) {
        for (size_t i = 0; i < members.size(); ++i) f.index.emplace(members[i].first, i);
      }
      f.index.emplace(f.key, members.size());
    }
    members.emplace_back(std::move(f.key), std::move(v));
    return &members.back().second;
  }

  static std::optional<size_t> FindMember(const Frame& f, const Members& members) {
    if (!f.index.empty()) {
      auto it = f.index.find(f.key);
      if (it == f.index.end()) return std::nullopt;
      return it->second;
    }
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i].first == f.key) return i;
    }
    return std::nullopt;
  }

  Json root_;
  std::vector<Frame> stack_;  // open containers, outermost first; at most kMaxJsonDepth
  absl::Status status_;
};

}  // namespace

absl::StatusOr<Json> ParseJsonObject(std::string_view body) {
  BoundedJsonBuilder builder;
  if (!Json::sax_parse(body.begin(), body.end(), &builder)) {
    absl::Status s = builder.status();
    if (s.ok()) s = InvalidParam("", "request body is not valid JSON");
    return s;
  }
  Json j = builder.Take();
  if (!j.is_object()) return SchemaError("", "request body must be a JSON object");
  return j;
}

const Json* FindField(const Json& object, const std::string& key) {
  return FindJsonField(object, key);
}

absl::Status ReadBool(const Json& object, const std::string& key, bool* out) {
  if (ReadJsonBool(object, key, out) != JsonFieldError::kNone) return WrongType(key, "a boolean");
  return absl::OkStatus();
}

absl::Status ReadString(const Json& object, const std::string& key, std::string* out) {
  if (ReadJsonString(object, key, out) != JsonFieldError::kNone) return WrongType(key, "a string");
  return absl::OkStatus();
}

absl::Status ReadInt(const Json& object, const std::string& key, int64_t min, int64_t max,
                     int64_t* out) {
  return IntError(ReadJsonInt(object, key, min, max, out), key, min, max);
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
  double d = *out;
  switch (ReadJsonNumber(object, key, min, max, &d)) {
    case JsonFieldError::kNone:
      break;
    case JsonFieldError::kWrongType:
      return WrongType(key, "a number");
    case JsonFieldError::kOutOfRange:
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
