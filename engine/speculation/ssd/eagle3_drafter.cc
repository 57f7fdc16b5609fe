#include "engine/speculation/ssd/eagle3_drafter.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/base/status.h"
#include "engine/runner/model_runner.h"
#include "engine/sample/acceptance.h"
#include "engine/speculation/saguaro/saguaro.h"

namespace specd {
namespace {

// Mixed into the request's seed for the head's draws (as the in-process head's).
constexpr uint64_t kHeadSeedSalt = 0x3c6ef372fe94f82bULL;
// Pool scratch rows one run of a long prompt's oldest positions takes at most (and the target
// rows of one SetHostCapture on the CUDA head).
constexpr int32_t kRunAtOnceRows = 512;
const CacheDrafter::CacheDraftOptions kNoCache{};

int32_t CommonPrefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  return static_cast<int32_t>(ia - a.begin());
}

}  // namespace

absl::StatusOr<std::unique_ptr<Eagle3CacheDrafter>> Eagle3CacheDrafter::Create(
    std::unique_ptr<Eagle3Compute> compute, int32_t target_vocab, int32_t max_model_len,
    std::string device_name) {
  if (compute == nullptr || !compute->Standalone()) {
    return absl::InvalidArgumentError("ssd speculator: the EAGLE-3 head must stand alone");
  }
  if (target_vocab > 0 && compute->config().layer.vocab_size != target_vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("EAGLE-3 head: drafts over ", compute->config().layer.vocab_size,
                     " ids, the verifier's target has ", target_vocab));
  }
  const int32_t vocab = compute->config().layer.vocab_size;
  return std::unique_ptr<Eagle3CacheDrafter>(
      new Eagle3CacheDrafter(std::move(compute), vocab, max_model_len, std::move(device_name)));
}

Eagle3CacheDrafter::Eagle3CacheDrafter(std::unique_ptr<Eagle3Compute> compute, int32_t vocab,
                                       int32_t max_model_len, std::string device_name)
    : compute_(std::move(compute)),
      vocab_(vocab),
      max_model_len_(max_model_len),
      device_name_(std::move(device_name)) {
  for (int32_t r = compute_->num_pool_regions() - 1; r >= 0; --r) free_regions_.push_back(r);
  if (compute_->PagedCache()) {
    block_size_ = compute_->kv_block_size();
    allocator_ = std::make_unique<BlockAllocator>(std::max(0, compute_->kv_blocks() - 1));
  }
}

Eagle3CacheDrafter::State* Eagle3CacheDrafter::StateOf(uint64_t seq_id) {
  std::unique_ptr<State>& slot = states_[seq_id];
  if (slot == nullptr) {
    slot = std::make_unique<State>(block_size_);
    slot->ring.assign(kEagle3PoolWindow, -1);
    if (!free_regions_.empty()) {  // else it never holds a hidden state: it drafts nothing
      slot->region = free_regions_.back();
      free_regions_.pop_back();
    }
  }
  return slot.get();
}

int32_t Eagle3CacheDrafter::RingRow(const State& s, int32_t position) const {
  return s.region * kEagle3PoolWindow + position % kEagle3PoolWindow;
}

bool Eagle3CacheDrafter::HasHidden(const State& s, int32_t position) const {
  return s.region >= 0 && position >= 0 && s.ring[position % kEagle3PoolWindow] == position;
}

void Eagle3CacheDrafter::SetHidden(State& s, int32_t position) {
  s.ring[position % kEagle3PoolWindow] = position;
}

void Eagle3CacheDrafter::Release(uint64_t seq_id) {
  auto it = states_.find(seq_id);
  if (it == states_.end()) return;
  if (it->second->region >= 0) free_regions_.push_back(it->second->region);
  if (allocator_ != nullptr) (void)it->second->blocks.Release(*allocator_);
  states_.erase(it);
  compute_->Release(static_cast<int64_t>(seq_id));
}

