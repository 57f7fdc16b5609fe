#include "engine/tokenizer/added_vocabulary.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/base/status.h"
#include "engine/tokenizer/normalizer.h"
#include "engine/tokenizer/regex.h"
#include "engine/tokenizer/string_view_compat.h"
#include "engine/tokenizer/utf8.h"

namespace specd::tok {
namespace {

// Start of the whitespace run that ends at `end`.
size_t WhitespaceRunStart(std::string_view text, size_t end) {
  size_t pos = end;
  while (pos > 0) {
    size_t start = pos - 1;
    while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
    if (!IsUnicodeWhitespace(DecodeUtf8(text, start).code_point)) break;
    pos = start;
  }
  return pos;
}

// End of the whitespace run that starts at `begin`.
size_t WhitespaceRunEnd(std::string_view text, size_t begin) {
  size_t pos = begin;
  while (pos < text.size()) {
    const Utf8Step s = DecodeUtf8(text, pos);
    if (!IsUnicodeWhitespace(s.code_point)) break;
    pos += s.len;
  }
  return pos;
}

}  // namespace

AddedVocabulary::AddedVocabulary() = default;
AddedVocabulary::~AddedVocabulary() = default;

absl::Status AddedVocabulary::Build(std::vector<AddedToken> tokens, const Normalizer* normalizer) {
  tokens_ = std::move(tokens);
  raw_ = Trie{};
  normalized_ = Trie{};
  raw_.terminal.push_back(-1);
  raw_.first_byte.assign(256, false);
  normalized_.terminal.push_back(-1);
  normalized_.first_byte.assign(256, false);
  bool any_single_word = false;
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& t = tokens_[i];
    if (t.content.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("added token ", t.id, " is empty"));
    }
    by_id_[t.id] = i;
    by_content_.try_emplace(t.content, t.id);
    any_single_word |= t.single_word;
    if (!t.normalized) {
      Insert(&raw_, t.content, static_cast<int32_t>(i));
      continue;
    }
    std::string form = t.content;
    if (normalizer != nullptr) SPECD_RETURN_IF_ERROR(normalizer->Normalize(&form));
    if (!form.empty()) Insert(&normalized_, form, static_cast<int32_t>(i));
  }
  if (any_single_word) {
    SPECD_ASSIGN_OR_RETURN(word_char_, Regex::Compile("[\\p{Alphabetic}\\p{N}]"));
  }
  return absl::OkStatus();
}

void AddedVocabulary::Insert(Trie* trie, std::string_view key, int32_t token_index) {
  int32_t node = 0;
  for (char c : key) {
    const uint64_t edge = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
    auto [it, inserted] =
        trie->edges.try_emplace(edge, static_cast<int32_t>(trie->terminal.size()));
    if (inserted) trie->terminal.push_back(-1);
    node = it->second;
  }
  trie->first_byte[static_cast<uint8_t>(key[0])] = true;
  // The first token with a given form wins, like HF's pattern order.
  if (trie->terminal[node] < 0) trie->terminal[node] = token_index;
}

size_t AddedVocabulary::LongestAt(const Trie& trie, std::string_view text, size_t pos,
                                  int32_t* index) const {
  size_t best = 0;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    auto it = trie.edges.find((static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[i]));
    if (it == trie.edges.end()) break;
    node = it->second;
    if (trie.terminal[node] >= 0) {
      best = i + 1 - pos;
      *index = trie.terminal[node];
    }
  }
  return best;
}

bool AddedVocabulary::IsWordBoundary(std::string_view text, size_t begin, size_t end) const {
  std::vector<Regex::Match> m;
  if (begin > 0) {
    size_t start = begin - 1;
    while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
    if (word_char_->FindAll(text.substr(start, begin - start), &m).ok() && !m.empty()) return false;
  }
  if (end < text.size()) {
    const size_t len = DecodeUtf8(text, end).len;
    if (word_char_->FindAll(text.substr(end, len), &m).ok() && !m.empty()) return false;
  }
  return true;
}

void AddedVocabulary::Split(const Trie& trie, std::string_view text,
                            std::vector<Segment>* out) const {
  size_t emitted = 0;  // end of what is already in `out`
  size_t pos = 0;
  while (!trie.empty() && pos < text.size()) {
    if (!trie.first_byte[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    int32_t index = -1;
    const size_t len = LongestAt(trie, text, pos, &index);
    if (len == 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[index];
    size_t begin = pos;
    size_t end = pos + len;
    if (token.single_word && !IsWordBoundary(text, begin, end)) {
      pos = end;
      continue;
    }
    if (token.lstrip) begin = std::max(WhitespaceRunStart(text, begin), emitted);
    if (token.rstrip) end = WhitespaceRunEnd(text, end);
    if (begin > emitted) out->push_back({text.substr(emitted, begin - emitted), -1, emitted});
    out->push_back({text.substr(begin, end - begin), token.id, begin});
    emitted = end;
    pos = end;
  }
  if (emitted < text.size() || text.empty()) {
    out->push_back({text.substr(emitted), -1, emitted});
  }
}

void AddedVocabulary::SplitRaw(std::string_view text, std::vector<Segment>* out) const {
  Split(raw_, text, out);
}

void AddedVocabulary::SplitNormalized(std::string_view text, std::vector<Segment>* out) const {
  Split(normalized_, text, out);
}

const AddedToken* AddedVocabulary::FindById(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocabulary::FindByContent(std::string_view content) const {
  auto it = by_content_.find(AsAbsl(content));
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

}  // namespace specd::tok
