#include "engine/speculation/eagle3.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/sample/acceptance.h"

namespace specd {
namespace {

// Mixed into the request's seed for the head's draws (not the sampler's or the acceptor's).
constexpr uint64_t kEagle3SeedSalt = 0x3c6ef372fe94f82bULL;

}  // namespace

absl::StatusOr<std::unique_ptr<Eagle3Speculator>> Eagle3Speculator::Create(Eagle3Compute* compute) {
  if (compute == nullptr) return absl::InvalidArgumentError("eagle3: no head");
  return std::unique_ptr<Eagle3Speculator>(new Eagle3Speculator(compute));
}

Eagle3Speculator::Eagle3Speculator(Eagle3Compute* compute) : compute_(compute) {
  for (int32_t r = compute_->num_pool_regions() - 1; r >= 0; --r) free_regions_.push_back(r);
}

Eagle3Speculator::State& Eagle3Speculator::StateOf(uint64_t seq_id) {
  std::unique_ptr<State>& slot = states_[seq_id];
  if (slot == nullptr) slot = std::make_unique<State>();
  return *slot;
}

int32_t Eagle3Speculator::PoolRow(const State& s, int32_t position) const {
  return s.region * kEagle3PoolWindow + position % kEagle3PoolWindow;
}

void Eagle3Speculator::FreeRegion(State& s) {
  s.pending.clear();
  s.tree_start = -1;
  if (s.region >= 0) free_regions_.push_back(s.region);
  s.region = -1;
}

void Eagle3Speculator::Release(uint64_t seq_id) {
  auto it = states_.find(seq_id);
  if (it == states_.end()) return;
  FreeRegion(*it->second);
  states_.erase(it);
  compute_->Release(static_cast<int64_t>(seq_id));
}

absl::Status Eagle3Speculator::OnTargetPass(std::span<const SequenceInput> batch,
                                            std::span<const uint8_t> wanted) {
  if (wanted.size() != batch.size()) {
    return absl::InvalidArgumentError(absl::StrCat("eagle3: ", wanted.size(), " flags for ",
                                                   batch.size(), " chunks of the target pass"));
  }
  // Rows older than a sequence's window run at once (rows_), from their pool row or, for rows
  // of this pass, from a scratch row; the window's rows of this pass are fused into their ring
  // rows after that pass (which may still read the rows they replace).
  rows_.clear();
  fuse_from_.clear();
  fuse_to_.clear();
  keep_from_.clear();
  keep_to_.clear();
  int32_t row = 0, scratch = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceInput& in = batch[i];
    const int32_t first_row = row;
    row += static_cast<int32_t>(in.tokens.size());
    if (!wanted[i] || in.seq_id < 0) continue;
    TakeChunk(in, first_row, StateOf(static_cast<uint64_t>(in.seq_id)), &scratch);
  }
  if (!rows_.empty()) {
    SPECD_RETURN_IF_ERROR(compute_->Fuse(fuse_from_, fuse_to_));
    host_flags_.clear();
    SPECD_RETURN_IF_ERROR(compute_->Forward(rows_, host_flags_, &ids_, &logits_));
  }
  return compute_->Fuse(keep_from_, keep_to_);
}