bool Eagle3CacheDrafter::PrepareSlots(State& s, int32_t from, int32_t to) {
  if (allocator_ == nullptr || to < from) return true;
  const int32_t bs = block_size_;
  // The first block at or after `from`'s that another state shares: copied (its slots below
  // `from` are still this state's), and every block after it given up (they are rewritten).
  for (int32_t b = from / bs; b < s.blocks.num_blocks(); ++b) {
    const BlockId shared = s.blocks.block(b);
    if (allocator_->ref_count(shared) <= 1) continue;
    absl::StatusOr<BlockId> own = allocator_->Allocate();
    if (!own.ok()) return false;
    if (b == from / bs && from % bs != 0) {
      const std::pair<int32_t, int32_t> copy{shared.value, own->value};
      if (!compute_->CopyKvBlocks({&copy, 1}).ok()) {
        (void)allocator_->Free(*own);
        return false;
      }
    }
    (void)s.blocks.Truncate(b * bs, *allocator_);
    s.blocks.Append(*own);
    break;
  }
  return s.blocks.EnsureCapacity(to + 1, *allocator_).ok();
}

int32_t Eagle3CacheDrafter::QueueRows(uint64_t seq, State& s, int32_t from, int32_t to) {
  to = std::min(to, static_cast<int32_t>(s.tokens.size()) - 2);
  int32_t last = from - 1;  // the last position with its hidden state, from `from` on
  while (last < to && HasHidden(s, last + 1)) ++last;
  if (last < from || !PrepareSlots(s, from, last)) return 0;
  int32_t queued = 0;
  for (int32_t p = from; p <= last; ++p) {
    Eagle3Compute::Row r;
    r.seq = static_cast<int64_t>(seq);
    r.token = s.tokens[p + 1];
    r.position = p;
    r.hidden = RingRow(s, p);
    if (allocator_ != nullptr) r.block_table = s.blocks.ids();
    rows_.push_back(r);
    ++queued;
  }
  return queued;
}

absl::Status Eagle3CacheDrafter::AddTargetRows(uint64_t seq_id, std::span<const int32_t> tokens,
                                               int32_t position, std::span<const float> rows) {
  const int64_t width = HiddenWidth();
  const auto n = static_cast<int32_t>(static_cast<int64_t>(rows.size()) / width);
  return AddRows(seq_id, tokens, position, n, [&](int32_t skip, int32_t count) {
    return compute_->SetHostCapture(
        rows.subspan(static_cast<size_t>(skip) * width, static_cast<size_t>(count) * width));
  });
}

bool Eagle3CacheDrafter::reads_hidden_on_device() const { return compute_->TakesDeviceCapture(); }

absl::Status Eagle3CacheDrafter::AddTargetRowsOnDevice(uint64_t seq_id,
                                                       std::span<const int32_t> tokens,
                                                       int32_t position, const void* rows,
                                                       int32_t n) {
  const int64_t width = HiddenWidth();
  const absl::Status added = AddRows(seq_id, tokens, position, n, [&](int32_t skip, int32_t count) {
    return compute_->SetDeviceCapture(
        static_cast<const uint16_t*>(rows) + static_cast<int64_t>(skip) * width, count);
  });
  // The rows are the caller's only during the call: the passes reading them end first.
  const absl::Status released = compute_->SetDeviceCapture(nullptr, 0);
  return added.ok() ? released : added;
}

