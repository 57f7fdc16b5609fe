#include "engine/tokenizer/pre_tokenizer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/base/status.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/regex.h"

namespace specd::tok {
namespace {

constexpr std::string_view kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Span {
  size_t begin, end;
  bool is_match;
};

absl::StatusOr<Behavior> ParseBehavior(const std::string& name) {
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  return absl::InvalidArgumentError(absl::StrCat("unknown split behavior '", name, "'"));
}

// Covers [0, size) with the matches and the gaps between them.
std::vector<Span> ToSpans(const std::vector<Regex::Match>& matches, size_t size, bool invert) {
  std::vector<Span> spans;
  size_t prev = 0;
  for (const auto& [begin, end] : matches) {
    if (begin > prev) spans.push_back({prev, begin, invert});
    spans.push_back({begin, end, !invert});
    prev = end;
  }
  if (prev < size) spans.push_back({prev, size, invert});
  return spans;
}

// HF's SplitDelimiterBehavior, as in tokenizers' NormalizedString::split.
std::vector<Span> ApplyBehavior(std::vector<Span> spans, Behavior behavior) {
  std::vector<Span> out;
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kIsolated:
      return spans;
    case Behavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.is_match) out.push_back(s);
      }
      return out;
    case Behavior::kMergedWithPrevious:
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      return out;
    case Behavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().begin = it->begin;
        } else {
          out.push_back(*it);
        }
        previous_match = it->is_match;
      }
      return {out.rbegin(), out.rend()};
    case Behavior::kContiguous:
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      return out;
  }
  return spans;
}

// Splits every piece at the matches of `regex` (each match one span).
absl::Status SplitPieces(const Regex& regex, Behavior behavior, bool invert,
                         std::vector<PreToken>* pieces) {
  std::vector<PreToken> out;
  out.reserve(pieces->size());
  std::vector<Regex::Match> matches;
  for (PreToken& piece : *pieces) {
    matches.clear();
    SPECD_RETURN_IF_ERROR(regex.FindAll(piece.text, &matches));
    for (const Span& s : ApplyBehavior(ToSpans(matches, piece.text.size(), invert), behavior)) {
      if (s.end == s.begin) continue;
      out.push_back({piece.text.substr(s.begin, s.end - s.begin), piece.at_start && s.begin == 0});
    }
  }
  *pieces = std::move(out);
  return absl::OkStatus();
}

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    for (const auto& p : parts_) SPECD_RETURN_IF_ERROR(p->PreTokenize(pieces));
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

// Split / Digits / Punctuation / Whitespace: a regex and a behavior.
class RegexSplitPreTokenizer : public PreTokenizer {
 public:
  RegexSplitPreTokenizer(std::unique_ptr<Regex> regex, Behavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}
  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    return SplitPieces(*regex_, behavior_, invert_, pieces);
  }

 private:
  std::unique_ptr<Regex> regex_;
  Behavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Regex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    if (add_prefix_space_) {
      for (PreToken& p : *pieces) {
        if (p.text.empty() || p.text[0] != ' ') p.text.insert(0, " ");
      }
    }
    if (regex_ != nullptr) {
      SPECD_RETURN_IF_ERROR(SplitPieces(*regex_, Behavior::kIsolated, false, pieces));
    }
    for (PreToken& p : *pieces) {
      std::string mapped;
      AppendByteLevel(p.text, &mapped);
      p.text = std::move(mapped);
    }
    return absl::OkStatus();
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;  // null when use_regex is false
};

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  enum class Prepend { kAlways, kFirst, kNever };
  MetaspacePreTokenizer(std::string replacement, Prepend prepend, std::unique_ptr<Regex> split)
      : replacement_(std::move(replacement)), prepend_(prepend), split_(std::move(split)) {}
  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    for (PreToken& p : *pieces) {
      std::string out;
      for (char c : p.text) {
        if (c == ' ') {
          out.append(replacement_);
        } else {
          out.push_back(c);
        }
      }
      const bool starts = out.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts &&
          (prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && p.at_start))) {
        out.insert(0, replacement_);
      }
      p.text = std::move(out);
    }
    if (split_ == nullptr) return absl::OkStatus();
    return SplitPieces(*split_, Behavior::kMergedWithNext, false, pieces);
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  std::unique_ptr<Regex> split_;  // one match per replacement char; null when split is false
};

