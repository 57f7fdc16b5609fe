#include "engine/tokenizer/decoder.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/base/status.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/regex.h"
#include "engine/tokenizer/string_view_compat.h"
#include "engine/tokenizer/utf8.h"

namespace specd::tok {
namespace {

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts)
      : parts_(std::move(parts)) {}
  void DecodeChain(std::vector<DecodePiece>* pieces) const override {
    for (const auto& p : parts_) p->DecodeChain(pieces);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::string literal, std::unique_ptr<Regex> regex, std::string content)
      : literal_(std::move(literal)), regex_(std::move(regex)), content_(std::move(content)) {}
  void DecodeChain(std::vector<DecodePiece>* pieces) const override {
    for (DecodePiece& p : *pieces) {
      if (regex_ == nullptr) {
        if (!literal_.empty()) absl::StrReplaceAll({{literal_, content_}}, &p.text);
        continue;
      }
      std::vector<Regex::Match> matches;
      if (!IsValidUtf8(p.text) || !regex_->FindAll(p.text, &matches).ok()) continue;
      std::string out;
      size_t prev = 0;
      for (const auto& [begin, end] : matches) {
        out.append(p.text, prev, begin - prev);
        out.append(content_);
        prev = end;
      }
      out.append(p.text, prev);
      p.text = std::move(out);
    }
  }

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
  std::string content_;
};

// Runs of "<0xXX>" pieces become their bytes: as one string when they form valid UTF-8,
// else one U+FFFD per byte (HF's ByteFallback decoder).
class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<DecodePiece>* pieces) const override {
    std::vector<DecodePiece> out;
    out.reserve(pieces->size());
    std::string bytes;
    size_t num_bytes = 0;
    auto flush = [&] {
      if (num_bytes == 0) return;
      if (IsValidUtf8(bytes)) {
        out.push_back({std::move(bytes), false});
      } else {
        for (size_t i = 0; i < num_bytes; ++i) out.push_back({std::string(kReplacementChar)});
      }
      bytes.clear();
      num_bytes = 0;
    };
    for (DecodePiece& p : *pieces) {
      int byte = ParseByteToken(p.text);
      if (byte >= 0) {
        bytes.push_back(static_cast<char>(byte));
        ++num_bytes;
        continue;
      }
      flush();
      out.push_back(std::move(p));
    }
    flush();
    *pieces = std::move(out);
  }

 private:
  static int HexDigit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  }
  static int ParseByteToken(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    const int hi = HexDigit(t[3]);
    const int lo = HexDigit(t[4]);
    return (hi < 0 || lo < 0) ? -1 : hi * 16 + lo;
  }
};

class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<DecodePiece>* pieces) const override {
    DecodePiece fused;
    for (const DecodePiece& p : *pieces) fused.text.append(p.text);
    pieces->assign(1, std::move(fused));
  }
};

// Removes up to `start` leading and `stop` trailing copies of `content` from every piece.
class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<DecodePiece>* pieces) const override {
    if (content_.empty()) return;
    for (DecodePiece& p : *pieces) {
      std::string_view t = p.text;
      for (size_t i = 0; i < start_ && t.substr(0, content_.size()) == content_; ++i) {
        t.remove_prefix(content_.size());
      }
      for (size_t i = 0; i < stop_ && t.size() >= content_.size() &&
                         t.substr(t.size() - content_.size()) == content_;
           ++i) {
        t.remove_suffix(content_.size());
      }
      p.text = std::string(t);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

// All pieces' bytes joined and repaired like Rust's from_utf8_lossy. A piece with a
// character outside the byte-level alphabet contributes its raw UTF-8, as in HF.
class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<DecodePiece>* pieces) const override {
    std::string bytes;
    for (const DecodePiece& p : *pieces) {
      if (p.verbatim || !AppendBytesFromByteLevel(p.text, &bytes)) bytes.append(p.text);
    }
    pieces->assign(1, DecodePiece{Utf8Lossy(bytes), false});
  }
};