absl::Status Eagle3CacheDrafter::AddRows(
    uint64_t seq_id, std::span<const int32_t> tokens, int32_t position, int32_t n,
    const std::function<absl::Status(int32_t skip, int32_t count)>& capture_rows) {
  State* s = StateOf(seq_id);
  const int32_t common = CommonPrefix(s->tokens, tokens);
  if (common < static_cast<int32_t>(tokens.size())) {
    // The committed context left what the state drafted: its later hidden states and entries
    // read other tokens.
    s->tokens.assign(tokens.begin(), tokens.end());
    for (int32_t& p : s->ring) {
      if (p >= common) p = -1;
    }
    s->entries = std::min(s->entries, std::max(0, common - 1));
  }
  // Position p's row reads token p + 1: the rows stop before the last committed token.
  n = std::min(n, static_cast<int32_t>(tokens.size()) - 1 - position);
  // No pool region (more states than the compute has): this sequence drafts nothing.
  if (n <= 0 || position < 0 || s->region < 0) return absl::OkStatus();
  const auto seq = static_cast<int64_t>(seq_id);
  // Rows [p0, p1) of the positions as the capture Fuse reads (one call takes at most
  // kRunAtOnceRows).
  auto capture = [&](int32_t p0, int32_t p1) { return capture_rows(p0 - position, p1 - p0); };
  // Rows older than the ring run now, in pieces, from scratch pool rows.
  const int32_t ring_from = std::max(position, position + n - kEagle3PoolWindow);
  if (ring_from > position) {
    compute_->Truncate(seq, std::min(s->entries, position));
    for (int32_t p0 = position; p0 < ring_from; p0 += kRunAtOnceRows) {
      const int32_t p1 = std::min(ring_from, p0 + kRunAtOnceRows);
      from_.clear();
      to_.clear();
      rows_.clear();
      if (!PrepareSlots(*s, p0, p1 - 1)) return absl::OkStatus();  // no KV room: drafts less
      SPECD_RETURN_IF_ERROR(capture(p0, p1));
      for (int32_t p = p0; p < p1; ++p) {
        from_.push_back(p - p0);
        to_.push_back(compute_->scratch_row(p - p0));
        Eagle3Compute::Row r;
        r.seq = seq;
        r.token = tokens[p + 1];
        r.position = p;
        r.hidden = to_.back();
        if (allocator_ != nullptr) r.block_table = s->blocks.ids();
        rows_.push_back(r);
      }
      SPECD_RETURN_IF_ERROR(compute_->Fuse(from_, to_));
      host_flags_.clear();
      SPECD_RETURN_IF_ERROR(compute_->Forward(rows_, host_flags_, &ids_, &logits_));
    }
    s->entries = ring_from;
  }
  from_.clear();
  to_.clear();
  SPECD_RETURN_IF_ERROR(capture(ring_from, position + n));
  for (int32_t p = ring_from; p < position + n; ++p) {
    from_.push_back(p - ring_from);
    to_.push_back(RingRow(*s, p));
    SetHidden(*s, p);
  }
  SPECD_RETURN_IF_ERROR(compute_->Fuse(from_, to_));
  // The positions from here on read the head's own outputs: rerun with the target's.
  s->entries = std::min(s->entries, ring_from);
  // Positions before these rows without a hidden state can never be run (a speculator that
  // joined mid-sequence gets the target's rows from the verifier's next pass on): the cache
  // skips through the last of them, whose entries stay absent or stale (drafts accept less;
  // verification keeps the output exact), rather than never drafting again.
  for (int32_t q = ring_from - 1; q >= s->entries; --q) {
    if (!HasHidden(*s, q)) {
      s->entries = q + 1;
      break;
    }
  }
  return absl::OkStatus();
}

absl::Status Eagle3CacheDrafter::PrepareForks(std::span<const uint64_t> seq_ids) {
  rows_.clear();
  for (uint64_t id : seq_ids) {
    auto it = states_.find(id);
    if (it == states_.end()) continue;
    State& s = *it->second;
    const auto last = static_cast<int32_t>(s.tokens.size()) - 2;
    if (s.entries > last) continue;
    compute_->Truncate(static_cast<int64_t>(id), s.entries);
    s.entries += QueueRows(id, s, s.entries, last);
  }
  if (rows_.empty()) return absl::OkStatus();
  host_flags_.clear();
  return compute_->Forward(rows_, host_flags_, &ids_, &logits_);
}

