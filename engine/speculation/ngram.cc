#include "engine/speculation/ngram.h"

#include <algorithm>

namespace specd {

std::vector<int32_t> NgramLookup(std::span<const int32_t> tokens, int32_t min_n, int32_t max_n,
                                 int32_t max_tokens) {
  const int64_t size = static_cast<int64_t>(tokens.size());
  if (max_tokens <= 0) return {};
  for (int64_t n = std::min<int64_t>(max_n, size - 1); n >= std::max(1, min_n); --n) {
    std::span<const int32_t> suffix = tokens.subspan(size - n);
    // Most recent occurrence that ends before the suffix starts to overlap its own end:
    // start p < size - n, so at least one token follows it.
    for (int64_t p = size - n - 1; p >= 0; --p) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + p)) continue;
      const int64_t begin = p + n;
      const int64_t end = std::min(size, begin + max_tokens);
      return std::vector<int32_t>(tokens.begin() + begin, tokens.begin() + end);
    }
  }
  return {};
}

absl::Status NgramSpeculator::Propose(std::span<const DraftInput> inputs,
                                      std::vector<Draft>* drafts) {
  drafts->resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    Draft& d = (*drafts)[i];
    d.probs.clear();
    d.tokens = NgramLookup(inputs[i].tokens, min_n_, max_n_, inputs[i].num_draft_tokens);
  }
  return absl::OkStatus();
}

}  // namespace specd
