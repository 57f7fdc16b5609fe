// Eagle3Speculator's token trees (eagle3.h): grown a level at a time by DraftTreeBuilder from the
// head's logits, each level one head pass of the nodes to expand in tree slots of their own; and
// the accepted path of a verified tree chunk, found at the next Propose.
#include <algorithm>

#include "engine/speculation/eagle3.h"

namespace specd {

void Eagle3Speculator::ResolveTree(const DraftInput& in, State& s) const {
  const int32_t start = s.tree_start;
  s.tree_start = -1;
  const auto num_tokens = static_cast<int32_t>(in.tokens.size());
  // The root (pending already) must still be the sequence's token at its position.
  if (start < 0 || start >= num_tokens || s.pending.empty() || s.pending.back().position != start ||
      in.tokens[start] != s.tree_tokens[0]) {
    return;
  }
  // Each committed token after the root that is a child of the node before it continues the
  // path: that node's hidden state is the target's for this exact prefix (the tree mask).
  const auto n = static_cast<int32_t>(s.tree_tokens.size());
  int32_t node = 0;
  for (int32_t p = start + 1; p < num_tokens; ++p) {
    int32_t next = -1;
    for (int32_t c = node + 1; c < n && next < 0; ++c) {
      if (s.tree_parents[c] == node && s.tree_tokens[c] == in.tokens[p]) next = c;
    }
    if (next < 0) break;
    s.pending.push_back(Pending{p, in.tokens[p], PoolRow(s, start + next)});
    node = next;
  }
}

void Eagle3Speculator::StartTree(const DraftInput& in, Active* a) {
  a->tree = static_cast<int32_t>(trees_.size());
  TreeActive& t = trees_.emplace_back();
  t.input = a->input;
  t.builder.Reset(in.tree_depth, std::max(in.tree_top_k, 1), in.num_draft_tokens);
  // Controlled acceptance (benchmarks): greedy trees follow the recording, as chains do.
  if (replay_ != nullptr && in.params != nullptr && in.params->greedy()) {
    t.builder.set_replay(replay_.get(), in.tokens);
  }
  // Node slots start after the catch-up's last row (position L - 2): the round's K slots from
  // the last committed token's on, which the target reserved (a head KV on its block tables).
  t.root_slot = static_cast<int32_t>(in.tokens.size()) - 1;
  t.max_region = in.num_draft_tokens;
  t.level.assign(1, -1);  // the catch-up's logits row expands the root
}

bool Eagle3Speculator::TreeRanksOnHost(const DraftInput& in, const TreeActive& t,
                                       int32_t node) const {
  // Children of a node at depth d are drafts at depth d + 1 (the root's at 0); bans need the
  // whole row.
  const int32_t depth = node < 0 ? 0 : t.builder.depth(node) + 1;
  return !compute_->RanksOnDevice() || depth < in.num_banned_positions;
}

void Eagle3Speculator::ExpandLevel(const DraftInput& in, TreeActive& t, int32_t* row,
                                   int64_t* host_row) {
  const int64_t vocab = compute_->config().layer.vocab_size;
  t.level_rows.clear();
  for (int32_t node : t.level) {
    if (host_flags_[*row]) {
      const int32_t depth = node < 0 ? 0 : t.builder.depth(node) + 1;
      const std::span<const int32_t> banned =
          depth < in.num_banned_positions ? in.banned : std::span<const int32_t>();
      t.builder.Expand(node, std::span<const float>(logits_).subspan((*host_row)++ * vocab, vocab),
                       banned);
    } else {  // ranked on the device (TopCandidates)
      const auto at = static_cast<size_t>(*row) * candidates_k_;
      t.builder.ExpandCandidates(
          node, std::span<const int32_t>(candidate_ids_).subspan(at, candidates_k_),
          std::span<const float>(candidate_logprobs_).subspan(at, candidates_k_));
    }
    t.level_rows.push_back((*row)++);
  }
}

bool Eagle3Speculator::PlanLevel(const DraftInput& in, TreeActive& t, int32_t cap) {
  std::vector<int32_t> next = t.builder.NextLevel();
  const auto room = std::min(cap, static_cast<int32_t>(t.max_region - t.region_parents.size()));
  if (static_cast<int32_t>(next.size()) > room) next.resize(std::max(room, 0));
  t.region_of_node.resize(t.builder.num_nodes(), -1);
  const std::vector<int32_t> expanded = std::move(t.level);  // the pass's, as t.level_rows
  t.level.clear();
  for (int32_t node : next) {
    // Its hidden input: the prenorm output of its parent's row in the pass just run (the
    // nodes of the next level are children of that pass's).
    const int32_t parent = t.builder.parent(node);
    const auto it = std::find(expanded.begin(), expanded.end(), parent);
    if (it == expanded.end()) continue;
    const auto index = static_cast<int32_t>(t.region_parents.size());
    t.region_of_node[node] = index;
    t.region_parents.push_back(parent < 0 ? -1 : t.region_of_node[parent]);
    Eagle3Compute::Row row;
    row.seq = static_cast<int64_t>(in.seq_id);
    row.token = t.builder.token(node);
    row.position = t.root_slot + t.builder.depth(node);
    row.slot = t.root_slot + index;
    row.tree = &t.tree;
    row.hidden = -t.level_rows[it - expanded.begin()] - 1;
    row.logits = true;
    row.block_table = in.block_table;
    rows_.push_back(row);
    t.level.push_back(node);
  }
  t.tree = TokenTree{t.root_slot, t.region_parents};
  return !t.level.empty();
}

}  // namespace specd
