// DraftModelSpeculator's token trees (draft_model.h, ProposeTrees).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/base/status.h"
#include "engine/speculation/draft_model.h"
#include "engine/speculation/spec_config.h"

namespace specd {

absl::Status DraftModelSpeculator::ProposeTrees(std::span<const DraftInput> inputs,
                                                std::vector<Draft>* drafts) {
  tree_active_.clear();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const DraftInput& in = inputs[i];
    if (!in.wants_tree() || in.num_draft_tokens <= 0 || in.params == nullptr ||
        in.history == nullptr) {
      continue;
    }
    std::unique_ptr<State>& state = states_[in.seq_id];
    if (state == nullptr) state = std::make_unique<State>(runner_->block_size());
    TreeActive t;
    t.active.input = i;
    // Slots: the root's (the context's last token), then every node run: at most top_k per
    // level below the last.
    const int32_t slots = 1 + (in.tree_depth - 1) * in.tree_top_k;
    if (!Prepare(in, *state, slots, &t.active)) continue;
    t.builder.Reset(in.tree_depth, in.tree_top_k, in.num_draft_tokens);
    // Controlled acceptance, as AppendGreedyDraft does for chains: greedy requests only.
    if (replay_ != nullptr && in.params->greedy()) t.builder.set_replay(replay_.get(), in.tokens);
    tree_active_.push_back(std::move(t));
  }
  if (tree_active_.empty()) return absl::OkStatus();
  const auto vocab = static_cast<size_t>(runner_->config().vocab_size);
  auto fail = [&](const absl::Status& s) {
    for (const TreeActive& t : tree_active_) Release(inputs[t.active.input].seq_id);
    tree_active_.clear();
    return absl::InternalError(absl::StrCat("draft model forward failed: ", s.message()));
  };
  auto banned_at = [&](const DraftInput& in, int32_t position) {
    return position < in.num_banned_positions ? in.banned : std::span<const int32_t>();
  };
  // A pass's rows ranked on the draft's device (k ids and log-probabilities per row, not a row
  // of the vocabulary) unless a row's children need bans, which take the whole row on the host.
  int32_t max_top_k = 1;
  for (const TreeActive& t : tree_active_) {
    max_top_k = std::max(max_top_k, inputs[t.active.input].tree_top_k);
  }
  max_top_k = std::min(max_top_k, kMaxTreeTopK);
  bool on_device = false;
  auto run = [&](bool any_banned) -> absl::Status {
    on_device = runner_->RanksCandidatesOnDevice() && !any_banned;
    if (on_device) return runner_->ForwardCandidates(batch_, max_top_k, &cand_ids_, &cand_lps_);
    return runner_->Forward(batch_, &logits_);
  };
  auto expand = [&](TreeActive& t, int32_t node, size_t row, std::span<const int32_t> banned) {
    if (on_device) {
      const size_t k = static_cast<size_t>(max_top_k);
      t.builder.ExpandCandidates(node, std::span<const int32_t>(cand_ids_).subspan(row * k, k),
                                 std::span<const float>(cand_lps_).subspan(row * k, k));
    } else {
      t.builder.Expand(node, std::span<const float>(logits_).subspan(row * vocab, vocab), banned);
    }
  };
  // Catch-up chunks (causal, within the token budget); each finished one's last row gives the
  // root's children.
  for (bool left = true; left;) {
    batch_.clear();
    size_t budget = static_cast<size_t>(max_tokens_per_forward_);
    bool any_banned = false;
    for (TreeActive& t : tree_active_) {
      Active& a = t.active;
      a.num_running = std::min(a.pending.size() - a.offset, budget);
      budget -= a.num_running;
      if (a.num_running == 0) continue;
      SequenceInput s;
      s.tokens = std::span<const int32_t>(a.pending).subspan(a.offset, a.num_running);
      s.start_pos = static_cast<int32_t>(a.state->kv_tokens.size());
      s.block_table = a.state->blocks.ids();
      batch_.push_back(s);
      any_banned = any_banned || !banned_at(inputs[a.input], 0).empty();
    }
    if (absl::Status s = run(any_banned); !s.ok()) return fail(s);
    left = false;
    size_t row = 0;
    for (TreeActive& t : tree_active_) {
      Active& a = t.active;
      if (a.num_running == 0) {
        left |= a.offset < a.pending.size();
        continue;
      }
      const auto ran = a.pending.begin() + static_cast<std::ptrdiff_t>(a.offset);
      a.state->kv_tokens.insert(a.state->kv_tokens.end(), ran,
                                ran + static_cast<std::ptrdiff_t>(a.num_running));
      a.offset += a.num_running;
      const size_t r = row++;
      if (a.offset < a.pending.size()) {
        left = true;
        continue;
      }
      const DraftInput& in = inputs[a.input];
      expand(t, -1, r, banned_at(in, 0));
      t.region_parents.assign(1, -1);  // the root
    }
  }
  // One pass per level: the nodes to expand, as a tree chunk after the ones run before.
  for (;;) {
    batch_.clear();
    bool any_banned = false;
    for (TreeActive& t : tree_active_) {
      t.level = t.builder.NextLevel();
      const int32_t room = t.active.num_wanted - static_cast<int32_t>(t.region_parents.size());
      if (static_cast<int32_t>(t.level.size()) > room) t.level.resize(std::max(room, 0));
      t.region_of_node.resize(t.builder.num_nodes(), -1);
      t.tokens.clear();
      const size_t first = t.region_parents.size();
      for (int32_t node : t.level) {
        const int32_t parent = t.builder.parent(node);
        t.region_of_node[node] = static_cast<int32_t>(t.region_parents.size());
        t.region_parents.push_back(parent < 0 ? 0 : t.region_of_node[parent]);
        t.tokens.push_back(t.builder.token(node));
        any_banned =
            any_banned || !banned_at(inputs[t.active.input], t.builder.depth(node) + 1).empty();
      }
      const int32_t root = static_cast<int32_t>(t.active.state->kv_tokens.size()) - 1;
      t.tree = TokenTree{root, t.region_parents};
      if (t.tokens.empty()) continue;
      SequenceInput s;
      s.tokens = t.tokens;
      s.start_pos = root + static_cast<int32_t>(first);
      s.block_table = t.active.state->blocks.ids();
      s.all_logits = true;
      s.tree = &t.tree;
      batch_.push_back(s);
    }
    if (batch_.empty()) break;
    if (absl::Status s = run(any_banned); !s.ok()) return fail(s);
    size_t row = 0;
    for (TreeActive& t : tree_active_) {
      const DraftInput& in = inputs[t.active.input];
      for (int32_t node : t.level) expand(t, node, row++, banned_at(in, t.builder.depth(node) + 1));
    }
  }
  for (TreeActive& t : tree_active_) {
    Draft& d = (*drafts)[t.active.input];
    t.builder.Finish(&d.tokens, &d.parents);
    if (d.tokens.empty()) d.parents.clear();
    // The nodes' KV is not kept: the next round catches up on what was accepted.
    t.active.state->num_context = -1;
  }
  tree_active_.clear();
  return absl::OkStatus();
}

}  // namespace specd
