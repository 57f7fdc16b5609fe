#include "engine/tokenizer/bpe_model.h"

#include <cstdio>
#include <mutex>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/string_view_compat.h"
#include "engine/tokenizer/utf8.h"

namespace specd::tok {
namespace {

constexpr size_t kMaxCachedWordBytes = 64;
constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581
constexpr size_t kMaxCacheEntries = 1 << 16;

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
};

struct Candidate {
  int32_t rank;
  int32_t pos;  // index of the left symbol
  int32_t left;
  int32_t right;
  int32_t merged;
  bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

BpeModel::BpeModel(absl::flat_hash_map<std::string, int32_t> vocab, Options options)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = vocab_.find(name);
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
}

std::optional<int32_t> BpeModel::Find(std::string_view piece) const {
  auto it = vocab_.find(AsAbsl(piece));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

absl::Status BpeModel::AddMerge(std::string_view left, std::string_view right, int32_t rank) {
  auto l = vocab_.find(AsAbsl(left));
  auto r = vocab_.find(AsAbsl(right));
  if (l == vocab_.end() || r == vocab_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("merge '", AsAbsl(left), " ", AsAbsl(right),
                                                   "' uses a piece missing from the vocab"));
  }
  std::string_view right_rest = right;
  const std::string& prefix = options_.continuing_subword_prefix;
  if (!prefix.empty() && right_rest.substr(0, prefix.size()) == prefix) {
    right_rest.remove_prefix(prefix.size());
  }
  auto m = vocab_.find(absl::StrCat(AsAbsl(left), AsAbsl(right_rest)));
  if (m == vocab_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("merge '", AsAbsl(left), " ", AsAbsl(right),
                                                   "' makes a piece missing from the vocab"));
  }
  AddMergeIds(l->second, r->second, rank, m->second);
  return absl::OkStatus();
}

void BpeModel::AddMergeIds(int32_t left, int32_t right, int32_t rank, int32_t merged) {
  merges_.try_emplace(PairKey(left, right), Merge{rank, merged});
}

void BpeModel::InitialSymbols(std::string_view word, std::vector<int32_t>* symbols) const {
  bool last_was_unk = false;
  std::string key;
  for (size_t pos = 0; pos < word.size();) {
    const size_t len = std::min(word.size() - pos, DecodeUtf8(word, pos).len);
    const std::string_view ch = word.substr(pos, len);
    key.clear();
    if (pos > 0) key.append(options_.continuing_subword_prefix);
    key.append(ch);
    pos += len;
    if (pos == word.size()) key.append(options_.end_of_word_suffix);
    if (auto it = vocab_.find(key); it != vocab_.end()) {
      symbols->push_back(it->second);
      last_was_unk = false;
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (char c : ch) all &= byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        for (char c : ch) symbols->push_back(byte_ids_[static_cast<uint8_t>(c)]);
        last_was_unk = false;
        continue;
      }
    }
    if (!options_.unk_id.has_value()) continue;  // no unk: HF drops the character
    if (!(options_.fuse_unk && last_was_unk)) symbols->push_back(*options_.unk_id);
    last_was_unk = true;
  }
}

void BpeModel::MergeSymbols(std::vector<int32_t>* ids) const {
  const int32_t n = static_cast<int32_t>(ids->size());
  if (n < 2 || merges_.empty()) return;
  std::vector<Symbol> sym(n);
  for (int32_t i = 0; i < n; ++i) sym[i] = {(*ids)[i], i - 1, i + 1 < n ? i + 1 : -1};
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || sym[pos].next < 0) return;
    const int32_t left = sym[pos].id;
    const int32_t right = sym[sym[pos].next].id;
    auto it = merges_.find(PairKey(left, right));
    if (it != merges_.end()) heap.push({it->second.rank, pos, left, right, it->second.merged});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = sym[c.pos];
    // Stale entries: the left symbol was absorbed, or either side changed since the push.
    if (left.id != c.left || left.next < 0 || sym[left.next].id != c.right) continue;
    const int32_t right_pos = left.next;
    left.id = c.merged;
    left.next = sym[right_pos].next;
    if (left.next >= 0) sym[left.next].prev = c.pos;
    sym[right_pos].id = -1;
    push(left.prev);
    push(c.pos);
  }
  ids->clear();
  for (int32_t i = 0; i >= 0; i = sym[i].next) ids->push_back(sym[i].id);
}

bool BpeModel::EnableMetaspaceWordSplit() {
  if (options_.ignore_merges || !vocab_.contains(AsAbsl(kMetaspace))) return false;
  for (const auto& [piece, id] : vocab_) {
    // A U+2581 preceded by anything but U+2581 would let a merge cross a cut.
    size_t pos = piece.find(kMetaspace, 1);
    while (pos != std::string::npos) {
      if (pos < kMetaspace.size() ||
          piece.compare(pos - kMetaspace.size(), kMetaspace.size(), kMetaspace) != 0) {
        return false;
      }
      pos = piece.find(kMetaspace, pos + 1);
    }
  }
  split_at_metaspace_ = true;
  return true;
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (!split_at_metaspace_) return TokenizeWord(word, ids);
  // Cut before every run of U+2581 that follows another character.
  size_t start = 0;
  size_t pos = word.find(kMetaspace, 1);
  while (pos != std::string_view::npos) {
    const bool after_meta = pos >= kMetaspace.size() &&
                            word.substr(pos - kMetaspace.size(), kMetaspace.size()) == kMetaspace;
    if (!after_meta && pos > start) {
      TokenizeWord(word.substr(start, pos - start), ids);
      start = pos;
    }
    pos = word.find(kMetaspace, pos + kMetaspace.size());
  }
  TokenizeWord(word.substr(start), ids);
}

void BpeModel::TokenizeWord(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (auto it = vocab_.find(AsAbsl(word)); it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> symbols;
  if (CacheLookup(word, &symbols)) {
    ids->insert(ids->end(), symbols.begin(), symbols.end());
    return;
  }
  InitialSymbols(word, &symbols);
  MergeSymbols(&symbols);
  CacheStore(word, symbols);
  ids->insert(ids->end(), symbols.begin(), symbols.end());
}

bool BpeModel::CacheLookup(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.size() > kMaxCachedWordBytes) return false;
  std::shared_lock<std::shared_mutex> lock(cache_mu_);
  auto it = cache_.find(AsAbsl(word));
  if (it == cache_.end()) return false;
  *ids = it->second;
  return true;
}

void BpeModel::CacheStore(std::string_view word, const std::vector<int32_t>& ids) const {
  if (word.size() > kMaxCachedWordBytes) return;
  std::unique_lock<std::shared_mutex> lock(cache_mu_);
  if (cache_.size() >= kMaxCacheEntries) cache_.clear();
  cache_.try_emplace(std::string(word), ids);
}

}  // namespace specd::tok
