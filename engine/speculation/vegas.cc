#include "engine/speculation/vegas.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "engine/base/status.h"
#include "engine/sample/acceptance.h"
#include "kernels/ref/vegas.h"

namespace specd {
namespace {

// Mixed into the request's seed so the drafts' draws are not the target sampler's stream.
constexpr uint64_t kVegasSeedSalt = 0x3c6ef372fe94f82bULL;  // not the acceptor's salt

kernels::ref::VegasBudget BudgetOf(const SparseDraftOptions& o) {
  return {o.sparsity_ratio, o.min_tokens,
          o.max_tokens > 0 ? int64_t{o.max_tokens} : std::numeric_limits<int64_t>::max()};
}

bool IsSparseMethod(const DraftInput& in) {
  return in.speculation != nullptr && (in.speculation->method == SpeculationMethod::kVegas ||
                                       in.speculation->method == SpeculationMethod::kStreaming);
}

}  // namespace

int64_t SparseKeepCount(int64_t n, const SparseDraftOptions& budget) {
  return kernels::ref::VegasKeepCount(n, BudgetOf(budget));
}

VegasSpeculator::VegasSpeculator(ModelRunner* runner)
    : runner_(runner), num_layers_(runner->config().num_layers) {}

int32_t VegasSpeculator::selection_prefix(uint64_t seq_id) const {
  auto it = states_.find(seq_id);
  return it == states_.end() ? 0 : it->second->num_scored;
}

std::span<const int32_t> VegasSpeculator::selection(uint64_t seq_id, int32_t layer) const {
  auto it = states_.find(seq_id);
  if (it == states_.end() || it->second->num_scored == 0) return {};
  const State& s = *it->second;
  return std::span<const int32_t>(s.indices).subspan(int64_t{layer} * s.num_kept, s.num_kept);
}

int32_t VegasSpeculator::TakeSlot() {
  if (!slots_listed_) {
    slots_listed_ = true;
    for (int32_t s = runner_->num_sparse_slots() - 1; s >= 0; --s) free_slots_.push_back(s);
  }
  if (free_slots_.empty()) return -1;
  const int32_t slot = free_slots_.back();
  free_slots_.pop_back();
  return slot;
}

void VegasSpeculator::Release(uint64_t seq_id) {
  auto it = states_.find(seq_id);
  if (it == states_.end()) return;
  if (it->second->slot >= 0) free_slots_.push_back(it->second->slot);
  states_.erase(it);
}

bool VegasSpeculator::PrepareScoring(uint64_t seq_id, ChunkAttention* attention) {
  auto it = states_.find(seq_id);
  if (it == states_.end() || it->second->slot < 0) return false;
  const State& state = *it->second;
  attention->select_slot = state.slot;
  attention->select_budget = {state.budget.sparsity_ratio, state.budget.min_tokens,
                              state.budget.max_tokens};
  return true;
}

void VegasSpeculator::PlanInput(const DraftInput& in, State& state, Plan& plan) {
  plan.lists.assign(num_layers_, {});
  plan.attention = ChunkAttention{};
  const int32_t n = in.num_computed;  // the prefix the first draft step sees
  const bool vegas = in.speculation->method == SpeculationMethod::kVegas;
  if (vegas && state.in_slot && state.num_scored > 0 && state.num_scored <= n) {
    plan.attention.slot = state.slot;
    plan.attention.slot_count = state.num_kept;
    plan.attention.recent_start = state.num_scored;
    return;
  }
  if (vegas && !state.in_slot && state.num_scored > 0 && state.num_scored <= n) {
    for (int32_t l = 0; l < num_layers_; ++l) {
      plan.lists[l] = std::span<const int32_t>(state.indices)
                          .subspan(int64_t{l} * state.num_kept, state.num_kept);
    }
    plan.attention.layer_indices = plan.lists;
    plan.attention.recent_start = state.num_scored;
    return;
  }
  // Streaming: sinks, then the most recent k - sinks prefix tokens (and everything after them).
  const int64_t k = SparseKeepCount(n, state.budget);
  if (k >= n) return;  // the whole prefix: dense
  const int32_t sinks = static_cast<int32_t>(std::min<int64_t>(kStreamingSinkTokens, k));
  plan.sinks.resize(sinks);
  std::iota(plan.sinks.begin(), plan.sinks.end(), 0);
  plan.lists.assign(num_layers_, plan.sinks);
  plan.attention.layer_indices = plan.lists;
  plan.attention.recent_start = n - static_cast<int32_t>(k - sinks);
}

void VegasSpeculator::DrawDraft(const DraftInput& in, State& state, std::span<const float> logits,
                                Draft& draft) {
  const int32_t j = static_cast<int32_t>(draft.tokens.size());
  std::span<const int32_t> banned =
      j < in.num_banned_positions ? in.banned : std::span<const int32_t>();
  probs_.resize(logits.size());
  // Penalties see the earlier drafts as output, as the target's verification does.
  ProcessedProbs(*in.params, logits, *in.history, draft.tokens, banned, probs_);
  if (in.params->greedy()) {  // the argmax (lowest id on ties); q is one-hot
    int32_t token =
        static_cast<int32_t>(std::max_element(probs_.begin(), probs_.end()) - probs_.begin());
    if (replay_ != nullptr) token = replay_->Draft(in.tokens, draft.tokens, token);
    draft.tokens.push_back(token);
    return;
  }
  if (!state.seeded) {
    state.rng.seed(in.seed ^ kVegasSeedSalt);
    state.seeded = true;
  }
  draft.tokens.push_back(DrawFromProbs(probs_, state.rng));
  draft.probs.insert(draft.probs.end(), probs_.begin(), probs_.end());
}

absl::Status VegasSpeculator::Propose(std::span<const DraftInput> inputs,
                                      std::vector<Draft>* drafts) {
  drafts->resize(inputs.size());
  plans_.resize(inputs.size());
  int32_t num_steps = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const DraftInput& in = inputs[i];
    Draft& d = (*drafts)[i];
    d.tokens.clear();
    d.probs.clear();
    d.num_kept_tokens = -1;
    Plan& plan = plans_[i];
    // The first step runs the last committed token, whose KV is not computed yet.
    plan.active = IsSparseMethod(in) && in.params != nullptr && in.history != nullptr &&
                  in.num_draft_tokens > 0 && in.num_computed >= 0 &&
                  static_cast<int64_t>(in.tokens.size()) == int64_t{in.num_computed} + 1;
    if (!plan.active) continue;
    // The verification chunk (the last committed token and the drafts) collects scores: a
    // runner may bound its length (the CUDA kernels: 16 tokens).
    plan.num_drafts = static_cast<int32_t>(std::min<int64_t>(
        in.num_draft_tokens, int64_t{runner_->max_attention_option_tokens()} - 1));
    std::unique_ptr<State>& state = states_[in.seq_id];
    if (state == nullptr) state = std::make_unique<State>();
    state->budget = in.speculation->sparse;
    // A Vegas sequence selects into a slot of the runner's where it can (PrepareScoring).
    if (state->slot < 0 && in.speculation->method == SpeculationMethod::kVegas) {
      state->slot = TakeSlot();
    }
    PlanInput(in, *state, plan);
    if (plan.attention.sparse()) {
      d.num_kept_tokens = static_cast<int32_t>(plan.lists[0].size()) + in.num_computed -
                          plan.attention.recent_start;
    } else if (plan.attention.slot_sparse()) {
      d.num_kept_tokens = plan.attention.slot_count + in.num_computed - plan.attention.recent_start;
    }
    num_steps = std::max(num_steps, plan.num_drafts);
  }
  // Greedy steps draw their argmax on a device that samples (ids only come back; its sparse
  // draft steps replay graphs); any sampled row takes every row's logits to the host.
  bool on_device = runner_->SamplesSpeculationOnDevice();
  for (size_t i = 0; i < inputs.size() && on_device; ++i) {
    on_device = !plans_[i].active || inputs[i].params->greedy();
  }
  const size_t vocab = static_cast<size_t>(runner_->config().vocab_size);
  for (int32_t j = 0; j < num_steps; ++j) {
    batch_.clear();
    batch_input_.clear();
    for (size_t i = 0; i < inputs.size(); ++i) {
      const DraftInput& in = inputs[i];
      if (!plans_[i].active || j >= plans_[i].num_drafts) continue;
      const Draft& d = (*drafts)[i];
      SequenceInput s;
      s.tokens = j == 0 ? in.tokens.last(1) : std::span<const int32_t>(d.tokens).subspan(j - 1, 1);
      s.start_pos = in.num_computed + j;
      s.block_table = in.block_table;
      s.seq_id = static_cast<int64_t>(in.seq_id);
      const ChunkAttention& a = plans_[i].attention;
      s.attention = a.sparse() || a.slot_sparse() ? &a : nullptr;
      batch_.push_back(s);
      batch_input_.push_back(static_cast<int32_t>(i));
    }
    absl::Status st;
    if (on_device) {
      rows_.clear();
      for (size_t b = 0; b < batch_.size(); ++b) {
        const DraftInput& in = inputs[batch_input_[b]];
        State& state = *states_[in.seq_id];
        if (state.sampler == nullptr) state.sampler = std::make_unique<Sampler>(*in.params, 0);
        SampleRow row;
        row.chunk = static_cast<int32_t>(b);
        row.sampler = state.sampler.get();
        row.params = in.params;
        row.history = in.history;
        if (j < in.num_banned_positions) row.banned = in.banned;
        row.seed = in.seed;
        row.num_generated = in.num_generated + j;
        row.pending = (*drafts)[batch_input_[b]].tokens;  // penalties see the earlier drafts
        rows_.push_back(row);
      }
      st = runner_->Step(batch_, rows_, &drawn_);
    } else {
      logits_.clear();
      st = runner_->Forward(batch_, &logits_);
    }
    if (!st.ok()) {
      for (Draft& d : *drafts) {  // a failed step leaves no drafts (the engine decodes plainly)
        d.tokens.clear();
        d.probs.clear();
      }
      return st;
    }
    if (on_device) {
      for (size_t b = 0; b < batch_.size(); ++b) {
        const DraftInput& in = inputs[batch_input_[b]];
        Draft& d = (*drafts)[batch_input_[b]];
        int32_t token = drawn_[b].id;
        if (replay_ != nullptr) token = replay_->Draft(in.tokens, d.tokens, token);
        d.tokens.push_back(token);
      }
      continue;
    }
    for (size_t b = 0; b < batch_.size(); ++b) {
      const size_t i = static_cast<size_t>(batch_input_[b]);
      State& state = *states_[inputs[i].seq_id];
      DrawDraft(inputs[i], state, std::span<const float>(logits_).subspan(b * vocab, vocab),
                (*drafts)[i]);
    }
  }
  return absl::OkStatus();
}