void Eagle3Speculator::TakeChunk(const SequenceInput& in, int32_t first_row, State& s,
                                 int32_t* scratch) {
  const auto n = static_cast<int32_t>(in.tokens.size());
  const auto seq = static_cast<int64_t>(in.seq_id);
  // The target recomputed from start_pos: what the sequence held from there on is stale, and
  // so is a tree whose path no Propose has walked (its nodes' rows are about to be reused).
  const int32_t start = in.start_pos;
  s.tree_start = -1;
  size_t keep = 0;
  while (keep < s.pending.size() && s.pending[keep].position < start) ++keep;
  s.pending.resize(keep);
  s.num_target_positions = std::min(s.num_target_positions, start);
  s.kv_tokens.resize(start, -1);
  // A tree chunk (the verification convention: the tree starts at the chunk, the root first):
  // only the root's token is the sequence's; each node's row waits for the path. A malformed
  // one, or one wider than the window, is not kept.
  const TokenTree* tree = in.tree;
  if (tree != nullptr && (tree->start != start || tree->parents.size() != in.tokens.size() ||
                          n > kEagle3PoolWindow || n == 0)) {
    s.pending.clear();
    return;
  }
  s.kv_tokens.insert(s.kv_tokens.end(), in.tokens.begin(),
                     tree != nullptr ? in.tokens.begin() + 1 : in.tokens.end());
  if (keep > 0 && s.pending.back().position != start - 1) s.pending.clear();  // not contiguous
  if (s.region < 0) {
    if (free_regions_.empty()) return;  // more sequences than regions: this one drafts less
    s.region = free_regions_.back();
    free_regions_.pop_back();
  }
  const auto old = static_cast<int32_t>(s.pending.size());
  const int32_t evict = std::max(0, old + n - kEagle3PoolWindow);  // a tree's: old ones only
  bool truncated = false;
  for (int32_t e = 0; e < evict; ++e) {  // entry e of (old pending, then this chunk's rows)
    const int32_t p = e < old ? s.pending[e].position : start + (e - old);
    Eagle3Compute::Row r;
    r.seq = seq;
    r.token = s.kv_tokens[p + 1];  // known: a later row of the window holds position p + 1
    r.position = p;
    r.block_table = in.block_table;
    if (e < old) {
      r.hidden = s.pending[e].pool_row;
    } else {
      r.hidden = compute_->scratch_row((*scratch)++);
      fuse_from_.push_back(first_row + (e - old));
      fuse_to_.push_back(r.hidden);
    }
    if (!truncated) {
      compute_->Truncate(seq, p);
      truncated = true;
    }
    rows_.push_back(r);
    s.num_target_positions = p + 1;
  }
  // The window: the last kEagle3PoolWindow entries (a tree's nodes in the ring rows of their
  // slots).
  s.pending.erase(s.pending.begin(), s.pending.begin() + std::min(evict, old));
  for (int32_t t = std::max(0, evict - old); t < n; ++t) {
    keep_from_.push_back(first_row + t);
    keep_to_.push_back(PoolRow(s, start + t));
    if (tree == nullptr || t == 0) {
      s.pending.push_back(Pending{start + t, in.tokens[t], PoolRow(s, start + t)});
    }
  }
  if (tree != nullptr) {
    s.tree_start = start;
    s.tree_tokens.assign(in.tokens.begin(), in.tokens.end());
    s.tree_parents.assign(tree->parents.begin(), tree->parents.end());
  }
}

bool Eagle3Speculator::PlanCatchUp(const DraftInput& in, State& s, Active* a) {
  const auto num_tokens = static_cast<int32_t>(in.tokens.size());
  int32_t common = 0;
  const auto known = static_cast<int32_t>(std::min(s.kv_tokens.size(), in.tokens.size()));
  while (common < known &&
         (s.kv_tokens[common] == -1 || s.kv_tokens[common] == in.tokens[common])) {
    ++common;
  }
  // Position p's entry read tokens up to p + 1: valid while they are still the sequence's.
  const int32_t valid = std::max(0, std::min(s.num_target_positions, common - 1));
  compute_->Truncate(static_cast<int64_t>(in.seq_id), valid);  // also last round's drafted entries
  ResolveTree(in, s);
  int32_t last = -1;
  for (const Pending& e : s.pending) {
    const int32_t p = e.position;
    if (p < valid || p >= num_tokens - 1 || e.token != in.tokens[p]) continue;
    Eagle3Compute::Row row;
    row.seq = static_cast<int64_t>(in.seq_id);
    row.token = in.tokens[p + 1];
    row.position = p;
    row.hidden = e.pool_row;
    row.block_table = in.block_table;
    rows_.push_back(row);
    last = p;
  }
  s.num_target_positions = std::max(valid, num_tokens - 1);
  s.kv_tokens.assign(in.tokens.begin(), in.tokens.end());
  // Draft 1 comes from position L - 2, which needs the target's hidden state there.
  if (last != num_tokens - 2 || in.num_draft_tokens <= 0) return false;
  rows_.back().logits = true;
  a->next_position = num_tokens - 1;
  return true;
}

bool Eagle3Speculator::DrawsOnHost(const DraftInput& in, int32_t j) {
  return !in.params->greedy() || in.params->has_penalties() ||
         (j < in.num_banned_positions && !in.banned.empty());
}

