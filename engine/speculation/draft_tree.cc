#include "engine/speculation/draft_tree.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "engine/speculation/draft_replay.h"

namespace specd {

void DraftTreeBuilder::Reset(int32_t depth, int32_t top_k, int32_t max_nodes) {
  depth_ = depth;
  top_k_ = top_k;
  max_nodes_ = max_nodes;
  level_ = 0;
  level_begin_ = 0;
  nodes_.clear();
  replay_ = nullptr;
  context_ = {};
}

void DraftTreeBuilder::set_replay(const DraftReplay* replay, std::span<const int32_t> context) {
  replay_ = replay;
  context_ = replay != nullptr ? context : std::span<const int32_t>();
}

void DraftTreeBuilder::Expand(int32_t node, std::span<const float> logits,
                              std::span<const int32_t> banned) {
  const auto vocab = static_cast<int32_t>(logits.size());
  scratch_.assign(logits.begin(), logits.end());
  for (int32_t id : banned) {
    if (id >= 0 && id < vocab) scratch_[id] = -std::numeric_limits<float>::infinity();
  }
  const float max = *std::max_element(scratch_.begin(), scratch_.end());
  if (!std::isfinite(max)) return;  // everything banned
  double sum = 0;
  for (float x : scratch_) sum += std::exp(static_cast<double>(x) - max);
  const double log_sum = max + std::log(sum);
  // The top_k ids by logit, ties to the lower id.
  const int32_t k = std::min(top_k_, vocab);
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
    return scratch_[a] > scratch_[b] || (scratch_[a] == scratch_[b] && a < b);
  });
  ids.resize(static_cast<size_t>(k));
  logprobs_.clear();
  for (int32_t id : ids) logprobs_.push_back(scratch_[id] - log_sum);
  AddChildren(node, ids, logprobs_);
}

void DraftTreeBuilder::ExpandCandidates(int32_t node, std::span<const int32_t> ids,
                                        std::span<const float> logprobs) {
  const size_t k = std::min({static_cast<size_t>(top_k_), ids.size(), logprobs.size()});
  candidates_.assign(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(k));
  logprobs_.assign(logprobs.begin(), logprobs.begin() + static_cast<ptrdiff_t>(k));
  AddChildren(node, candidates_, logprobs_);
}

void DraftTreeBuilder::AddChildren(int32_t node, std::vector<int32_t>& ids,
                                   std::span<const double> logprobs) {
  const double base = node < 0 ? 0.0 : nodes_[node].score;
  const int32_t depth = node < 0 ? 0 : nodes_[node].depth + 1;
  int32_t num_children = 0;
  while (num_children < std::ssize(logprobs) && std::isfinite(logprobs[num_children])) {
    ++num_children;
  }
  // Scores by rank, taken before the replay rewrites the ids: slot i keeps the model's i-th.
  const size_t first = nodes_.size();
  for (int32_t i = 0; i < num_children; ++i) {
    nodes_.push_back(Node{ids[i], node, depth, base + logprobs[i]});
  }
  if (replay_ == nullptr || num_children == 0) return;
  path_.clear();
  if (node >= 0) AppendPathTokens(node, &path_);
  std::span<int32_t> children = std::span<int32_t>(ids).first(num_children);
  replay_->Children(context_, path_, children);
  for (int32_t i = 0; i < num_children; ++i) nodes_[first + i].token = children[i];
}

std::vector<int32_t> DraftTreeBuilder::NextLevel() {
  std::vector<int32_t> best;
  if (level_ + 1 >= depth_) return best;
  for (size_t n = level_begin_; n < nodes_.size(); ++n) best.push_back(static_cast<int32_t>(n));
  std::stable_sort(best.begin(), best.end(),
                   [&](int32_t a, int32_t b) { return nodes_[a].score > nodes_[b].score; });
  if (static_cast<int32_t>(best.size()) > top_k_) best.resize(top_k_);
  std::sort(best.begin(), best.end());
  level_begin_ = nodes_.size();
  ++level_;
  return best;
}

void DraftTreeBuilder::AppendPathTokens(int32_t node, std::vector<int32_t>* out) const {
  const size_t first = out->size();
  for (int32_t n = node; n >= 0; n = nodes_[n].parent) out->push_back(nodes_[n].token);
  std::reverse(out->begin() + static_cast<std::ptrdiff_t>(first), out->end());
}

void DraftTreeBuilder::Finish(std::vector<int32_t>* tokens, std::vector<int32_t>* parents) const {
  tokens->clear();
  parents->clear();
  // The best max_nodes by score; on equal scores the shallower (then earlier) node first, so a
  // parent always comes before a child that ties with it.
  std::vector<int32_t> order(nodes_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    if (nodes_[a].score != nodes_[b].score) return nodes_[a].score > nodes_[b].score;
    return nodes_[a].depth < nodes_[b].depth;
  });
  std::vector<char> kept(nodes_.size(), 0);
  int32_t count = 0;
  for (int32_t n : order) {
    if (count == max_nodes_) break;
    // Ancestors are kept already (they score at least as high); a node whose parent was cut by
    // the budget on a tie is skipped rather than orphaned.
    if (nodes_[n].parent >= 0 && !kept[nodes_[n].parent]) continue;
    kept[n] = 1;
    ++count;
  }
  // Breadth first, siblings in the order Expand added them (best first).
  std::vector<int32_t> bfs, index(nodes_.size(), -1);
  for (int32_t d = 0; d < depth_; ++d) {
    for (size_t n = 0; n < nodes_.size(); ++n) {
      if (kept[n] && nodes_[n].depth == d) bfs.push_back(static_cast<int32_t>(n));
    }
  }
  for (size_t i = 0; i < bfs.size(); ++i) {
    const Node& node = nodes_[bfs[i]];
    index[bfs[i]] = static_cast<int32_t>(i);
    tokens->push_back(node.token);
    parents->push_back(node.parent < 0 ? -1 : index[node.parent]);
  }
}

}  // namespace specd
