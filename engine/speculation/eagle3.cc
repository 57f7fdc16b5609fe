#include "engine/speculation/eagle3.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
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
  s.pending_positions.clear();
  s.pending_tokens.clear();
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
    const auto n = static_cast<int32_t>(in.tokens.size());
    const int32_t first_row = row;
    row += n;
    if (!wanted[i] || in.seq_id < 0) continue;
    const auto seq = static_cast<uint64_t>(in.seq_id);
    State& s = StateOf(seq);
    // The target recomputed from start_pos: what the sequence held from there on is stale.
    const int32_t start = in.start_pos;
    size_t keep = 0;
    while (keep < s.pending_positions.size() && s.pending_positions[keep] < start) ++keep;
    s.pending_positions.resize(keep);
    s.pending_tokens.resize(keep);
    s.num_target_positions = std::min(s.num_target_positions, start);
    s.kv_tokens.resize(start, -1);
    s.kv_tokens.insert(s.kv_tokens.end(), in.tokens.begin(), in.tokens.end());
    if (keep > 0 && s.pending_positions.back() != start - 1) {  // not contiguous: drop them
      s.pending_positions.clear();
      s.pending_tokens.clear();
    }
    if (s.region < 0) {
      if (free_regions_.empty()) continue;  // more sequences than regions: this one drafts less
      s.region = free_regions_.back();
      free_regions_.pop_back();
    }
    const auto old = static_cast<int32_t>(s.pending_positions.size());
    const int32_t total = old + n;
    const int32_t evict = std::max(0, total - kEagle3PoolWindow);
    bool truncated = false;
    for (int32_t e = 0; e < evict; ++e) {  // entry e of (old pending, then this chunk's rows)
      const int32_t p = e < old ? s.pending_positions[e] : start + (e - old);
      Eagle3Compute::Row r;
      r.seq = static_cast<int64_t>(seq);
      r.token = s.kv_tokens[p + 1];  // known: a later row of the window holds position p + 1
      r.position = p;
      r.block_table = in.block_table;
      if (e < old) {
        r.hidden = PoolRow(s, p);
      } else {
        r.hidden = compute_->scratch_row(scratch);
        fuse_from_.push_back(first_row + (e - old));
        fuse_to_.push_back(r.hidden);
        ++scratch;
      }
      if (!truncated) {
        compute_->Truncate(r.seq, p);
        truncated = true;
      }
      rows_.push_back(r);
      s.num_target_positions = p + 1;
    }
    // The window: the last kEagle3PoolWindow entries.
    const auto dropped = static_cast<std::ptrdiff_t>(std::min(evict, old));
    s.pending_positions.erase(s.pending_positions.begin(), s.pending_positions.begin() + dropped);
    s.pending_tokens.erase(s.pending_tokens.begin(), s.pending_tokens.begin() + dropped);
    for (int32_t t = std::max(0, evict - old); t < n; ++t) {
      s.pending_positions.push_back(start + t);
      s.pending_tokens.push_back(in.tokens[t]);
      keep_from_.push_back(first_row + t);
      keep_to_.push_back(PoolRow(s, start + t));
    }
  }
  if (!rows_.empty()) {
    SPECD_RETURN_IF_ERROR(compute_->Fuse(fuse_from_, fuse_to_));
    host_flags_.clear();
    SPECD_RETURN_IF_ERROR(compute_->Forward(rows_, host_flags_, &ids_, &logits_));
  }
  return compute_->Fuse(keep_from_, keep_to_);
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
  int32_t last = -1;
  for (size_t e = 0; e < s.pending_positions.size(); ++e) {
    const int32_t p = s.pending_positions[e];
    if (p < valid || p >= num_tokens - 1 || s.pending_tokens[e] != in.tokens[p]) continue;
    Eagle3Compute::Row row;
    row.seq = static_cast<int64_t>(in.seq_id);
    row.token = in.tokens[p + 1];
    row.position = p;
    row.hidden = PoolRow(s, p);
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
  for (size_t i = 0; i < inputs.size(); ++i) {
    State& s = StateOf(inputs[i].seq_id);
    if (!s.seeded) {
      s.rng.seed(inputs[i].seed ^ kEagle3SeedSalt);  // the same request, the same drafts
      s.seeded = true;
    }
    Active a;
    a.input = i;
    a.state = &s;
    // A tree asked for: a chain of its depth (the head grows no trees yet).
    a.num_wanted = inputs[i].wants_tree()
                       ? std::min(inputs[i].num_draft_tokens, inputs[i].tree_depth)
                       : inputs[i].num_draft_tokens;
    if (PlanCatchUp(inputs[i], s, &a)) active_.push_back(a);
  }
  const int64_t vocab = compute_->config().layer.vocab_size;
  absl::Status status = absl::OkStatus();
  while (!rows_.empty()) {  // the catch-up runs even when no sequence drafts (it fills caches)
    // Logits rows come back in row order: the k-th active sequence's is the k-th.
    host_flags_.clear();
    for (const Active& a : active_) {
      const DraftInput& in = inputs[a.input];
      host_flags_.push_back(
          DrawsOnHost(in, static_cast<int32_t>((*drafts)[a.input].tokens.size())) ? 1 : 0);
    }
    status = compute_->Forward(rows_, host_flags_, &ids_, &logits_);
    if (!status.ok()) break;
    size_t kept = 0;
    int64_t host_row = 0;
    for (size_t k = 0; k < active_.size(); ++k) {
      Active a = active_[k];
      const DraftInput& in = inputs[a.input];
      std::span<const float> row;
      if (host_flags_[k]) row = std::span<const float>(logits_).subspan(host_row++ * vocab, vocab);
      const bool drawn = DrawDraft(in, *a.state, ids_[k], row, (*drafts)[a.input]);
      if (!drawn || --a.num_wanted == 0) continue;
      a.prenorm_row = -static_cast<int32_t>(k) - 1;  // the next pass reads its logits row's prenorm
      active_[kept++] = a;
    }
    active_.resize(kept);
    rows_.clear();
    for (size_t k = 0; k < active_.size(); ++k) {
      Active& a = active_[k];
      Eagle3Compute::Row row;
      row.seq = static_cast<int64_t>(inputs[a.input].seq_id);
      row.token = (*drafts)[a.input].tokens.back();
      row.position = a.next_position++;
      row.hidden = a.prenorm_row;
      row.logits = true;
      row.block_table = inputs[a.input].block_table;
      rows_.push_back(row);
    }
  }
  // The target hidden states are in the cache now (or were stale): drop them.
  for (const DraftInput& in : inputs) FreeRegion(*states_[in.seq_id]);
  return status;
}

}  // namespace specd