bool Eagle3Speculator::DrawDraft(const DraftInput& in, State& s, int32_t argmax,
                                 std::span<const float> logits, Draft& draft) {
  const auto j = static_cast<int32_t>(draft.tokens.size());
  if (logits.empty()) {  // greedy, nothing to apply: the compute's argmax
    const int32_t token =
        replay_ != nullptr ? replay_->Draft(in.tokens, draft.tokens, argmax) : argmax;
    draft.tokens.push_back(token);
    return true;
  }
  std::span<const int32_t> banned =
      j < in.num_banned_positions ? in.banned : std::span<const int32_t>();
  probs_.resize(logits.size());
  ProcessedProbs(*in.params, logits, *in.history, draft.tokens, banned, probs_);
  if (in.params->greedy()) {  // a one-hot row at the argmax (lowest id on ties)
    auto token =
        static_cast<int32_t>(std::max_element(probs_.begin(), probs_.end()) - probs_.begin());
    if (replay_ != nullptr) token = replay_->Draft(in.tokens, draft.tokens, token);
    draft.tokens.push_back(token);
    return true;
  }
  // The head proposes only its draft vocabulary: a request that bans or cuts all of it (stop ids,
  // min_tokens, top-k / top-p over the rest) leaves no distribution to draw from; then no draft
  // (a q row of zeros would make verification accept what q never proposed).
  double mass = 0;
  for (float p : probs_) mass += p;
  if (!(mass > 0) || !std::isfinite(mass)) return false;
  draft.tokens.push_back(DrawFromProbs(probs_, s.rng));
  draft.probs.insert(draft.probs.end(), probs_.begin(), probs_.end());
  return true;
}

absl::Status Eagle3Speculator::Propose(std::span<const DraftInput> inputs,
                                       std::vector<Draft>* drafts) {
  drafts->resize(inputs.size());
  for (Draft& d : *drafts) d.Reset();
  active_.clear();
  rows_.clear();
  trees_.clear();
  trees_.reserve(inputs.size());  // rows point into them: no reallocation this round
  for (size_t i = 0; i < inputs.size(); ++i) {
    const DraftInput& in = inputs[i];
    State& s = StateOf(in.seq_id);
    if (!s.seeded) {
      s.rng.seed(in.seed ^ kEagle3SeedSalt);  // the same request, the same drafts
      s.seeded = true;
    }
    Active a;
    a.input = i;
    a.state = &s;
    // A tree asked for where the compute runs none: a chain of its depth.
    const bool tree = in.wants_tree() && compute_->SupportsTrees();
    a.num_wanted = in.wants_tree() && !tree ? std::min(in.num_draft_tokens, in.tree_depth)
                                            : in.num_draft_tokens;
    if (!PlanCatchUp(in, s, &a)) continue;
    if (tree) StartTree(in, &a);
    active_.push_back(a);
  }
  PlanDeviceDraws(inputs);
  absl::Status status = RunRound(inputs, drafts);
  while (status.ok() && !rows_.empty()) {  // the catch-up runs even when no sequence drafts
    // Logits rows come back in row order: each active sequence's (a chain's one, a tree level's
    // nodes) in turn.
    host_flags_.clear();
    int32_t top_k = 0;  // candidates ranked on the device: the most any tree level takes
    for (const Active& a : active_) {
      if (a.tree >= 0) {
        const DraftInput& in = inputs[a.input];
        for (int32_t node : trees_[a.tree].level) {
          const bool host = TreeRanksOnHost(in, trees_[a.tree], node);
          host_flags_.push_back(host ? 1 : 0);
          if (!host) top_k = std::max(top_k, std::max(in.tree_top_k, 1));
        }
      } else {
        const DraftInput& in = inputs[a.input];
        const bool host = DrawsOnHost(in, static_cast<int32_t>((*drafts)[a.input].tokens.size()));
        // Rows drawn on the device (DrawRows) need no logits on the host.
        host_flags_.push_back(host && slot_base_[a.input] < 0 ? 1 : 0);
      }
    }
    status = compute_->Forward(rows_, host_flags_, &ids_, &logits_);
    if (!status.ok()) break;
    status = DrawOnDevice(inputs, *drafts);
    if (!status.ok()) break;
    candidates_k_ = top_k;
    candidate_ids_.clear();
    candidate_logprobs_.clear();
    if (top_k > 0) {
      status = compute_->TopCandidates(top_k, &candidate_ids_, &candidate_logprobs_);
      if (!status.ok()) break;
    }
    TakeDrafts(inputs, drafts);
    status = RunChains(inputs, drafts);
    if (!status.ok()) break;
    PlanNextRows(inputs, *drafts);
  }
  for (size_t i = 0; i < inputs.size() && status.ok(); ++i) {
    Draft& d = (*drafts)[i];
    if (slot_base_[i] >= 0 && !d.tokens.empty() && !inputs[i].params->greedy()) {
      d.device_probs = compute_->draw_slot(slot_base_[i]);
    }
  }
  for (TreeActive& t : trees_) {
    Draft& d = (*drafts)[t.input];
    t.builder.Finish(&d.tokens, &d.parents);
    if (d.tokens.empty()) d.parents.clear();
  }
  // The target hidden states are in the cache now (or were stale): drop them.
  for (const DraftInput& in : inputs) FreeRegion(*states_[in.seq_id]);
  return status;
}

