// tojson serialization and JSON -> Value conversion (see json_bridge.h).
#include "engine/tokenizer/jinja/json_bridge.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/tokenizer/jinja/utf8.h"

namespace specd::jinja {
namespace {

void AppendHexEscape(char32_t unit, std::string* out) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(unit));
  out->append(buf);
}

void AppendJsonString(absl::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (char32_t cp : DecodeUtf8(s)) {
    switch (cp) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      default:
        if (cp < 0x20) {
          AppendHexEscape(cp, out);
        } else if (ensure_ascii && cp >= 0x7F) {
          if (cp >= 0x10000) {
            const char32_t v = cp - 0x10000;
            AppendHexEscape(0xD800 + (v >> 10), out);
            AppendHexEscape(0xDC00 + (v & 0x3FF), out);
          } else {
            AppendHexEscape(cp, out);
          }
        } else {
          AppendUtf8(cp, out);
        }
    }
  }
  out->push_back('"');
}

void AppendJsonFloat(double d, std::string* out) {
  if (std::isnan(d)) {
    out->append("NaN");
  } else if (std::isinf(d)) {
    out->append(d < 0 ? "-Infinity" : "Infinity");
  } else {
    out->append(FormatPyFloat(d));
  }
}

class JsonWriter {
 public:
  explicit JsonWriter(const JsonDumpOptions& options) : options_(options) {
    item_separator_ = options.item_separator.value_or(options.indent ? "," : ", ");
  }

  absl::Status Write(const Value& v, int level, std::string* out) const {
    switch (v.kind()) {
      case Value::Kind::kNone:
        out->append("null");
        return absl::OkStatus();
      case Value::Kind::kBool:
        out->append(v.bool_value() ? "true" : "false");
        return absl::OkStatus();
      case Value::Kind::kInt:
        absl::StrAppend(out, v.int_value());
        return absl::OkStatus();
      case Value::Kind::kFloat:
        AppendJsonFloat(v.float_value(), out);
        return absl::OkStatus();
      case Value::Kind::kString:
        AppendJsonString(v.str(), options_.ensure_ascii, out);
        return absl::OkStatus();
      case Value::Kind::kList:
      case Value::Kind::kTuple:
        if (v.is_generator()) break;
        return WriteList(v.list(), level, out);
      case Value::Kind::kDict:
        return WriteDict(v.dict(), level, out);
      default:
        break;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("Object of type ", TypeName(v), " is not JSON serializable"));
  }

  absl::Status TooLong() const {
    return absl::InvalidArgumentError(
        absl::StrCat("tojson output exceeds the limit of ", options_.max_bytes, " bytes"));
  }

 private:
  void NewLine(int level, std::string* out) const {
    out->push_back('\n');
    for (int i = 0; i < level; ++i) out->append(*options_.indent);
  }

  absl::Status WriteList(const ValueList& items, int level, std::string* out) const {
    if (items.empty()) {
      out->append("[]");
      return absl::OkStatus();
    }
    out->push_back('[');
    for (size_t i = 0; i < items.size(); ++i) {
      if (out->size() > options_.max_bytes) return TooLong();
      if (i > 0) out->append(item_separator_);
      if (options_.indent) NewLine(level + 1, out);
      absl::Status status = Write(items[i], level + 1, out);
      if (!status.ok()) return status;
    }
    if (options_.indent) NewLine(level, out);
    out->push_back(']');
    return absl::OkStatus();
  }

  absl::Status WriteDict(const ValueDict& dict, int level, std::string* out) const {
    if (dict.empty()) {
      out->append("{}");
      return absl::OkStatus();
    }
    std::vector<const std::pair<std::string, Value>*> entries;
    for (const auto& entry : dict.entries()) entries.push_back(&entry);
    if (options_.sort_keys) {
      std::stable_sort(entries.begin(), entries.end(),
                       [](const auto* a, const auto* b) { return a->first < b->first; });
    }
    out->push_back('{');
    for (size_t i = 0; i < entries.size(); ++i) {
      if (out->size() > options_.max_bytes) return TooLong();
      if (i > 0) out->append(item_separator_);
      if (options_.indent) NewLine(level + 1, out);
      AppendJsonString(entries[i]->first, options_.ensure_ascii, out);
      out->append(options_.key_separator);
      absl::Status status = Write(entries[i]->second, level + 1, out);
      if (!status.ok()) return status;
    }
    if (options_.indent) NewLine(level, out);
    out->push_back('}');
    return absl::OkStatus();
  }

  const JsonDumpOptions& options_;
  std::string item_separator_;
};

template <typename Json>
absl::StatusOr<Value> Convert(const Json& json, int depth) {
  if (depth > kMaxValueDepth) {
    return absl::InvalidArgumentError("chat template context is nested too deeply");
  }
  switch (json.type()) {
    case Json::value_t::null:
      return Value::None();
    case Json::value_t::boolean:
      return Value::Bool(json.template get<bool>());
    case Json::value_t::number_integer:
      return Value::Int(json.template get<int64_t>());
    case Json::value_t::number_unsigned: {
      const uint64_t u = json.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::Float(static_cast<double>(u));
      return Value::Int(static_cast<int64_t>(u));
    }
    case Json::value_t::number_float:
      return Value::Float(json.template get<double>());
    case Json::value_t::string:
      return Value::String(json.template get<std::string>());
    case Json::value_t::array: {
      ValueList items;
      items.reserve(json.size());
      for (const auto& item : json) {
        absl::StatusOr<Value> v = Convert(item, depth + 1);
        if (!v.ok()) return v.status();
        items.push_back(*std::move(v));
      }
      return Value::List(std::move(items));
    }
    case Json::value_t::object: {
      ValueDict dict;
      for (auto it = json.begin(); it != json.end(); ++it) {
        absl::StatusOr<Value> v = Convert(it.value(), depth + 1);
        if (!v.ok()) return v.status();
        dict.Set(it.key(), *std::move(v));
      }
      return Value::Dict(std::move(dict));
    }
    default:
      return absl::InvalidArgumentError("chat template context holds a non-JSON value");
  }
}

}  // namespace

absl::StatusOr<std::string> DumpJson(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  absl::Status status = JsonWriter(options).Write(v, 0, &out);
  if (!status.ok()) return status;
  if (out.size() > options.max_bytes) return JsonWriter(options).TooLong();
  return out;
}

absl::StatusOr<Value> ValueFromJson(const nlohmann::json& json) { return Convert(json, 0); }

absl::StatusOr<Value> ValueFromJson(const nlohmann::ordered_json& json) { return Convert(json, 0); }

}  // namespace specd::jinja
