#include "engine/tokenizer/normalizer.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/regex.h"
#include "engine/tokenizer/unicode_norm.h"
#include "engine/tokenizer/utf8.h"

namespace specd::tok {
namespace {

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  absl::Status Normalize(std::string* text) const override {
    for (const auto& p : parts_) SPECD_RETURN_IF_ERROR(p->Normalize(text));
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  absl::Status Normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prefix_);  // HF leaves empty strings alone
    return absl::OkStatus();
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::string literal, std::unique_ptr<Regex> regex, std::string content)
      : literal_(std::move(literal)), regex_(std::move(regex)), content_(std::move(content)) {}
  absl::Status Normalize(std::string* text) const override {
    if (regex_ == nullptr) {
      if (!literal_.empty()) absl::StrReplaceAll({{literal_, content_}}, text);
      return absl::OkStatus();
    }
    std::vector<Regex::Match> matches;
    SPECD_RETURN_IF_ERROR(regex_->FindAll(*text, &matches));
    if (matches.empty()) return absl::OkStatus();
    std::string out;
    size_t prev = 0;
    for (const auto& [begin, end] : matches) {
      out.append(*text, prev, begin - prev);
      out.append(content_);
      prev = end;
    }
    out.append(*text, prev);
    *text = std::move(out);
    return absl::OkStatus();
  }

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;  // null for a literal pattern
  std::string content_;
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  absl::Status Normalize(std::string* text) const override {
    size_t begin = 0;
    size_t end = text->size();
    if (left_) {
      while (begin < end) {
        const Utf8Step s = DecodeUtf8(*text, begin);
        if (!IsUnicodeWhitespace(s.code_point)) break;
        begin += s.len;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<uint8_t>((*text)[start]) & 0xC0) == 0x80) --start;
        if (!IsUnicodeWhitespace(DecodeUtf8(*text, start).code_point)) break;
        end = start;
      }
    }
    *text = text->substr(begin, end - begin);
    return absl::OkStatus();
  }

 private:
  bool left_, right_;
};

class UnicodeFormNormalizer : public Normalizer {
 public:
  explicit UnicodeFormNormalizer(UnicodeForm form) : form_(form) {}
  absl::Status Normalize(std::string* text) const override {
    // Without ICU the form is skipped (warned at load): exact for text already in the form,
    // which is nearly all real input for NFC.
    if (!HaveUnicodeNormalization()) return absl::OkStatus();
    return NormalizeUnicode(form_, text);
  }

 private:
  UnicodeForm form_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  absl::Status Normalize(std::string* text) const override { return LowercaseUnicode(text); }
};

class ByteLevelNormalizer : public Normalizer {
 public:
  absl::Status Normalize(std::string* text) const override {
    std::string out;
    AppendByteLevel(*text, &out);
    *text = std::move(out);
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<Normalizer>> MakeReplace(const Json& json) {
  std::string pattern;
  bool is_regex = false;
  SPECD_RETURN_IF_ERROR(JsonPattern(json, &pattern, &is_regex));
  SPECD_ASSIGN_OR_RETURN(std::string content, JsonString(json, "content"));
  std::unique_ptr<Regex> regex;
  if (is_regex) {
    SPECD_ASSIGN_OR_RETURN(regex, Regex::Compile(pattern));
  }
  return std::make_unique<ReplaceNormalizer>(std::move(pattern), std::move(regex),
                                             std::move(content));
}

absl::StatusOr<std::unique_ptr<Normalizer>> MakeUnicodeForm(UnicodeForm form,
                                                            const std::string& type) {
  if (!HaveUnicodeNormalization()) {
    SPECD_LOG_WARN("tokenizer normalizer {} needs ICU, which this build lacks; skipping it", type);
  }
  return std::make_unique<UnicodeFormNormalizer>(form);
}

absl::StatusOr<std::unique_ptr<Normalizer>> MakeSequence(const Json& json) {
  const Json* list = JsonFind(json, "normalizers");
  if (list == nullptr || !list->is_array()) {
    return absl::InvalidArgumentError("Sequence normalizer needs a 'normalizers' array");
  }
  std::vector<std::unique_ptr<Normalizer>> parts;
  for (const Json& item : *list) {
    SPECD_ASSIGN_OR_RETURN(auto part, NormalizerFromJson(item));
    parts.push_back(std::move(part));
  }
  return std::make_unique<SequenceNormalizer>(std::move(parts));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> NormalizerFromJson(const Json& json) {
  SPECD_ASSIGN_OR_RETURN(std::string type, JsonString(json, "type"));
  if (type == "Sequence") return MakeSequence(json);
  if (type == "Prepend") {
    SPECD_ASSIGN_OR_RETURN(std::string prefix, JsonString(json, "prepend"));
    return std::make_unique<PrependNormalizer>(std::move(prefix));
  }
  if (type == "Replace") return MakeReplace(json);
  if (type == "Strip") {
    SPECD_ASSIGN_OR_RETURN(bool left, JsonBoolOr(json, "strip_left", true));
    SPECD_ASSIGN_OR_RETURN(bool right, JsonBoolOr(json, "strip_right", true));
    return std::make_unique<StripNormalizer>(left, right);
  }
  if (type == "NFC") return MakeUnicodeForm(UnicodeForm::kNfc, type);
  if (type == "NFD") return MakeUnicodeForm(UnicodeForm::kNfd, type);
  if (type == "NFKC") return MakeUnicodeForm(UnicodeForm::kNfkc, type);
  if (type == "NFKD") return MakeUnicodeForm(UnicodeForm::kNfkd, type);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "ByteLevel") return std::make_unique<ByteLevelNormalizer>();
  return absl::UnimplementedError(absl::StrCat("unsupported normalizer type '", type, "'"));
}

std::unique_ptr<Normalizer> MakeSpmNormalizer(bool add_space_prefix) {
  std::vector<std::unique_ptr<Normalizer>> parts;
  if (add_space_prefix)
    parts.push_back(std::make_unique<PrependNormalizer>(std::string(kMetaspace)));
  parts.push_back(std::make_unique<ReplaceNormalizer>(" ", nullptr, std::string(kMetaspace)));
  return std::make_unique<SequenceNormalizer>(std::move(parts));
}

}  // namespace specd::tok