void Eagle3Speculator::TakeDrafts(std::span<const DraftInput> inputs, std::vector<Draft>* drafts) {
  const int64_t vocab = compute_->config().layer.vocab_size;
  size_t kept = 0;
  int32_t row = 0;  // the pass's logits row
  int64_t host_row = 0;
  for (size_t k = 0; k < active_.size(); ++k) {
    Active a = active_[k];
    const DraftInput& in = inputs[a.input];
    if (a.tree >= 0) {
      ExpandLevel(in, trees_[a.tree], &row, &host_row);
      active_[kept++] = a;
      continue;
    }
    std::span<const float> logits;
    if (host_flags_[row]) {
      logits = std::span<const float>(logits_).subspan(host_row++ * vocab, vocab);
    }
    bool drawn;
    if (const int32_t token = drawn_[row]; token != kNotDrawn) {  // drawn on the device
      Draft& d = (*drafts)[a.input];
      drawn = token >= 0;  // -1: no mass left
      if (drawn) {
        d.tokens.push_back(replay_ != nullptr && in.params->greedy()
                               ? replay_->Draft(in.tokens, d.tokens, token)
                               : token);
      }
    } else {
      drawn = DrawDraft(in, *a.state, ids_[row], logits, (*drafts)[a.input]);
    }
    a.prenorm_row = -row - 1;  // the next pass reads its logits row's prenorm
    ++row;
    if (!drawn || --a.num_wanted == 0) continue;
    active_[kept++] = a;
  }
  active_.resize(kept);
}

void Eagle3Speculator::PlanNextRows(std::span<const DraftInput> inputs,
                                    const std::vector<Draft>& drafts) {
  rows_.clear();
  // The pass draws from every chain's row and every tree level's nodes: trees share what the
  // compute takes beyond the chains' rows.
  int64_t num_trees = 0;
  for (const Active& a : active_) num_trees += a.tree >= 0 ? 1 : 0;
  const int64_t chains = static_cast<int64_t>(active_.size()) - num_trees;
  const auto level_cap = static_cast<int32_t>(std::clamp<int64_t>(
      num_trees > 0 ? (compute_->max_logit_rows() - chains) / num_trees : 1, 1, INT32_MAX));
  size_t kept = 0;
  for (size_t k = 0; k < active_.size(); ++k) {
    Active& a = active_[k];
    const DraftInput& in = inputs[a.input];
    if (a.tree >= 0) {
      if (PlanLevel(in, trees_[a.tree], level_cap)) active_[kept++] = a;
      continue;
    }
    Eagle3Compute::Row row;
    row.seq = static_cast<int64_t>(in.seq_id);
    row.token = drafts[a.input].tokens.back();
    row.position = a.next_position++;
    row.hidden = a.prenorm_row;
    row.logits = true;
    row.block_table = in.block_table;
    rows_.push_back(row);
    active_[kept++] = a;
  }
  active_.resize(kept);
}