void VegasSpeculator::OnVerified(std::span<const VerifiedRound> rounds) {
  for (const VerifiedRound& round : rounds) {
    auto it = states_.find(round.seq_id);
    if (it == states_.end() || round.num_scored <= 0) continue;
    const int64_t n = round.num_scored;
    State& state = *it->second;
    if (round.scores.empty() && state.slot >= 0) {  // the runner selected into the slot
      state.in_slot = true;
      state.num_scored = static_cast<int32_t>(n);
      state.num_kept = static_cast<int32_t>(SparseKeepCount(n, state.budget));
      state.indices.clear();
      continue;
    }
    if (static_cast<int64_t>(round.scores.size()) != int64_t{num_layers_} * 2 * n) continue;
    state.in_slot = false;
    const int64_t k = SparseKeepCount(n, state.budget);
    state.indices.assign(static_cast<size_t>(num_layers_ * std::max<int64_t>(k, 1)), 0);
    std::vector<int32_t> counts(num_layers_);
    const int32_t length = static_cast<int32_t>(n);
    // Pair p = layer p (one sequence): scores [num_layers, 2, 1, n].
    kernels::ref::VegasSelectTopK(round.scores.data(), 1, n, &length, 1, num_layers_,
                                  BudgetOf(state.budget), state.indices.data(),
                                  std::max<int64_t>(k, 1), counts.data());
    state.num_kept = static_cast<int32_t>(k);
    state.indices.resize(static_cast<size_t>(num_layers_ * k));
    state.num_scored = length;
  }
}

}  // namespace specd
