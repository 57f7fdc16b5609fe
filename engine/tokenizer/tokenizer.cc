#include "engine/tokenizer/tokenizer.h"

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

// One stretch of text between raw added tokens: normalize, cut out normalized added
// tokens, pre-tokenize, run the model on every word.
absl::Status Tokenizer::EncodeSegment(std::string_view text, bool at_start,
                                      std::vector<int32_t>* ids) const {
  std::string normalized(text);
  if (parts_->normalizer != nullptr)
    SPECD_RETURN_IF_ERROR(parts_->normalizer->Normalize(&normalized));
  std::vector<AddedVocabulary::Segment> segments;
  parts_->added.SplitNormalized(normalized, &segments);
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
  if (!tok::IsValidUtf8(text)) return absl::InvalidArgumentError("input text is not valid UTF-8");
  std::vector<int32_t> ids;
  if (add_special) ids = parts_->prefix_ids;
  std::vector<AddedVocabulary::Segment> segments;
  parts_->added.SplitRaw(text, &segments);
  for (const AddedVocabulary::Segment& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
    } else {
      SPECD_RETURN_IF_ERROR(EncodeSegment(seg.text, seg.offset == 0, &ids));
    }
  }
  if (add_special) ids.insert(ids.end(), parts_->suffix_ids.begin(), parts_->suffix_ids.end());
  return ids;
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