void Eagle3Speculator::PlanDeviceDraws(std::span<const DraftInput> inputs) {
  slot_base_.assign(inputs.size(), -1);
  slot_stride_ = 0;
  if (!compute_->DrawsOnDevice()) return;
  // Every such input gets the same number of slots, so that the compute's graphs find draw d of
  // the round's i-th sequence at slot i * stride + d.
  int32_t num_seqs = 0;
  for (const Active& a : active_) {
    const DraftInput& in = inputs[a.input];
    if (a.tree >= 0 || (in.params->greedy() && !in.params->has_penalties() &&
                        (in.num_banned_positions == 0 || in.banned.empty()))) {
      continue;  // trees rank their candidates; plain greedy chains take the argmax
    }
    slot_base_[a.input] = num_seqs++;
    slot_stride_ = std::max(slot_stride_, a.num_wanted);
  }
  if (num_seqs == 0) return;
  for (int32_t& base : slot_base_) {
    if (base >= 0) base *= slot_stride_;
  }
  if (absl::Status s = compute_->ReserveDrawSlots(num_seqs, slot_stride_); !s.ok()) {
    SPECD_LOG_WARN("eagle3: {}; drawing this round on the host", s.ToString());
    slot_base_.assign(inputs.size(), -1);
  }
}

bool Eagle3Speculator::PlanGraphDraws(std::span<const DraftInput> inputs,
                                      const std::vector<Draft>& drafts) {
  graph_rows_.clear();
  if (active_.empty()) return false;
  const size_t first = active_[0].input;
  const auto j = static_cast<int32_t>(drafts[first].tokens.size());
  for (size_t i = 0; i < active_.size(); ++i) {
    const Active& a = active_[i];
    const DraftInput& in = inputs[a.input];
    // Sampled chains with device slots, i * stride apart, each at the same draft, drawing from
    // the processed distribution alone (no penalties, no bans from here on).
    if (a.tree >= 0 || slot_base_[a.input] < 0 ||
        slot_base_[a.input] != slot_base_[first] + static_cast<int32_t>(i) * slot_stride_ ||
        static_cast<int32_t>(drafts[a.input].tokens.size()) != j || in.params->greedy() ||
        in.params->has_penalties() || (j < in.num_banned_positions && !in.banned.empty())) {
      graph_rows_.clear();
      return false;
    }
    SampleRow r;
    r.params = in.params;
    r.history = in.history;
    r.pending = drafts[a.input].tokens;
    r.seed = in.seed;
    r.num_generated = in.num_generated + j;
    graph_rows_.push_back(r);
  }
  graph_draws_.rows = graph_rows_;
  graph_draws_.first_slot = slot_base_[first] + j;
  graph_draws_.slot_stride = slot_stride_;
  return true;
}

absl::Status Eagle3Speculator::DrawOnDevice(std::span<const DraftInput> inputs,
                                            const std::vector<Draft>& drafts) {
  draw_logits_rows_.clear();
  draw_rows_.clear();
  draw_slots_.clear();
  int32_t row = 0;  // the pass's logits row
  for (const Active& a : active_) {
    if (a.tree >= 0) {
      row += static_cast<int32_t>(trees_[a.tree].level.size());
      continue;
    }
    const DraftInput& in = inputs[a.input];
    const auto j = static_cast<int32_t>(drafts[a.input].tokens.size());
    if (slot_base_[a.input] >= 0 && DrawsOnHost(in, j)) {
      SampleRow r;
      r.params = in.params;
      r.history = in.history;
      r.pending = drafts[a.input].tokens;
      if (j < in.num_banned_positions) r.banned = in.banned;
      r.seed = in.seed;
      r.num_generated = in.num_generated + j;
      draw_logits_rows_.push_back(row);
      draw_rows_.push_back(r);
      draw_slots_.push_back(slot_base_[a.input] + j);
    }
    ++row;
  }
  drawn_.assign(static_cast<size_t>(row), kNotDrawn);
  if (draw_rows_.empty()) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(
      compute_->DrawRows(draw_logits_rows_, draw_rows_, draw_slots_, &ids_drawn_));
  for (size_t i = 0; i < ids_drawn_.size(); ++i) drawn_[draw_logits_rows_[i]] = ids_drawn_[i];
  return absl::OkStatus();
}

