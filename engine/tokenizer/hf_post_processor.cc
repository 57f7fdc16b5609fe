#include "engine/tokenizer/hf_post_processor.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/base/status.h"

namespace specd::tok {
namespace {

absl::StatusOr<std::vector<int32_t>> SpecialTokenIds(const Json& json, const std::string& name) {
  const Json* specials = JsonFind(json, "special_tokens");
  const Json* entry = specials == nullptr ? nullptr : JsonFind(*specials, name);
  if (entry == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("template token '", name, "' not defined"));
  }
  const Json* ids = JsonFind(*entry, "ids");
  if (ids == nullptr || !ids->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat("template token '", name, "' has no ids"));
  }
  std::vector<int32_t> out;
  for (const Json& id : *ids) {
    if (!id.is_number_integer()) return absl::InvalidArgumentError("template ids must be ints");
    out.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return out;
}

// One template item: a special token name, or a sequence marker ("A", "B", ...).
struct TemplateItem {
  std::string name;
  bool is_sequence = false;
};

absl::StatusOr<TemplateItem> ParseItem(const Json& item) {
  if (item.is_string()) {  // string form "$A:0" / "<s>:0"
    std::string s = item.get<std::string>();
    s = std::string(s.substr(0, s.find(':')));
    if (!s.empty() && s[0] == '$') return TemplateItem{s.substr(1), true};
    return TemplateItem{s, false};
  }
  if (const Json* seq = JsonFind(item, "Sequence")) {
    SPECD_ASSIGN_OR_RETURN(std::string id, JsonString(*seq, "id"));
    return TemplateItem{id, true};
  }
  if (const Json* sp = JsonFind(item, "SpecialToken")) {
    SPECD_ASSIGN_OR_RETURN(std::string id, JsonString(*sp, "id"));
    return TemplateItem{id, false};
  }
  return absl::InvalidArgumentError("template item must be Sequence or SpecialToken");
}

absl::Status ParseTemplate(const Json& json, std::vector<int32_t>* prefix,
                           std::vector<int32_t>* suffix) {
  const Json* single = JsonFind(json, "single");
  if (single == nullptr) return absl::InvalidArgumentError("TemplateProcessing needs 'single'");
  std::vector<Json> items;
  if (single->is_string()) {
    for (absl::string_view part :
         absl::StrSplit(single->get<std::string>(), ' ', absl::SkipEmpty())) {
      items.push_back(std::string(part));
    }
  } else if (single->is_array()) {
    items.assign(single->begin(), single->end());
  } else {
    return absl::InvalidArgumentError("'single' must be a list or a string");
  }
  bool seen_sequence = false;
  for (const Json& item : items) {
    SPECD_ASSIGN_OR_RETURN(TemplateItem t, ParseItem(item));
    if (t.is_sequence) {
      seen_sequence = true;
      continue;
    }
    SPECD_ASSIGN_OR_RETURN(std::vector<int32_t> ids, SpecialTokenIds(json, t.name));
    std::vector<int32_t>* dst = seen_sequence ? suffix : prefix;
    dst->insert(dst->end(), ids.begin(), ids.end());
  }
  return absl::OkStatus();
}

// RobertaProcessing / BertProcessing: {"cls": [text, id], "sep": [text, id]}.
absl::Status ParseClsSep(const Json& json, std::vector<int32_t>* prefix,
                         std::vector<int32_t>* suffix) {
  for (const char* key : {"cls", "sep"}) {
    const Json* pair = JsonFind(json, key);
    if (pair == nullptr || !pair->is_array() || pair->size() != 2 ||
        !(*pair)[1].is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat("'", key, "' must be [token, id]"));
    }
    const auto id = static_cast<int32_t>((*pair)[1].get<int64_t>());
    (std::string(key) == "cls" ? prefix : suffix)->push_back(id);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParsePostProcessor(const Json& json, std::vector<int32_t>* prefix,
                                std::vector<int32_t>* suffix) {
  SPECD_ASSIGN_OR_RETURN(std::string type, JsonString(json, "type"));
  if (type == "ByteLevel") return absl::OkStatus();  // offsets only; no ids
  if (type == "TemplateProcessing") return ParseTemplate(json, prefix, suffix);
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    return ParseClsSep(json, prefix, suffix);
  }
  if (type == "Sequence") {
    const Json* list = JsonFind(json, "processors");
    if (list == nullptr || !list->is_array()) {
      return absl::InvalidArgumentError("Sequence post-processor needs 'processors'");
    }
    for (const Json& item : *list) {
      // Each processor wraps the previous result: outer prefixes go first.
      std::vector<int32_t> p, s;
      SPECD_RETURN_IF_ERROR(ParsePostProcessor(item, &p, &s));
      prefix->insert(prefix->begin(), p.begin(), p.end());
      suffix->insert(suffix->end(), s.begin(), s.end());
    }
    return absl::OkStatus();
  }
  return absl::UnimplementedError(absl::StrCat("unsupported post-processor '", type, "'"));
}

}  // namespace specd::tok