absl::Status Eagle3CacheDrafter::Fork(uint64_t parent, uint64_t child, int32_t num_tokens) {
  auto it = states_.find(parent);
  if (it == states_.end()) {
    return absl::NotFoundError(absl::StrCat("eagle3 drafter: no sequence ", parent));
  }
  if (states_.contains(child)) {
    return absl::AlreadyExistsError(absl::StrCat("eagle3 drafter: sequence ", child, " exists"));
  }
  if (num_tokens < 0) return absl::InvalidArgumentError("eagle3 drafter: a negative fork point");
  State* c = StateOf(child);  // without a pool region when none is free: it drafts nothing
  const State& p = *states_.at(parent);  // StateOf may have rehashed
  const int32_t n = std::min(num_tokens, static_cast<int32_t>(p.tokens.size()));
  c->tokens.assign(p.tokens.begin(), p.tokens.begin() + n);
  c->entries = std::max(0, std::min(p.entries, n - 1));
  if (allocator_ == nullptr) {
    SPECD_RETURN_IF_ERROR(
        compute_->ForkCache(static_cast<int64_t>(parent), static_cast<int64_t>(child), c->entries));
  } else {
    // Full blocks below the fork point shared, the partial one copied (the child writes there).
    const int32_t full = c->entries / block_size_;
    for (int32_t b = 0; b < full && b < p.blocks.num_blocks(); ++b) {
      SPECD_RETURN_IF_ERROR(allocator_->AddRef(p.blocks.block(b)));
      c->blocks.Append(p.blocks.block(b));
    }
    if (c->entries % block_size_ != 0 && full < p.blocks.num_blocks()) {
      absl::StatusOr<BlockId> own = allocator_->Allocate();
      if (own.ok()) {
        const std::pair<int32_t, int32_t> copy{p.blocks.block(full).value, own->value};
        SPECD_RETURN_IF_ERROR(compute_->CopyKvBlocks({&copy, 1}));
        c->blocks.Append(*own);
      } else {
        c->entries = full * block_size_;  // no room: it recomputes nothing and drafts less
      }
    }
  }
  // The hidden states the child's first rows read: from its valid entries to its fork point.
  from_.clear();
  to_.clear();
  for (int32_t q = c->entries; q < n && c->region >= 0; ++q) {
    if (!HasHidden(p, q)) continue;
    from_.push_back(RingRow(p, q));
    to_.push_back(RingRow(*c, q));
    SetHidden(*c, q);
  }
  return compute_->CopyHidden(from_, to_);
}

absl::Status Eagle3CacheDrafter::Adopt(uint64_t parent, uint64_t child) {
  auto it = states_.find(child);
  if (it == states_.end()) {
    return absl::NotFoundError(absl::StrCat("eagle3 drafter: no branch ", child));
  }
  if (allocator_ == nullptr) {
    SPECD_RETURN_IF_ERROR(
        compute_->AdoptCache(static_cast<int64_t>(parent), static_cast<int64_t>(child)));
  }
  std::unique_ptr<State> state = std::move(it->second);
  states_.erase(it);
  std::unique_ptr<State>& slot = states_[parent];
  if (slot != nullptr) {
    if (slot->region >= 0) free_regions_.push_back(slot->region);
    if (allocator_ != nullptr) (void)slot->blocks.Release(*allocator_);
  }
  slot = std::move(state);
  return absl::OkStatus();
}

void Eagle3CacheDrafter::DeviceDraft(const DraftInput& in, const CacheDraftOptions& cache,
                                     int32_t argmax, std::span<const int32_t> ranked,
                                     Draft& draft) const {
  const int32_t token =
      replay_ != nullptr ? replay_->Draft(in.tokens, draft.tokens, argmax) : argmax;
  if (cache.num_candidates > 0) {
    const size_t at = draft.candidates.size();
    AppendCandidates(std::vector<int32_t>(ranked.begin(), ranked.begin() + cache.num_candidates),
                     token, draft);
    if (replay_ != nullptr) {
      replay_->Candidates(in.tokens, draft.tokens,
                          std::span<int32_t>(draft.candidates).subspan(at));
    }
  }
  draft.tokens.push_back(token);
}

