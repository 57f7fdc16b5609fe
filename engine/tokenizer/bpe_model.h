// The BPE model: a word (one pre-tokenized piece) becomes ids by starting from its
// characters (with byte fallback or unk for unknown ones) and repeatedly applying the
// lowest-ranked merge, leftmost first — HF tokenizers' BPE and, with ranks derived from
// piece scores, SentencePiece / llama.cpp SPM. Merges are looked up in a hash map of id
// pairs; a linked list of symbols and a min-heap make a word O(n log n).
// Loading is single-threaded; Tokenize is thread-safe (the word cache takes a lock).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"

namespace specd::tok {

class BpeModel {
 public:
  struct Options {
    bool byte_fallback = false;     // unknown chars -> "<0xXX>" pieces
    std::optional<int32_t> unk_id;  // else unknown chars -> unk (or dropped without one)
    bool fuse_unk = false;          // consecutive unknown chars share one unk
    bool ignore_merges = false;     // a word that is itself a piece is emitted whole
    std::string continuing_subword_prefix;
    std::string end_of_word_suffix;
  };

  BpeModel(absl::flat_hash_map<std::string, int32_t> vocab, Options options);
  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // HF merge "left right": both sides and their concatenation must be pieces.
  absl::Status AddMerge(std::string_view left, std::string_view right, int32_t rank);
  // A merge by ids. Equal ranks are allowed (SPM score ties: leftmost wins). A pair added
  // twice keeps its first rank.
  void AddMergeIds(int32_t left, int32_t right, int32_t rank, int32_t merged);

  // SentencePiece-style text arrives as one long word ("▁a▁b..."). When no piece has a
  // U+2581 right after another character, no merge can cross the start of a "▁*x*" run, so
  // Tokenize may cut the text there (exact, and it lets the word cache work). Returns
  // whether splitting was enabled. Call after all merges are added.
  bool EnableMetaspaceWordSplit();

  // Appends the ids of `word`.
  void Tokenize(std::string_view word, std::vector<int32_t>* ids) const;

  std::optional<int32_t> Find(std::string_view piece) const;
  size_t num_merges() const { return merges_.size(); }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  void TokenizeWord(std::string_view word, std::vector<int32_t>* ids) const;
  void InitialSymbols(std::string_view word, std::vector<int32_t>* symbols) const;
  void MergeSymbols(std::vector<int32_t>* symbols) const;
  bool CacheLookup(std::string_view word, std::vector<int32_t>* ids) const;
  void CacheStore(std::string_view word, const std::vector<int32_t>& ids) const;

  absl::flat_hash_map<std::string, int32_t> vocab_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  Options options_;
  std::array<int32_t, 256> byte_ids_;  // id of "<0xXX>", -1 when absent
  bool split_at_metaspace_ = false;

  // std::shared_mutex rather than absl::Mutex: the distribution's abseil is not built with
  // TSan, so absl::Mutex's ordering is invisible to it (HTTP workers tokenize concurrently).
  mutable std::shared_mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_ ABSL_GUARDED_BY(cache_mu_);
};

}  // namespace specd::tok
