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

void NgramTree(std::span<const int32_t> tokens, int32_t min_n, int32_t max_n, int32_t depth,
               int32_t top_k, int32_t max_nodes, std::vector<int32_t>* tokens_out,
               std::vector<int32_t>* parents_out) {
  tokens_out->clear();
  parents_out->clear();
  if (depth <= 0 || top_k <= 0 || max_nodes <= 0) return;
  // The trie in insertion order: token, parent (-1: the root), children.
  struct Node {
    int32_t token;
    int32_t parent;
    std::vector<int32_t> children;
  };
  std::vector<Node> trie;
  std::vector<int32_t> roots;  // the root's children
  const int64_t size = static_cast<int64_t>(tokens.size());
  auto insert = [&](int64_t begin) {
    int32_t parent = -1;
    for (int64_t i = begin; i < std::min(size, begin + depth); ++i) {
      std::vector<int32_t>& kids = parent < 0 ? roots : trie[parent].children;
      const auto hit = std::find_if(kids.begin(), kids.end(),
                                    [&](int32_t c) { return trie[c].token == tokens[i]; });
      if (hit != kids.end()) {
        parent = *hit;
        continue;
      }
      if (static_cast<int32_t>(kids.size()) >= top_k ||
          static_cast<int32_t>(trie.size()) >= max_nodes) {
        return;
      }
      // `kids` may live in `trie`: use it before trie grows (which moves it).
      const auto node = static_cast<int32_t>(trie.size());
      kids.push_back(node);
      trie.push_back(Node{tokens[i], parent, {}});
      parent = node;
    }
  };
  for (int64_t n = std::min<int64_t>(max_n, size - 1); n >= std::max(1, min_n); --n) {
    std::span<const int32_t> suffix = tokens.subspan(size - n);
    for (int64_t p = size - n - 1; p >= 0; --p) {
      if (static_cast<int32_t>(trie.size()) >= max_nodes) break;
      if (std::equal(suffix.begin(), suffix.end(), tokens.begin() + p)) insert(p + n);
    }
  }
  // Breadth first: parents before children, siblings in insertion order.
  std::vector<int32_t> order(roots.begin(), roots.end()), index(trie.size(), -1);
  for (size_t i = 0; i < order.size(); ++i) {
    const Node& node = trie[order[i]];
    index[order[i]] = static_cast<int32_t>(i);
    tokens_out->push_back(node.token);
    parents_out->push_back(node.parent < 0 ? -1 : index[node.parent]);
    order.insert(order.end(), node.children.begin(), node.children.end());
  }
}

absl::Status NgramSpeculator::Propose(std::span<const DraftInput> inputs,
                                      std::vector<Draft>* drafts) {
  drafts->resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    Draft& d = (*drafts)[i];
    d.probs.clear();
    d.parents.clear();
    const DraftInput& in = inputs[i];
    if (in.wants_tree()) {
      NgramTree(in.tokens, min_n_, max_n_, in.tree_depth, in.tree_top_k, in.num_draft_tokens,
                &d.tokens, &d.parents);
      continue;
    }
    d.tokens = NgramLookup(in.tokens, min_n_, max_n_, in.num_draft_tokens);
  }
  return absl::OkStatus();
}

}  // namespace specd