void Eagle3CacheDrafter::DrawDraft(const DraftInput& in, const CacheDraftOptions& cache, State& s,
                                   std::span<const float> logits, Draft& draft) {
  const auto j = static_cast<int32_t>(draft.tokens.size());
  std::span<const int32_t> banned =
      j < in.num_banned_positions ? in.banned : std::span<const int32_t>();
  probs_.resize(logits.size());
  ProcessedProbs(*in.params, logits, *in.history, draft.tokens, banned, probs_);
  if (in.params->greedy()) {
    auto token =
        static_cast<int32_t>(std::max_element(probs_.begin(), probs_.end()) - probs_.begin());
    if (replay_ != nullptr) token = replay_->Draft(in.tokens, draft.tokens, token);
    if (cache.num_candidates > 0) {
      const size_t at = draft.candidates.size();
      AppendCandidates(TopF(logits, cache.num_candidates), token, draft);
      if (replay_ != nullptr) {
        replay_->Candidates(in.tokens, draft.tokens,
                            std::span<int32_t>(draft.candidates).subspan(at));
      }
    }
    draft.tokens.push_back(token);
    return;
  }
  if (!s.seeded) {
    s.rng.seed(in.seed ^ kHeadSeedSalt);
    s.seeded = true;
  }
  if (std::accumulate(probs_.begin(), probs_.end(), 0.0) <= 0.0) return;  // no mass: no draft
  if (cache.num_candidates > 0) AppendCandidates(TopF(probs_, cache.num_candidates), -1, draft);
  if (cache.saguaro_fan_out > 0 && cache.saguaro_c >= 0.0f && cache.saguaro_c < 1.0f) {
    SaguaroDownweight(probs_, TopF(probs_, cache.saguaro_fan_out), cache.saguaro_c);
  }
  draft.tokens.push_back(DrawFromProbs(probs_, s.rng));
  draft.probs.insert(draft.probs.end(), probs_.begin(), probs_.end());
}

