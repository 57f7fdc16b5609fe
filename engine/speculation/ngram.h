// N-gram prompt lookup (Saxena's "prompt lookup decoding", vLLM's `ngram` method): the drafts
// are the tokens that followed the most recent earlier occurrence of the sequence's last n
// tokens, trying n from prompt_lookup_max down to prompt_lookup_min. Free to run (no model),
// strong on inputs that repeat (code, summaries, edits), proposes nothing where nothing
// matches. Deterministic proposals: acceptance treats q as one-hot. Also SSD's fast backup
// speculator. Stateless; engine thread only.
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
