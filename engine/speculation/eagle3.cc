#include "engine/speculation/eagle3.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "engine/sample/acceptance.h"

namespace specd {
namespace {

// Mixed into the request's seed for the head's draws (not the sampler's or the acceptor's).
constexpr uint64_t kEagle3SeedSalt = 0x3c6ef372fe94f82bULL;

}  // namespace

absl::StatusOr<std::unique_ptr<Eagle3Speculator>> Eagle3Speculator::Create(
    std::unique_ptr<Eagle3Head> head) {
  if (head == nullptr) return absl::InvalidArgumentError("eagle3: no head");
  return std::unique_ptr<Eagle3Speculator>(new Eagle3Speculator(std::move(head)));
}

int32_t Eagle3Speculator::cache_size(uint64_t seq_id) const {
  auto it = states_.find(seq_id);
  return it == states_.end() ? 0 : it->second->kv.size();
}

absl::Status Eagle3Speculator::OnTargetPass(std::span<const SequenceInput> batch,
                                            std::span<const float> hidden,
                                            std::span<const uint8_t> wanted) {
  const int64_t width = head_->fc_input_size(), h = head_->hidden_size();
  int64_t num_tokens = 0;
  for (const SequenceInput& in : batch) num_tokens += static_cast<int64_t>(in.tokens.size());
  if (wanted.size() != batch.size() || static_cast<int64_t>(hidden.size()) != num_tokens * width) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eagle3: the target pass captured ", hidden.size(), " values for ", num_tokens,
        " tokens of width ", width, " (", wanted.size(), " flags for ", batch.size(), " chunks)"));
  }
  int64_t row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceInput& in = batch[i];
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    if (!wanted[i] || in.seq_id < 0) {
      row += n;
      continue;
    }
    std::unique_ptr<State>& slot = states_[static_cast<uint64_t>(in.seq_id)];
    if (slot == nullptr) slot = std::make_unique<State>();
    State& s = *slot;
    // The target recomputed from start_pos: what the sequence held from there on is stale.
    size_t keep = 0;
    while (keep < s.pending_positions.size() && s.pending_positions[keep] < in.start_pos) ++keep;
    s.pending_positions.resize(keep);
    s.pending_tokens.resize(keep);
    s.pending_hidden.resize(keep * h);
    s.pending_hidden.resize((keep + n) * h);
    head_->Fuse(&hidden[row * width], n, &s.pending_hidden[keep * h]);
    for (int64_t t = 0; t < n; ++t) {
      s.pending_positions.push_back(in.start_pos + static_cast<int32_t>(t));
      s.pending_tokens.push_back(in.tokens[t]);
    }
    row += n;
  }
  return absl::OkStatus();
}

bool Eagle3Speculator::PlanCatchUp(const DraftInput& in, State& s, Active* a) {
  const auto num_tokens = static_cast<int32_t>(in.tokens.size());
  const auto common = static_cast<int32_t>(
      std::mismatch(s.kv_tokens.begin(), s.kv_tokens.end(), in.tokens.begin(), in.tokens.end())
          .first -
      s.kv_tokens.begin());
  // Position p's entry read tokens up to p + 1: valid while they are still the sequence's.
  const int32_t valid = std::max(0, std::min(s.num_target_positions, common - 1));
  s.kv.Truncate(valid);  // also the entries of last round's drafts
  int32_t last = -1;
  const int64_t h = head_->hidden_size();
  for (size_t e = 0; e < s.pending_positions.size(); ++e) {
    const int32_t p = s.pending_positions[e];
    if (p < valid || p >= num_tokens - 1 || s.pending_tokens[e] != in.tokens[p]) continue;
    Eagle3Head::Row row;
    row.token = in.tokens[p + 1];
    row.position = p;
    row.hidden = &s.pending_hidden[e * h];
    row.kv = &s.kv;
    rows_.push_back(row);
    last = p;
  }
  s.num_target_positions = std::max(valid, num_tokens - 1);
  s.kv_tokens.assign(in.tokens.begin(), in.tokens.end());
  // Draft 1 comes from position L - 2, which needs the target's hidden state there.
  if (last != num_tokens - 2 || in.num_draft_tokens <= 0) return false;
  rows_.back().logits = true;
  a->prenorm_row = static_cast<int32_t>(rows_.size()) - 1;
  a->next_position = num_tokens - 1;
  return true;
}

bool Eagle3Speculator::DrawDraft(const DraftInput& in, State& s, std::span<const float> logits,
                                 Draft& draft) {
  const auto j = static_cast<int32_t>(draft.tokens.size());
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
    std::unique_ptr<State>& slot = states_[inputs[i].seq_id];
    if (slot == nullptr) slot = std::make_unique<State>();
    if (!slot->seeded) {
      slot->rng.seed(inputs[i].seed ^ kEagle3SeedSalt);  // the same request, the same drafts
      slot->seeded = true;
    }
    Active a;
    a.input = i;
    a.state = slot.get();
    a.num_wanted = inputs[i].num_draft_tokens;
    if (PlanCatchUp(inputs[i], *slot, &a)) active_.push_back(a);
  }
  const int32_t vocab = head_->vocab_size();
  const int64_t h = head_->hidden_size();
  absl::Status status = absl::OkStatus();
  while (!rows_.empty()) {
    // Logits rows come back in row order: the k-th active sequence's is the k-th.
    for (size_t k = 0; k < active_.size(); ++k) active_[k].logits_row = static_cast<int32_t>(k);
    status = head_->Forward(rows_, &prenorm_, &logits_);
    if (!status.ok()) break;
    // The hidden states of the next step, before rows_ (which points into them) is rebuilt.
    hidden_in_.resize(active_.size() * h);
    size_t kept = 0;
    for (Active& a : active_) {
      const DraftInput& in = inputs[a.input];
      Draft& draft = (*drafts)[a.input];
      const bool drawn = DrawDraft(
          in, *a.state,
          std::span<const float>(logits_).subspan(int64_t{a.logits_row} * vocab, vocab), draft);
      if (!drawn || --a.num_wanted == 0) continue;
      std::memcpy(&hidden_in_[kept * h], &prenorm_[int64_t{a.prenorm_row} * h], sizeof(float) * h);
      active_[kept++] = a;
    }
    active_.resize(kept);
    rows_.clear();
    for (size_t k = 0; k < active_.size(); ++k) {
      Active& a = active_[k];
      Eagle3Head::Row row;
      row.token = (*drafts)[a.input].tokens.back();
      row.position = a.next_position++;
      row.hidden = &hidden_in_[k * h];
      row.kv = &a.state->kv;
      row.logits = true;
      a.prenorm_row = static_cast<int32_t>(k);
      rows_.push_back(row);
    }
  }
  // The target hidden states are in the cache now (or were stale): drop them.
  for (const DraftInput& in : inputs) {
    State& s = *states_[in.seq_id];
    s.pending_positions.clear();
    s.pending_tokens.clear();
    s.pending_hidden.clear();
  }
  return status;
}

}  // namespace specd