absl::Status Eagle3CacheDrafter::Propose(std::span<const DraftInput> inputs,
                                         std::span<const CacheDraftOptions> cache,
                                         std::vector<Draft>* drafts,
                                         const std::function<bool()>& stop) {
  if (!cache.empty() && cache.size() != inputs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eagle3 drafter: ", cache.size(), " cache options for ", inputs.size(), " inputs"));
  }
  drafts->resize(inputs.size());
  for (Draft& d : *drafts) d.Reset();
  active_.clear();
  rows_.clear();
  // The catch-up: each sequence's positions from its first invalid entry to L - 2, whose row
  // gives draft 1 (one pass for all).
  for (size_t i = 0; i < inputs.size(); ++i) {
    const DraftInput& in = inputs[i];
    const auto n = static_cast<int32_t>(in.tokens.size());
    if (in.num_draft_tokens <= 0 || in.params == nullptr || in.history == nullptr || n < 2) {
      continue;
    }
    State* s = StateOf(in.seq_id);
    const int32_t common = CommonPrefix(s->tokens, in.tokens);
    for (int32_t& p : s->ring) {
      if (p >= common) p = -1;  // read other tokens (or drafts about to be redrawn)
    }
    s->tokens.assign(in.tokens.begin(), in.tokens.end());
    const int32_t valid = std::max(0, std::min({s->entries, common - 1, n - 2}));
    compute_->Truncate(static_cast<int64_t>(in.seq_id), valid);
    s->entries = valid;
    const int32_t queued = QueueRows(in.seq_id, *s, valid, n - 2);
    s->entries = valid + queued;
    if (valid + queued != n - 1) continue;  // no hidden state for some position: no drafts
    rows_.back().logits = true;
    Active a;
    a.input = i;
    a.state = s;
    a.seq = in.seq_id;
    a.next_position = n - 1;
    active_.push_back(a);
  }
  if (!stop) {  // a build's wave stops between passes: it runs them one at a time
    bool done = false;
    SPECD_RETURN_IF_ERROR(ProposeRound(inputs, cache, drafts, &done));
    if (done) return absl::OkStatus();
  }
  while (!rows_.empty()) {
    // Logits rows come to the host only where the compute cannot rank them (or the draw needs
    // the processed row: sampled, penalties, bans); the rest take the argmax and the candidates
    // ranked on the device.
    host_flags_.clear();
    int32_t device_k = 0;
    for (const Active& a : active_) {
      const DraftInput& in = inputs[a.input];
      const auto j = static_cast<int32_t>((*drafts)[a.input].tokens.size());
      const bool host = !compute_->RanksOnDevice() || !in.params->greedy() ||
                        in.params->has_penalties() ||
                        (j < in.num_banned_positions && !in.banned.empty());
      host_flags_.push_back(host ? 1 : 0);
      if (!host && !cache.empty()) device_k = std::max(device_k, cache[a.input].num_candidates);
    }
    const absl::Time t0 = tracing_ ? absl::Now() : absl::InfinitePast();
    // The candidates come back with the pass's ids: one wait for the device a pass.
    compute_->PrefetchCandidates(device_k);
    SPECD_RETURN_IF_ERROR(compute_->Forward(rows_, host_flags_, &ids_, &logits_));
    compute_->PrefetchCandidates(0);
    const absl::Time t1 = tracing_ ? absl::Now() : absl::InfinitePast();
    if (device_k > 0) {
      // TopCandidates appends: this pass's rows only (without the clear every pass read the
      // first pass's candidates, and the scratch grew for as long as the speculator ran).
      cand_ids_.clear();
      cand_logprobs_.clear();
      SPECD_RETURN_IF_ERROR(compute_->TopCandidates(device_k, &cand_ids_, &cand_logprobs_));
    }
    if (tracing_) {
      ++trace_.passes;
      trace_.rows += static_cast<int64_t>(rows_.size());
      trace_.forward += absl::ToDoubleSeconds(t1 - t0);
      trace_.candidates += absl::ToDoubleSeconds(absl::Now() - t1);
    }
    size_t host_row = 0;
    // Each sequence's draft from its logits row, and that row's output kept as the hidden state
    // of the next position (the next row's, and a branch's forked there).
    from_.clear();
    to_.clear();
    size_t next = 0;
    for (size_t r = 0; r < active_.size(); ++r) {
      Active& a = active_[r];
      const DraftInput& in = inputs[a.input];
      Draft& d = (*drafts)[a.input];
      const size_t before = d.tokens.size();
      const CacheDraftOptions& c = cache.empty() ? kNoCache : cache[a.input];
      if (host_flags_[r]) {
        DrawDraft(
            in, c, *a.state,
            std::span<const float>(logits_).subspan(host_row++ * size_t(vocab_), size_t(vocab_)),
            d);
      } else {
        DeviceDraft(
            in, c, ids_[r],
            std::span<const int32_t>(cand_ids_).subspan(r * size_t(device_k), size_t(device_k)), d);
      }
      a.state->entries = a.next_position;
      if (d.tokens.size() == before) continue;  // no mass left: the chain ends
      a.state->tokens.push_back(d.tokens.back());
      from_.push_back(-static_cast<int32_t>(r) - 1);
      to_.push_back(RingRow(*a.state, a.next_position));
      SetHidden(*a.state, a.next_position);
      if (static_cast<int32_t>(d.tokens.size()) < in.num_draft_tokens &&
          a.next_position + 1 < max_model_len_) {
        active_[next++] = a;
      }
    }
    const absl::Time t2 = tracing_ ? absl::Now() : absl::InfinitePast();
    SPECD_RETURN_IF_ERROR(compute_->CopyHidden(from_, to_));
    if (tracing_) trace_.copies += absl::ToDoubleSeconds(absl::Now() - t2);
    active_.resize(next);
    rows_.clear();
    if (active_.empty() || (stop && stop())) break;
    size_t kept = 0;
    for (Active& a : active_) {
      if (!PrepareSlots(*a.state, a.next_position, a.next_position)) continue;  // KV full
      Eagle3Compute::Row r;
      r.seq = static_cast<int64_t>(a.seq);
      r.token = a.state->tokens.back();
      r.position = a.next_position;
      r.hidden = RingRow(*a.state, a.next_position);
      r.logits = true;
      if (allocator_ != nullptr) r.block_table = a.state->blocks.ids();
      rows_.push_back(r);
      ++a.next_position;
      active_[kept++] = a;
    }
    active_.resize(kept);
  }
  return absl::OkStatus();
}