absl::StatusOr<std::unique_ptr<PreTokenizer>> MakeSplit(const Json& json) {
  std::string pattern;
  bool is_regex = false;
  SPECD_RETURN_IF_ERROR(JsonPattern(json, &pattern, &is_regex));
  SPECD_ASSIGN_OR_RETURN(std::string behavior_name, JsonString(json, "behavior"));
  SPECD_ASSIGN_OR_RETURN(Behavior behavior, ParseBehavior(behavior_name));
  SPECD_ASSIGN_OR_RETURN(bool invert, JsonBoolOr(json, "invert", false));
  SPECD_ASSIGN_OR_RETURN(auto regex, Regex::Compile(is_regex ? pattern : RegexQuote(pattern)));
  return std::make_unique<RegexSplitPreTokenizer>(std::move(regex), behavior, invert);
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> MakeByteLevel(const Json& json) {
  SPECD_ASSIGN_OR_RETURN(bool add_prefix_space, JsonBoolOr(json, "add_prefix_space", true));
  SPECD_ASSIGN_OR_RETURN(bool use_regex, JsonBoolOr(json, "use_regex", true));
  std::unique_ptr<Regex> regex;
  if (use_regex) {
    SPECD_ASSIGN_OR_RETURN(regex, Regex::Compile(kGpt2Pattern));
  }
  return std::make_unique<ByteLevelPreTokenizer>(add_prefix_space, std::move(regex));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> MakeMetaspace(const Json& json) {
  SPECD_ASSIGN_OR_RETURN(std::string replacement, JsonStringOr(json, "replacement", "\u2581"));
  SPECD_ASSIGN_OR_RETURN(bool add_prefix_space, JsonBoolOr(json, "add_prefix_space", true));
  SPECD_ASSIGN_OR_RETURN(std::string scheme, JsonStringOr(json, "prepend_scheme",
                                                          add_prefix_space ? "always" : "never"));
  SPECD_ASSIGN_OR_RETURN(bool split, JsonBoolOr(json, "split", true));
  MetaspacePreTokenizer::Prepend prepend;
  if (scheme == "always") {
    prepend = MetaspacePreTokenizer::Prepend::kAlways;
  } else if (scheme == "first") {
    prepend = MetaspacePreTokenizer::Prepend::kFirst;
  } else if (scheme == "never") {
    prepend = MetaspacePreTokenizer::Prepend::kNever;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown prepend_scheme '", scheme, "'"));
  }
  std::unique_ptr<Regex> split_regex;
  if (split) {
    SPECD_ASSIGN_OR_RETURN(split_regex, Regex::Compile(RegexQuote(replacement)));
  }
  return std::make_unique<MetaspacePreTokenizer>(std::move(replacement), prepend,
                                                 std::move(split_regex));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> MakeRegexSplit(std::string_view pattern,
                                                             Behavior behavior, bool invert) {
  SPECD_ASSIGN_OR_RETURN(auto regex, Regex::Compile(pattern));
  return std::make_unique<RegexSplitPreTokenizer>(std::move(regex), behavior, invert);
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> MakeSequence(const Json& json) {
  const Json* list = JsonFind(json, "pretokenizers");
  if (list == nullptr || !list->is_array()) {
    return absl::InvalidArgumentError("Sequence pre-tokenizer needs a 'pretokenizers' array");
  }
  std::vector<std::unique_ptr<PreTokenizer>> parts;
  for (const Json& item : *list) {
    SPECD_ASSIGN_OR_RETURN(auto part, PreTokenizerFromJson(item));
    parts.push_back(std::move(part));
  }
  return std::make_unique<SequencePreTokenizer>(std::move(parts));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizerFromJson(const Json& json) {
  SPECD_ASSIGN_OR_RETURN(std::string type, JsonString(json, "type"));
  if (type == "Sequence") return MakeSequence(json);
  if (type == "ByteLevel") return MakeByteLevel(json);
  if (type == "Split") return MakeSplit(json);
  if (type == "Metaspace") return MakeMetaspace(json);
  if (type == "Digits") {
    SPECD_ASSIGN_OR_RETURN(bool individual, JsonBoolOr(json, "individual_digits", false));
    return MakeRegexSplit("\\p{N}", individual ? Behavior::kIsolated : Behavior::kContiguous,
                          false);
  }
  if (type == "Punctuation") {
    SPECD_ASSIGN_OR_RETURN(std::string name, JsonStringOr(json, "behavior", "Isolated"));
    SPECD_ASSIGN_OR_RETURN(Behavior behavior, ParseBehavior(name));
    return MakeRegexSplit("[\\p{P}!-/:-@\\[-`{-~]", behavior, false);
  }
  // Whitespace keeps the matches of \w+|[^\w\s]+ and drops everything else.
  if (type == "Whitespace") return MakeRegexSplit("\\w+|[^\\w\\s]+", Behavior::kRemoved, true);
  if (type == "WhitespaceSplit") return MakeRegexSplit("\\s+", Behavior::kRemoved, false);
  return absl::UnimplementedError(absl::StrCat("unsupported pre-tokenizer type '", type, "'"));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> MakeRegexByteLevelPreTokenizer(
    const std::vector<std::string>& patterns) {
  std::vector<std::unique_ptr<PreTokenizer>> parts;
  for (const std::string& pattern : patterns) {
    SPECD_ASSIGN_OR_RETURN(auto part, MakeRegexSplit(pattern, Behavior::kIsolated, false));
    parts.push_back(std::move(part));
  }
  parts.push_back(std::make_unique<ByteLevelPreTokenizer>(false, nullptr));
  return std::make_unique<SequencePreTokenizer>(std::move(parts));
}

}  // namespace specd::tok