// Replacement chars become spaces, except in the first piece when a prefix was prepended.
class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void DecodeChain(std::vector<DecodePiece>* pieces) const override {
    for (size_t i = 0; i < pieces->size(); ++i) {
      const absl::string_view with = (i == 0 && strip_first_) ? "" : " ";
      absl::StrReplaceAll({{replacement_, with}}, &(*pieces)[i].text);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

absl::StatusOr<std::unique_ptr<Decoder>> MakeReplace(const Json& json) {
  std::string pattern;
  bool is_regex = false;
  SPECD_RETURN_IF_ERROR(JsonPattern(json, &pattern, &is_regex));
  SPECD_ASSIGN_OR_RETURN(std::string content, JsonString(json, "content"));
  std::unique_ptr<Regex> regex;
  if (is_regex) {
    SPECD_ASSIGN_OR_RETURN(regex, Regex::Compile(pattern));
  }
  return std::make_unique<ReplaceDecoder>(std::move(pattern), std::move(regex), std::move(content));
}

absl::StatusOr<std::unique_ptr<Decoder>> MakeStrip(const Json& json) {
  SPECD_ASSIGN_OR_RETURN(std::string content, JsonString(json, "content"));
  SPECD_ASSIGN_OR_RETURN(int64_t start, JsonIntOr(json, "start", 0));
  SPECD_ASSIGN_OR_RETURN(int64_t stop, JsonIntOr(json, "stop", 0));
  if (start < 0 || stop < 0) return absl::InvalidArgumentError("Strip start/stop must be >= 0");
  return std::make_unique<StripDecoder>(std::move(content), start, stop);
}

absl::StatusOr<std::unique_ptr<Decoder>> MakeMetaspace(const Json& json) {
  SPECD_ASSIGN_OR_RETURN(std::string replacement, JsonStringOr(json, "replacement", "\u2581"));
  SPECD_ASSIGN_OR_RETURN(bool add_prefix_space, JsonBoolOr(json, "add_prefix_space", true));
  SPECD_ASSIGN_OR_RETURN(std::string scheme, JsonStringOr(json, "prepend_scheme",
                                                          add_prefix_space ? "always" : "never"));
  return std::make_unique<MetaspaceDecoder>(std::move(replacement), scheme != "never");
}

absl::StatusOr<std::unique_ptr<Decoder>> MakeSequence(const Json& json) {
  const Json* list = JsonFind(json, "decoders");
  if (list == nullptr || !list->is_array()) {
    return absl::InvalidArgumentError("Sequence decoder needs a 'decoders' array");
  }
  std::vector<std::unique_ptr<Decoder>> parts;
  for (const Json& item : *list) {
    SPECD_ASSIGN_OR_RETURN(auto part, DecoderFromJson(item));
    parts.push_back(std::move(part));
  }
  return std::make_unique<SequenceDecoder>(std::move(parts));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Decoder>> DecoderFromJson(const Json& json) {
  SPECD_ASSIGN_OR_RETURN(std::string type, JsonString(json, "type"));
  if (type == "Sequence") return MakeSequence(json);
  if (type == "Replace") return MakeReplace(json);
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") return MakeStrip(json);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") return MakeMetaspace(json);
  return absl::UnimplementedError(absl::StrCat("unsupported decoder type '", type, "'"));
}

std::unique_ptr<Decoder> MakeSpmDecoder(bool strip_leading_space) {
  std::vector<std::unique_ptr<Decoder>> parts;
  parts.push_back(std::make_unique<ReplaceDecoder>(std::string(kMetaspace), nullptr, " "));
  parts.push_back(std::make_unique<ByteFallbackDecoder>());
  parts.push_back(std::make_unique<FuseDecoder>());
  if (strip_leading_space) parts.push_back(std::make_unique<StripDecoder>(" ", 1, 0));
  return std::make_unique<SequenceDecoder>(std::move(parts));
}

std::unique_ptr<Decoder> MakeByteLevelDecoder() { return std::make_unique<ByteLevelDecoder>(); }

}  // namespace specd::tok