absl::Status Eagle3Speculator::RunRound(std::span<const DraftInput> inputs,
                                        std::vector<Draft>* drafts) {
  if (active_.empty() || rows_.empty() || !rows_.back().logits) return absl::OkStatus();
  int32_t wanted = INT32_MAX;
  bool greedy = true;
  for (const Active& a : active_) {
    const DraftInput& in = inputs[a.input];
    // Greedy chains whose every draft is the head's argmax, or sampled ones (below).
    if (a.tree >= 0 || slot_base_[a.input] >= 0 || DrawsOnHost(in, 0)) greedy = false;
    wanted = std::min(wanted, a.num_wanted);
  }
  if (!greedy && !PlanGraphDraws(inputs, *drafts)) return absl::OkStatus();
  // Every sequence of the catch-up drafts (one logits row each); the compute checks the rest.
  size_t logits_rows = 0;
  for (const Eagle3Compute::Row& r : rows_) logits_rows += r.logits ? 1 : 0;
  if (logits_rows != active_.size() || wanted < 2) return absl::OkStatus();
  bool ran = false;
  SPECD_RETURN_IF_ERROR(
      compute_->DraftRound(rows_, wanted - 1, greedy ? nullptr : &graph_draws_, &ids_, &ran));
  if (!ran) return absl::OkStatus();
  TakeChainIds(inputs, drafts, wanted, wanted - 1);  // the chain's rows after the catch-up's
  PlanNextRows(inputs, *drafts);
  return absl::OkStatus();
}

absl::Status Eagle3Speculator::RunChains(std::span<const DraftInput> inputs,
                                         std::vector<Draft>* drafts) {
  if (!compute_->ChainsOnDevice() || active_.empty()) return absl::OkStatus();
  int32_t steps = INT32_MAX;
  bool greedy = true;
  for (const Active& a : active_) {
    const DraftInput& in = inputs[a.input];
    const auto j = static_cast<int32_t>((*drafts)[a.input].tokens.size());
    // Chains whose every remaining draft is the head's argmax, or sampled ones (below).
    if (a.tree >= 0 || DrawsOnHost(in, j)) greedy = false;
    steps = std::min(steps, a.num_wanted);
  }
  if (steps < 1 || (!greedy && !PlanGraphDraws(inputs, *drafts))) return absl::OkStatus();
  rows_.clear();
  for (Active& a : active_) {
    const DraftInput& in = inputs[a.input];
    Eagle3Compute::Row row;
    row.seq = static_cast<int64_t>(in.seq_id);
    row.token = (*drafts)[a.input].tokens.back();
    row.position = a.next_position;
    row.hidden = a.prenorm_row;
    row.logits = true;
    row.block_table = in.block_table;
    rows_.push_back(row);
  }
  bool ran = false;
  SPECD_RETURN_IF_ERROR(
      compute_->DraftChain(rows_, steps, greedy ? nullptr : &graph_draws_, &ids_, &ran));
  if (!ran) return absl::OkStatus();  // a step at a time: the caller plans the next rows
  TakeChainIds(inputs, drafts, steps, steps);
  rows_.clear();
  return absl::OkStatus();
}

void Eagle3Speculator::TakeChainIds(std::span<const DraftInput> inputs, std::vector<Draft>* drafts,
                                    int32_t draws_each, int32_t advance) {
  const size_t n = active_.size();
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    Active a = active_[i];
    const DraftInput& in = inputs[a.input];
    Draft& d = (*drafts)[a.input];
    bool more = true;
    for (int32_t s = 0; s < draws_each && more; ++s) {
      const int32_t id = ids_[s * n + i];
      if (in.params->greedy()) {
        DrawDraft(in, *a.state, id, {}, d);  // the argmax, or the replay's token
      } else if (id >= 0) {
        d.tokens.push_back(id);  // drawn on the device, its q in its slot
      } else {
        more = false;  // no mass left: the chain ends here
      }
    }
    a.num_wanted -= draws_each;
    a.next_position += advance;
    a.prenorm_row = -static_cast<int32_t>(i) - 1;  // its row of the last step
    if (more && a.num_wanted > 0) active_[kept++] = a;
  }
  active_.resize(kept);
}

}  // namespace specd
