// Added tokens (special and user-defined) that are cut out of the text before the model
// sees it, with HF tokenizers' semantics: leftmost-longest matching; tokens marked
// `normalized` match the normalized text (by their normalized content), the others the raw
// text; lstrip/rstrip swallow adjacent whitespace; single_word needs word boundaries.
// Built once at load; the Split* methods are const and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"

namespace specd::tok {

class Normalizer;
class Regex;

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

class AddedVocabulary {
 public:
  // A stretch of text (`id` < 0) or a matched added token.
  struct Segment {
    std::string_view text;
    int32_t id = -1;
    size_t offset = 0;  // byte offset of `text` in the string that was split
  };

  AddedVocabulary();
  ~AddedVocabulary();

  // `normalizer` (may be null) gives the match form of normalized tokens.
  absl::Status Build(std::vector<AddedToken> tokens, const Normalizer* normalizer);

  // Splits `text` at the non-normalized tokens / at the normalized ones.
  void SplitRaw(std::string_view text, std::vector<Segment>* out) const;
  void SplitNormalized(std::string_view text, std::vector<Segment>* out) const;

  const AddedToken* FindById(int32_t id) const;
  std::optional<int32_t> FindByContent(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // Byte trie over the match forms of one token set.
  struct Trie {
    absl::flat_hash_map<uint64_t, int32_t> edges;  // (node << 8 | byte) -> child node
    std::vector<int32_t> terminal;                 // node -> token index, -1 if none
    std::vector<bool> first_byte;                  // bytes that can start a match
    bool empty() const { return terminal.size() <= 1; }
  };
  void Insert(Trie* trie, std::string_view key, int32_t token_index);
  // Longest match starting at `pos`: its length, or 0.
  size_t LongestAt(const Trie& trie, std::string_view text, size_t pos, int32_t* index) const;
  void Split(const Trie& trie, std::string_view text, std::vector<Segment>* out) const;
  bool IsWordBoundary(std::string_view text, size_t begin, size_t end) const;

  std::vector<AddedToken> tokens_;
  absl::flat_hash_map<int32_t, size_t> by_id_;
  absl::flat_hash_map<std::string, int32_t> by_content_;
  Trie raw_;
  Trie normalized_;
  std::unique_ptr<Regex> word_char_;  // only built when a token is single_word
};

}  // namespace specd::tok