absl::Status Eagle3CacheDrafter::ProposeRound(std::span<const DraftInput> inputs,
                                              std::span<const CacheDraftOptions> cache,
                                              std::vector<Draft>* drafts, bool* done) {
  *done = false;
  if (active_.empty() || cache.empty() || !compute_->RanksOnDevice()) return absl::OkStatus();
  const int32_t K = inputs[active_[0].input].num_draft_tokens;
  int32_t k = 0;
  for (const Active& a : active_) {
    const DraftInput& in = inputs[a.input];
    if (in.num_draft_tokens != K || !in.params->greedy() || in.params->has_penalties() ||
        (in.num_banned_positions > 0 && !in.banned.empty()) ||
        a.next_position + K - 1 >= max_model_len_) {
      return absl::OkStatus();
    }
    k = std::max(k, cache[a.input].num_candidates);
  }
  if (K < 2 || k < 1) return absl::OkStatus();
  // The chain's K - 1 positions get their KV slots first (the rows' block tables then cover
  // them), and each draft's prenorm row its ring row, as the passes' CopyHidden gives them.
  ids_.clear();  // keep rows: [K, sequences]
  for (Active& a : active_) {
    if (!PrepareSlots(*a.state, a.next_position, a.next_position + K - 2)) return absl::OkStatus();
  }
  for (Eagle3Compute::Row& r : rows_) {
    if (allocator_ != nullptr)
      r.block_table = states_.at(static_cast<uint64_t>(r.seq))->blocks.ids();
  }
  for (int32_t step = 0; step < K; ++step) {
    for (const Active& a : active_) ids_.push_back(RingRow(*a.state, a.next_position + step));
  }
  const absl::Time t0 = tracing_ ? absl::Now() : absl::InfinitePast();
  bool ran = false;
  SPECD_RETURN_IF_ERROR(compute_->DraftRankedRound(rows_, K - 1, k, ids_, &ranked_, &ran));
  if (!ran) return absl::OkStatus();  // the passes, one at a time
  ++rounds_on_device_;
  if (tracing_) {
    ++trace_.rounds;
    trace_.passes += K;
    trace_.rows += static_cast<int64_t>(rows_.size()) + int64_t{K - 1} * active_.size();
    trace_.forward += absl::ToDoubleSeconds(absl::Now() - t0);
  }
  const size_t num = active_.size();
  for (int32_t step = 0; step < K; ++step) {
    for (size_t i = 0; i < num; ++i) {
      Active& a = active_[i];
      const size_t at = static_cast<size_t>(step) * num + i;
      Draft& d = (*drafts)[a.input];
      DeviceDraft(inputs[a.input], cache[a.input], ranked_.ids[at],
                  std::span<const int32_t>(ranked_.candidates).subspan(at * k, size_t(k)), d);
      a.state->entries = a.next_position;
      a.state->tokens.push_back(d.tokens.back());
      SetHidden(*a.state, a.next_position);
      ++a.next_position;
    }
  }
  rows_.clear();
  active_.clear();
  *done = true;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Eagle3CacheDrafter>> CreateEagle3CacheDrafter(
    const std::string& head_dir, const std::string& target_dir, const std::string& device,
    int32_t target_vocab, int32_t max_model_len, bool dummy, int64_t kv_cache_bytes) {
  StandaloneEagle3Options o;
  o.dir = head_dir;
  o.target_dir = target_dir;
  o.device = device.empty() ? "cpu" : device;
  o.dummy = dummy;
  o.max_model_len = max_model_len;
  o.kv_cache_bytes = kv_cache_bytes;
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<Eagle3Compute> compute, CreateStandaloneEagle3Compute(o));
  return Eagle3CacheDrafter::Create(std::move(compute), target_vocab, max_model_len, o.device);
}

}  // namespace specd
