// N-gram prompt lookup (Saxena's "prompt lookup decoding", vLLM's `ngram` method): the drafts
// are the tokens that followed the most recent earlier occurrence of the sequence's last n
// tokens, trying n from prompt_lookup_max down to prompt_lookup_min. Free to run (no model),
// strong on inputs that repeat (code, summaries, edits), proposes nothing where nothing
// matches. Deterministic proposals: acceptance treats q as one-hot. Trees (DraftInput::tree_*):
// several earlier continuations merged into a trie. Also SSD's fast backup speculator.
// Stateless; engine thread only.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/speculation/speculator.h"

namespace specd {

// Up to max_tokens ids following the most recent earlier occurrence of tokens' last n ids, for
// the largest n in [min_n, max_n] that has one (n < tokens.size()). Empty when none matches.
std::vector<int32_t> NgramLookup(std::span<const int32_t> tokens, int32_t min_n, int32_t max_n,
                                 int32_t max_tokens);

// A token tree of earlier continuations (Draft::parents): the continuations (up to `depth` ids)
// of the matches of the last n ids, largest n first and most recent first within an n, merged
// into a trie where they share a prefix, each node keeping at most top_k children (the earlier
// inserted first), at most max_nodes nodes in all; nodes in breadth-first order. Empty when
// nothing matches.
void NgramTree(std::span<const int32_t> tokens, int32_t min_n, int32_t max_n, int32_t depth,
               int32_t top_k, int32_t max_nodes, std::vector<int32_t>* tokens_out,
               std::vector<int32_t>* parents_out);

class NgramSpeculator : public Speculator {
 public:
  NgramSpeculator(int32_t min_n, int32_t max_n) : min_n_(min_n), max_n_(max_n) {}

  absl::Status Propose(std::span<const DraftInput> inputs, std::vector<Draft>* drafts) override;
  void Release(uint64_t) override {}

 private:
  int32_t min_n_;
  int32_t max_n_;
};

}  // namespace specd
