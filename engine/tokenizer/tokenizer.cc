#include "engine/tokenizer/tokenizer.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/base/status.h"
#include "engine/tokenizer/gguf_vocab.h"
#include "engine/tokenizer/hf_loader.h"
#include "engine/tokenizer/tokenizer_parts.h"
#include "engine/tokenizer/utf8.h"

namespace specd {

using tok::AddedVocabulary;
using tok::DecodePiece;
using tok::PreToken;
using tok::TokenizerParts;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromDir(const std::string& dir) {
  SPECD_ASSIGN_OR_RETURN(auto parts, tok::LoadHfTokenizer(dir));
  return std::make_unique<Tokenizer>(std::move(parts));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const std::string& path) {
  SPECD_ASSIGN_OR_RETURN(auto parts, tok::LoadGgufTokenizer(path));
  return std::make_unique<Tokenizer>(std::move(parts));
}

Tokenizer::Tokenizer(std::unique_ptr<TokenizerParts> parts) : parts_(std::move(parts)) {}
Tokenizer::~Tokenizer() = default;

namespace {

using Ranges = std::span<const std::pair<size_t, size_t>>;

// Whether pos lies inside one of the sorted, disjoint ranges.
bool Inside(Ranges ranges, size_t pos) {
  auto after =
      std::upper_bound(ranges.begin(), ranges.end(), pos,
                       [](size_t p, const std::pair<size_t, size_t>& r) { return p < r.first; });
  return after != ranges.begin() && pos < std::prev(after)->second;
}

bool Overlaps(Ranges ranges, size_t begin, size_t end) {
  for (const auto& [b, e] : ranges) {
    if (b < end && begin < e) return true;
  }
  return false;
}

// Where a matched token's own text starts (lstrip may have added whitespace before it).
size_t TokenStart(const AddedVocabulary::Segment& seg) {
  const size_t skip = seg.text.find_first_not_of(" \t\n\r\f\v");
  return seg.offset + (skip == std::string_view::npos ? 0 : skip);
}

// Turns the matched tokens `as_text` picks back into text, joined with the text around
// them (segments tile `text`, so neighbours are adjacent).
template <typename Pred>
void TokensToText(std::string_view text, std::vector<AddedVocabulary::Segment>* segments,
                  Pred as_text) {
  std::vector<AddedVocabulary::Segment> out;
  for (const AddedVocabulary::Segment& seg : *segments) {
    const bool is_text = seg.id < 0 || as_text(seg);
    if (is_text && !out.empty() && out.back().id < 0) {
      AddedVocabulary::Segment& last = out.back();
      last.text = text.substr(last.offset, seg.offset + seg.text.size() - last.offset);
    } else {
      out.push_back({seg.text, is_text ? -1 : seg.id, seg.offset});
    }
  }
  segments->swap(out);
}

}  // namespace

// One stretch of text between raw added tokens: normalize, cut out normalized added
// tokens, pre-tokenize, run the model on every word.
absl::Status Tokenizer::EncodeSegment(std::string_view text, bool at_start, bool split_special,
                                      std::vector<int32_t>* ids) const {
  std::string normalized(text);
  if (parts_->normalizer != nullptr)
    SPECD_RETURN_IF_ERROR(parts_->normalizer->Normalize(&normalized));
  std::vector<AddedVocabulary::Segment> segments;
  parts_->added.SplitNormalized(normalized, &segments);
  if (split_special) {
    TokensToText(normalized, &segments,
                 [&](const AddedVocabulary::Segment& seg) { return IsSpecial(seg.id); });
  }
  std::vector<PreToken> words;
  for (const AddedVocabulary::Segment& seg : segments) {
    if (seg.id >= 0) {
      ids->push_back(seg.id);
      continue;
    }
    if (seg.text.empty()) continue;
    words.clear();
    words.push_back({std::string(seg.text), at_start && seg.offset == 0});
    if (parts_->pre_tokenizer != nullptr) {
      SPECD_RETURN_IF_ERROR(parts_->pre_tokenizer->PreTokenize(&words));
    }
    for (const PreToken& w : words) parts_->model->Tokenize(w.text, ids);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text,
                                                       bool add_special) const {
  return EncodeWithLiteralRanges(text, add_special, {});
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::EncodeWithLiteralRanges(std::string_view text,
                                                                        bool add_special,
                                                                        Ranges literal) const {
  if (!tok::IsValidUtf8(text)) return absl::InvalidArgumentError("input text is not valid UTF-8");
  std::vector<int32_t> ids;
  if (add_special) ids = parts_->prefix_ids;
  std::vector<AddedVocabulary::Segment> segments;
  parts_->added.SplitRaw(text, &segments);
  if (!literal.empty()) {
    TokensToText(text, &segments, [&](const AddedVocabulary::Segment& seg) {
      return IsSpecial(seg.id) && Inside(literal, TokenStart(seg));
    });
  }
  for (const AddedVocabulary::Segment& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
    } else {
      const bool split_special = Overlaps(literal, seg.offset, seg.offset + seg.text.size());
      SPECD_RETURN_IF_ERROR(EncodeSegment(seg.text, seg.offset == 0, split_special, &ids));
    }
  }
  if (add_special) ids.insert(ids.end(), parts_->suffix_ids.begin(), parts_->suffix_ids.end());
  return ids;
}

bool Tokenizer::ContainsSpecialToken(std::string_view text) const {
  std::vector<AddedVocabulary::Segment> segments;
  parts_->added.SplitRaw(text, &segments);
  std::vector<AddedVocabulary::Segment> inner;
  for (const AddedVocabulary::Segment& seg : segments) {
    if (seg.id >= 0) {
      if (IsSpecial(seg.id)) return true;
      continue;
    }
    std::string normalized(seg.text);
    if (parts_->normalizer != nullptr && !parts_->normalizer->Normalize(&normalized).ok()) {
      continue;
    }
    inner.clear();
    parts_->added.SplitNormalized(normalized, &inner);
    for (const AddedVocabulary::Segment& s : inner) {
      if (s.id >= 0 && IsSpecial(s.id)) return true;
    }
  }
  return false;
}

absl::StatusOr<std::string> Tokenizer::Decode(std::span<const int32_t> ids,
                                              bool skip_special) const {
  std::vector<DecodePiece> pieces;
  pieces.reserve(ids.size());
  const int32_t size = vocab_size();
  for (int32_t id : ids) {
    if (id < 0 || id >= size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " out of range [0, ", size, ")"));
    }
    const uint8_t flags = parts_->flags[id];
    if (!(flags & TokenizerParts::kPresent)) continue;
    if (skip_special && (flags & TokenizerParts::kSpecial)) continue;
    pieces.push_back({parts_->pieces[id], (flags & TokenizerParts::kVerbatim) != 0});
  }
  std::string out;
  if (parts_->decoder != nullptr) {
    parts_->decoder->DecodeChain(&pieces);
    for (const DecodePiece& p : pieces) out.append(p.text);
  } else {
    out =
        absl::StrJoin(pieces, " ", [](std::string* o, const DecodePiece& p) { o->append(p.text); });
  }
  if (!tok::IsValidUtf8(out)) out = tok::Utf8Lossy(out);
  return out;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(parts_->pieces.size()); }
std::optional<int32_t> Tokenizer::bos_id() const { return parts_->bos_id; }
std::vector<int32_t> Tokenizer::eos_ids() const { return parts_->eos_ids; }
const std::string& Tokenizer::bos_token() const { return parts_->bos_token; }
const std::string& Tokenizer::eos_token() const { return parts_->eos_token; }
const std::string& Tokenizer::chat_template() const { return parts_->chat_template; }

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && (parts_->flags[id] & TokenizerParts::kSpecial);
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (auto id = parts_->added.FindByContent(token)) return id;
  return parts_->model->Find(token);
}

std::string_view Tokenizer::IdToToken(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return parts_->pieces[id];
}

}  // namespace specd
