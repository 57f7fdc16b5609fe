#include "engine/speculation/draft_model.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/mapped_file.h"
#include "engine/base/status.h"
#include "engine/sample/acceptance.h"
#include "engine/speculation/saguaro/saguaro.h"

namespace specd {
namespace {

// Mixed into the request's seed so the draft's draws are not the target sampler's stream.
constexpr uint64_t kDraftSeedSalt = 0x6a09e667f3bcc909ULL;

int32_t CommonPrefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  return static_cast<int32_t>(ia - a.begin());
}

// Whether `cache` asks for Saguaro sampling (applied to sampled drafts only).
bool SaguaroSampling(const DraftModelSpeculator::CacheDraftOptions& cache) {
  return cache.saguaro_fan_out > 0 && cache.saguaro_c >= 0.0f && cache.saguaro_c < 1.0f;
}

// A device draw's share of SSD's cache options (sampled drafts only; greedy rows rank their raw
// logits elsewhere): candidates from the processed row and Saguaro sampling.
void SetCacheRow(const DraftInput& in, const DraftModelSpeculator::CacheDraftOptions& cache,
                 SampleRow& row) {
  if (in.params->greedy()) return;
  row.num_candidates = cache.num_candidates;
  if (SaguaroSampling(cache)) {
    row.saguaro_fan_out = cache.saguaro_fan_out;
    row.saguaro_c = cache.saguaro_c;
  }
}

}  // namespace

void AppendCandidates(std::vector<int32_t> top, int32_t first, Draft& draft) {
  if (first >= 0 && !top.empty() && top.front() != first) {
    auto it = std::find(top.begin(), top.end(), first);
    if (it == top.end()) {  // it displaces the last
      top.back() = first;
      it = top.end() - 1;
    }
    std::rotate(top.begin(), it, it + 1);  // `first` to the front, the rest keep their order
  }
  draft.candidates.insert(draft.candidates.end(), top.begin(), top.end());
}

absl::StatusOr<std::unique_ptr<DraftModelSpeculator>> DraftModelSpeculator::Create(
    std::unique_ptr<ModelRunner> runner, int32_t target_vocab, int32_t max_tokens_per_forward) {
  if (runner == nullptr) return absl::InvalidArgumentError("draft model: no runner");
  if (max_tokens_per_forward < 1) {
    return absl::InvalidArgumentError("draft model: max_tokens_per_forward must be positive");
  }
  if (runner->config().vocab_size != target_vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft model: vocab_size ", runner->config().vocab_size, " differs from the target's ",
        target_vocab, "; a draft must share the target's tokenizer"));
  }
  return std::unique_ptr<DraftModelSpeculator>(
      new DraftModelSpeculator(std::move(runner), max_tokens_per_forward));
}

absl::StatusOr<int32_t> DraftModelSpeculator::ReadMaskToken(const std::string& dir, int32_t vocab) {
  const std::string file = dir + "/config.json";
  SPECD_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(file));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  for (const char* key : {"pard_token", "ptd_token_id"}) {
    if (!j.is_object() || !j.contains(key)) continue;
    const nlohmann::json& v = j[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": '", key, "' must be a token id in [0, ", vocab, ")"));
    }
    return static_cast<int32_t>(v.get<int64_t>());
  }
  return absl::InvalidArgumentError(
      absl::StrCat("\"parallel\" drafting needs a draft trained for it; ", file,
                   " names no mask token (\"pard_token\")"));
}

DraftModelSpeculator::DraftModelSpeculator(std::unique_ptr<ModelRunner> runner,
                                           int32_t max_tokens_per_forward)
    : runner_(std::move(runner)),
      max_tokens_per_forward_(max_tokens_per_forward),
      allocator_(runner_->num_kv_blocks()) {}

void DraftModelSpeculator::Release(uint64_t seq_id) {
  std::erase_if(copies_, [&](const ForkCopy& c) { return c.child == seq_id; });
  auto it = states_.find(seq_id);
  if (it == states_.end()) return;
  it->second->blocks.Release(allocator_).IgnoreError();  // the table holds allocated blocks
  states_.erase(it);
}

absl::Status DraftModelSpeculator::Fork(uint64_t parent, uint64_t child, int32_t num_tokens) {
  if (num_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("draft model: fork point ", num_tokens));
  }
  auto it = states_.find(parent);
  if (it == states_.end() || it->second == nullptr) {
    return absl::NotFoundError(absl::StrCat("draft model: no sequence ", parent, " to fork"));
  }
  if (states_.contains(child)) {
    return absl::AlreadyExistsError(absl::StrCat("draft model: sequence ", child, " exists"));
  }
  const State& p = *it->second;
  const int32_t block_size = p.blocks.block_size();
  const int32_t num_shared =
      std::min(num_tokens, static_cast<int32_t>(p.kv_tokens.size())) / block_size;
  auto c = std::make_unique<State>(block_size);
  for (int32_t b = 0; b < num_shared; ++b) {
    if (absl::Status s = allocator_.AddRef(p.blocks.block(b)); !s.ok()) {  // a bug: p holds it
      c->blocks.Release(allocator_).IgnoreError();
      return absl::InternalError(absl::StrCat("draft model: fork: ", s.message()));
    }
    c->blocks.Append(p.blocks.block(b));
  }
  c->kv_tokens.assign(p.kv_tokens.begin(), p.kv_tokens.begin() + num_shared * block_size);
  // The partial block's positions below the fork point: copied into a block of the child's own
  // where the runner copies KV slots (MoveKv), before the next forward pass, instead of being
  // recomputed in the child's catch-up chunk.
  const int32_t partial =
      std::min(num_tokens, static_cast<int32_t>(p.kv_tokens.size())) - num_shared * block_size;
  if (partial > 0 && runner_->SupportsTokenTrees() && allocator_.CanAllocate(1)) {
    absl::StatusOr<BlockId> block = allocator_.Allocate();
    if (block.ok()) {
      c->blocks.Append(*block);
      copies_.push_back({child, {p.blocks.block(num_shared).value, block->value}, partial});
      c->kv_tokens.insert(c->kv_tokens.end(), p.kv_tokens.begin() + num_shared * block_size,
                          p.kv_tokens.begin() + num_shared * block_size + partial);
    }
  }
  states_.emplace(child, std::move(c));
  return absl::OkStatus();
}

void DraftModelSpeculator::CopyForkedKv() {
  if (copies_.empty()) return;
  const int32_t bs = runner_->block_size();
  std::vector<KvSlotMove> moves;
  for (const ForkCopy& c : copies_) {
    for (int32_t i = 0; i < c.num_slots; ++i) moves.push_back({c.table, i, bs + i});
  }
  if (absl::Status s = runner_->MoveKv(moves); !s.ok()) {
    // The children recompute the block instead (their catch-up starts at its first position).
    SPECD_LOG_WARN("draft model: copying forked KV failed ({}); recomputing it", s.ToString());
    for (const ForkCopy& c : copies_) {
      auto it = states_.find(c.child);
      if (it == states_.end()) continue;
      State& state = *it->second;
      const int32_t start = (static_cast<int32_t>(state.kv_tokens.size()) - 1) / bs * bs;
      state.kv_tokens.resize(
          std::max(0, std::min(start, static_cast<int32_t>(state.kv_tokens.size()))));
    }
  }
  copies_.clear();
}

absl::Status DraftModelSpeculator::Adopt(uint64_t parent, uint64_t child) {
  auto it = states_.find(child);
  if (it == states_.end() || it->second == nullptr) {
    return absl::NotFoundError(absl::StrCat("draft model: no sequence ", child, " to adopt"));
  }
  std::unique_ptr<State> adopted = std::move(it->second);
  states_.erase(it);
  Release(parent);  // drops the parent's references; blocks the child shares stay allocated
  states_[parent] = std::move(adopted);
  return absl::OkStatus();
}

int32_t DraftModelSpeculator::WritableStart(const State& state, int32_t start) const {
  const int32_t block_size = state.blocks.block_size();
  const int32_t b = start / block_size;
  // An aligned start keeps no part of block b (Truncate drops it); a start inside a block
  // keeps it and writes into it, which a block shared with a fork must never see.
  if (start % block_size != 0 && b < state.blocks.num_blocks() &&
      allocator_.ref_count(state.blocks.block(b)) > 1) {
    return b * block_size;
  }
  return start;
}

int32_t DraftModelSpeculator::kv_length(uint64_t seq_id) const {
  auto it = states_.find(seq_id);
  return it == states_.end() ? 0 : static_cast<int32_t>(it->second->kv_tokens.size());
}

void DraftModelSpeculator::RollBack(State& state, int32_t num_valid) {
  const int32_t start = WritableStart(state, num_valid);
  state.kv_tokens.resize(start);
  state.blocks.Truncate(start, allocator_).IgnoreError();  // only frees blocks it holds
}

void DraftModelSpeculator::OnVerified(std::span<const VerifiedRound> rounds) {
  for (const VerifiedRound& r : rounds) {
    auto it = states_.find(r.seq_id);
    if (it == states_.end() || it->second->num_context < 0) continue;
    State& state = *it->second;
    // Valid: the context, then the accepted drafts whose KV was computed (kv_tokens ends at
    // d_{k-1}, or earlier when the Propose stopped early).
    const int32_t num_valid = std::min(static_cast<int32_t>(state.kv_tokens.size()),
                                       state.num_context + std::max(r.num_accepted, 0));
    RollBack(state, num_valid);
    state.num_context = -1;
  }
}

bool DraftModelSpeculator::Prepare(const DraftInput& in, State& state, int32_t num_drafts,
                                   Active* active) {
  const int32_t n = static_cast<int32_t>(in.tokens.size());
  state.num_context = -1;
  // Decode inputs d_1 .. d_{k-1} sit at positions n .. n + k - 2.
  num_drafts = std::min(num_drafts, runner_->max_model_len() - n + 1);
  if (n == 0 || num_drafts <= 0) return false;
  // OnVerified already rolled back a told outcome; the common prefix guards the rest (forked
  // branches, whose callers tell nothing, and sequences changed otherwise).
  RollBack(state, std::min(CommonPrefix(state.kv_tokens, in.tokens), n - 1));
  if (!state.blocks.EnsureCapacity(n + num_drafts - 1, allocator_).ok()) {
    state.blocks.Release(allocator_).IgnoreError();
    state.kv_tokens.clear();
    return false;
  }
  state.num_context = n;
  if (!state.seeded) {
    state.rng.seed(in.seed ^ kDraftSeedSalt);  // the same request, the same drafts
    state.seeded = true;
  }
  active->state = &state;
  active->pending.assign(in.tokens.begin() + static_cast<std::ptrdiff_t>(state.kv_tokens.size()),
                         in.tokens.end());
  active->offset = 0;
  active->num_wanted = num_drafts;
  return true;
}

void DraftModelSpeculator::AppendGreedyDraft(const DraftInput& in, const CacheDraftOptions& cache,
                                             int32_t token, std::vector<int32_t> top,
                                             Draft& draft) const {
  if (replay_ != nullptr) token = replay_->Draft(in.tokens, draft.tokens, token);
  if (cache.num_candidates > 0) {
    const size_t at = draft.candidates.size();
    AppendCandidates(std::move(top), token, draft);
    if (replay_ != nullptr) {
      replay_->Candidates(in.tokens, draft.tokens,
                          std::span<int32_t>(draft.candidates).subspan(at));
    }
  }
  draft.tokens.push_back(token);
}

void DraftModelSpeculator::DrawDraft(const DraftInput& in, const CacheDraftOptions& cache,
                                     State& state, std::span<const float> logits, Draft& draft) {
  const int32_t j = static_cast<int32_t>(draft.tokens.size());
  std::span<const int32_t> banned =
      j < in.num_banned_positions ? in.banned : std::span<const int32_t>();
  probs_.resize(logits.size());
  ProcessedProbs(*in.params, logits, *in.history, draft.tokens, banned, probs_);
  if (in.params->greedy()) {  // a one-hot row at the argmax (lowest id on ties, as Argmax)
    const auto token =
        static_cast<int32_t>(std::max_element(probs_.begin(), probs_.end()) - probs_.begin());
    AppendGreedyDraft(
        in, cache, token,
        cache.num_candidates > 0 ? TopF(logits, cache.num_candidates) : std::vector<int32_t>(),
        draft);
    return;
  }
  if (cache.num_candidates > 0) AppendCandidates(TopF(probs_, cache.num_candidates), -1, draft);
  if (SaguaroSampling(cache)) {
    // Saguaro sampling: draw from the row with its top-F ids down-weighted by C, and hand that
    // row on as q (verification with the drawn-from row keeps the output the target's).
    SaguaroDownweight(probs_, TopF(probs_, cache.saguaro_fan_out), cache.saguaro_c);
  }
  draft.tokens.push_back(DrawFromProbs(probs_, state.rng));
  draft.probs.insert(draft.probs.end(), probs_.begin(), probs_.end());
}

absl::Status DraftModelSpeculator::Propose(std::span<const DraftInput> inputs,
                                           std::vector<Draft>* drafts) {
  return Propose(inputs, {}, drafts, {});
}

absl::Status DraftModelSpeculator::Propose(std::span<const DraftInput> inputs,
                                           std::vector<Draft>* drafts,
                                           const std::function<bool()>& stop) {
  return Propose(inputs, {}, drafts, stop);
}

absl::Status DraftModelSpeculator::Propose(std::span<const DraftInput> inputs,
                                           std::span<const CacheDraftOptions> cache,
                                           std::vector<Draft>* drafts,
                                           const std::function<bool()>& stop) {
  if (!cache.empty() && cache.size() != inputs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft model: ", cache.size(), " cache options for ", inputs.size(), " inputs"));
  }
  drafts->resize(inputs.size());
  for (Draft& d : *drafts) d.Reset();
  CopyForkedKv();
  const bool trees = cache.empty() && TreesHere();
  if (trees) SPECD_RETURN_IF_ERROR(ProposeTrees(inputs, drafts));
  active_.clear();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const DraftInput& in = inputs[i];
    if (in.num_draft_tokens <= 0 || in.params == nullptr || in.history == nullptr) continue;
    if (in.wants_tree() && trees) continue;  // drafted by ProposeTrees
    // A tree this runner cannot grow: a chain of the tree's depth.
    const int32_t num_drafts =
        in.wants_tree() ? std::min(in.num_draft_tokens, in.tree_depth) : in.num_draft_tokens;
    std::unique_ptr<State>& state = states_[in.seq_id];
    if (state == nullptr) state = std::make_unique<State>(runner_->block_size());
    Active a;
    a.input = i;
    if (!cache.empty()) a.cache = cache[i];
    if (Prepare(in, *state, num_drafts, &a)) active_.push_back(std::move(a));
  }
  if (parallel()) {
    device_round_ = false;  // the drafts are drawn pass by pass (RunParallelPass)
    parallel_slots_ = PlanParallelSlots(inputs);
    while (!active_.empty()) {
      if (stop && stop()) {
        active_.clear();
        break;
      }
      SPECD_RETURN_IF_ERROR(RunParallelPass(inputs, drafts));
    }
  } else {
    device_round_ = PlanDeviceRound(inputs);
    while (!active_.empty()) {
      if (stop && stop()) {
        active_.clear();
        break;
      }
      SPECD_RETURN_IF_ERROR(RunPass(inputs, drafts));
    }
    if (device_round_) {
      for (size_t i = 0; i < inputs.size(); ++i) {
        Draft& d = (*drafts)[i];
        if (slot_base_[i] >= 0 && !d.tokens.empty() && !inputs[i].params->greedy()) {
          d.device_probs = runner_->prob_slot(slot_base_[i]);
        }
      }
    }
  }
  // SSD's cache keeps drafts past the next Propose, which reuses the slots: their q rows move
  // to kept rows on the device, or to the host.
  return cache.empty() ? absl::OkStatus() : KeepProbs(*drafts);
}

absl::Status DraftModelSpeculator::KeepProbsOnDevice(int32_t rows_per_block, int32_t num_blocks) {
  kept_.reset();
  if (!runner_->SamplesSpeculationOnDevice() || rows_per_block < 1 || num_blocks < 1) {
    return absl::OkStatus();
  }
  kept_ = std::make_shared<KeptPool>();
  kept_->rows_per_block = rows_per_block;
  kept_->num_blocks = num_blocks;
  for (int32_t b = num_blocks - 1; b >= 0; --b) kept_->free.push_back(b);
  return absl::OkStatus();
}

absl::Status DraftModelSpeculator::ReadKeptProbs(const KeptProbs& kept,
                                                 std::vector<float>* probs) const {
  probs->resize(static_cast<size_t>(kept.num_rows) *
                static_cast<size_t>(runner_->config().vocab_size));
  return runner_->ReadKeptRows(kept.first_row, kept.num_rows, *probs);
}

absl::Status DraftModelSpeculator::KeepProbs(std::vector<Draft>& drafts) {
  if (kept_ != nullptr && !kept_->reserved &&
      std::any_of(drafts.begin(), drafts.end(),
                  [](const Draft& d) { return d.device_probs != nullptr; })) {
    // The rows are reserved with the first sampled branch: a server that only sees greedy
    // requests never holds them.
    if (absl::Status s = runner_->ReserveKeptRows(kept_->rows_per_block * kept_->num_blocks);
        !s.ok()) {
      SPECD_LOG_WARN("draft model: {}; cached q rows stay on the host", s.ToString());
      kept_.reset();
    } else {
      kept_->reserved = true;
    }
  }
  for (size_t i = 0; kept_ != nullptr && i < drafts.size(); ++i) {
    Draft& d = drafts[i];
    const auto n = static_cast<int32_t>(d.tokens.size());
    if (d.device_probs == nullptr || n > kept_->rows_per_block || kept_->free.empty()) continue;
    const int32_t block = kept_->free.back();
    const int32_t first_row = block * kept_->rows_per_block;
    SPECD_RETURN_IF_ERROR(runner_->KeepProbSlots(slot_base_[i], n, first_row));
    kept_->free.pop_back();
    // The handle gives the block back to the pool (which it keeps alive) when the last draft
    // holding it goes.
    auto* rows = new KeptProbs;
    rows->first_row = first_row;
    rows->num_rows = n;
    d.kept_probs =
        std::shared_ptr<const KeptProbs>(rows, [pool = kept_, block](const KeptProbs* p) {
          pool->free.push_back(block);
          delete p;
        });
    d.device_probs = nullptr;
  }
  int32_t end = 0;
  for (size_t i = 0; i < drafts.size(); ++i) {
    if (drafts[i].device_probs == nullptr) continue;
    end = std::max(end, slot_base_[i] + static_cast<int32_t>(drafts[i].tokens.size()));
  }
  if (end == 0) return absl::OkStatus();
  const auto vocab = static_cast<size_t>(runner_->config().vocab_size);
  host_probs_.resize(static_cast<size_t>(end) * vocab);
  SPECD_RETURN_IF_ERROR(runner_->ReadProbSlots(0, end, host_probs_));
  for (size_t i = 0; i < drafts.size(); ++i) {
    Draft& d = drafts[i];
    if (d.device_probs == nullptr) continue;
    const auto first = host_probs_.begin() + static_cast<std::ptrdiff_t>(slot_base_[i] * vocab);
    d.probs.assign(first, first + static_cast<std::ptrdiff_t>(d.tokens.size() * vocab));
    d.device_probs = nullptr;
  }
  return absl::OkStatus();
}

bool DraftModelSpeculator::PlanDeviceRound(std::span<const DraftInput> inputs) {
  if (!runner_->SamplesSpeculationOnDevice()) return false;
  bool sampled = false;
  for (const Active& a : active_) {
    const bool greedy = inputs[a.input].params->greedy();
    // A greedy row's candidates rank its raw logits (the runner's Step, or the host), which a
    // device draw does not see; sampled rows' rank the processed row, as the device does.
    if (greedy && a.cache.num_candidates > 0) return false;
    if (a.cache.num_candidates > kMaxSampleCandidates ||
        (SaguaroSampling(a.cache) && a.cache.saguaro_fan_out > kMaxSampleCandidates)) {
      return false;
    }
    sampled = sampled || !greedy;
  }
  if (!sampled) return false;
  slot_base_.assign(inputs.size(), -1);
  int32_t num_slots = 0;
  for (const Active& a : active_) {
    slot_base_[a.input] = num_slots;
    num_slots += a.num_wanted;
  }
  if (absl::Status s = runner_->ReserveProbSlots(num_slots); !s.ok()) {
    SPECD_LOG_WARN("draft model: {}; drafting this round on the host", s.ToString());
    return false;
  }
  return true;
}

int32_t DraftModelSpeculator::PlanParallelSlots(std::span<const DraftInput> inputs) {
  slot_base_.assign(inputs.size(), -1);
  if (!runner_->SamplesSpeculationOnDevice()) return 0;
  bool sampled = false, cache = false;
  for (const Active& a : active_) {
    sampled = sampled || !inputs[a.input].params->greedy();
    cache = cache || a.cache.num_candidates > 0 || a.cache.saguaro_fan_out > 0;
  }
  if (cache && !sampled) return 0;  // greedy cache branches: the runner's Step ranks them
  // Every sequence's rows get their own slots for the whole Propose: a later pass (after a long
  // catch-up) must not overwrite the q rows of an earlier one.
  const auto max_rows = static_cast<int32_t>(runner_->max_sample_rows());
  int32_t num_slots = 0;
  for (const Active& a : active_) {
    slot_base_[a.input] = num_slots;
    num_slots +=
        std::min({a.num_wanted, max_tokens_per_forward_, max_rows});  // RunParallelPass's cap
  }
  if (num_slots == 0) return 0;
  if (absl::Status s = runner_->ReserveProbSlots(num_slots); !s.ok()) {
    SPECD_LOG_WARN("draft model: {}; drafting this round on the host", s.ToString());
    slot_base_.assign(inputs.size(), -1);
    return 0;
  }
  return num_slots;
}

absl::Status DraftModelSpeculator::DevicePass(std::span<const DraftInput> inputs,
                                              const std::vector<Draft>& drafts) {
  rows_.clear();
  slots_.clear();
  int32_t chunk = 0;
  for (Active& a : active_) {
    a.row = -1;
    if (a.num_running == 0) continue;
    const int32_t c = chunk++;
    if (a.offset + a.num_running != a.pending.size()) continue;  // catch-up still running
    const DraftInput& in = inputs[a.input];
    const Draft& draft = drafts[a.input];
    const auto j = static_cast<int32_t>(draft.tokens.size());
    if (a.state->sampler == nullptr) a.state->sampler = std::make_unique<Sampler>(*in.params, 0);
    SampleRow row;
    row.chunk = c;
    row.sampler = a.state->sampler.get();
    row.params = in.params;
    row.history = in.history;
    row.pending = draft.tokens;
    if (j < in.num_banned_positions) row.banned = in.banned;
    row.seed = in.seed;
    row.num_generated = in.num_generated + j;
    SetCacheRow(in, a.cache, row);
    a.row = static_cast<int32_t>(rows_.size());
    rows_.push_back(row);
    slots_.push_back(slot_base_[a.input] + j);
  }
  if (rows_.empty()) return runner_->Forward(batch_, &logits_);  // catch-up only: KV, no draw
  return runner_->StepDraft(batch_, rows_, slots_, &drawn_);
}

absl::Status DraftModelSpeculator::ForwardPass(std::span<const DraftInput> inputs,
                                               const std::vector<Draft>& drafts, bool* drawn) {
  // Greedy passes sample on the runner: every row ends its sequence's pending tokens and no
  // draft position is banned (min_tokens), so the runner's argmax is the processed one; the
  // runner also ranks SSD's candidates (on a GPU: only ids come back). Sampled rows need their
  // logits on the host: their passes run Forward.
  bool greedy = true;
  for (const Active& a : active_) {
    const DraftInput& in = inputs[a.input];
    const bool finishing = a.num_running > 0 && a.offset + a.num_running == a.pending.size();
    const bool in_pass = a.num_running > 0;
    greedy &= !in_pass || (finishing && in.params->greedy() && in.num_banned_positions == 0 &&
                           a.cache.num_candidates <= kMaxSampleCandidates);
  }
  *drawn = greedy || device_round_;
  if (!greedy && device_round_) return DevicePass(inputs, drafts);
  if (!greedy) {
    int32_t row = 0;
    for (Active& a : active_) a.row = a.num_running > 0 ? row++ : -1;
    return runner_->Forward(batch_, &logits_);
  }
  rows_.clear();
  int32_t chunk = 0;
  for (Active& a : active_) {
    a.row = -1;
    if (a.num_running == 0) continue;
    a.row = chunk;
    const DraftInput& in = inputs[a.input];
    if (a.state->sampler == nullptr) a.state->sampler = std::make_unique<Sampler>(*in.params, 0);
    SampleRow row;
    row.chunk = chunk++;
    row.sampler = a.state->sampler.get();
    row.params = in.params;
    row.history = in.history;
    row.seed = in.seed;
    row.num_candidates = a.cache.num_candidates;
    rows_.push_back(row);
  }
  return runner_->Step(batch_, rows_, &drawn_);
}

absl::Status DraftModelSpeculator::RunPass(std::span<const DraftInput> inputs,
                                           std::vector<Draft>* drafts) {
  batch_.clear();
  size_t budget = static_cast<size_t>(max_tokens_per_forward_);
  // At most max_sample_rows sequences per pass (each gives at most one row): SSD's branches can
  // outnumber what one Step draws; the rest run in the next pass.
  auto rows_left = static_cast<size_t>(runner_->max_sample_rows());
  for (Active& a : active_) {
    a.num_running = rows_left == 0 ? 0 : std::min(a.pending.size() - a.offset, budget);
    budget -= a.num_running;
    if (a.num_running == 0) continue;
    --rows_left;
    SequenceInput s;
    s.tokens = std::span<const int32_t>(a.pending).subspan(a.offset, a.num_running);
    s.start_pos = static_cast<int32_t>(a.state->kv_tokens.size());
    s.block_table = a.state->blocks.ids();
    batch_.push_back(s);
  }
  bool drawn = false;
  if (absl::Status s = ForwardPass(inputs, *drafts, &drawn); !s.ok()) {
    for (const Active& a : active_) Release(inputs[a.input].seq_id);
    active_.clear();
    return absl::InternalError(absl::StrCat("draft model forward failed: ", s.message()));
  }
  const size_t vocab = static_cast<size_t>(runner_->config().vocab_size);
  size_t kept = 0;
  for (size_t i = 0; i < active_.size(); ++i) {
    Active& a = active_[i];
    bool done = false;
    if (a.num_running > 0) {
      const auto ran = a.pending.begin() + static_cast<std::ptrdiff_t>(a.offset);
      a.state->kv_tokens.insert(a.state->kv_tokens.end(), ran,
                                ran + static_cast<std::ptrdiff_t>(a.num_running));
      a.offset += a.num_running;
      if (a.offset == a.pending.size()) {  // the row gives the next draft
        Draft& draft = (*drafts)[a.input];
        const auto row = static_cast<size_t>(a.row);
        if (drawn && !inputs[a.input].params->greedy()) {  // a device round's sampled draw
          if (a.cache.num_candidates > 0) {
            AppendCandidates(std::move(drawn_[row].candidates), -1, draft);
          }
          draft.tokens.push_back(drawn_[row].id);
        } else if (drawn) {
          AppendGreedyDraft(inputs[a.input], a.cache, drawn_[row].id,
                            std::move(drawn_[row].candidates), draft);
        } else {
          DrawDraft(inputs[a.input], a.cache, *a.state,
                    std::span<const float>(logits_).subspan(row * vocab, vocab), draft);
        }
        a.pending.assign(1, draft.tokens.back());
        a.offset = 0;
        done = --a.num_wanted == 0;
      }
    }
    if (done) continue;
    if (kept != i) active_[kept] = std::move(a);
    ++kept;
  }
  active_.resize(kept);
  return absl::OkStatus();
}

absl::Status DraftModelSpeculator::RunParallelPass(std::span<const DraftInput> inputs,
                                                   std::vector<Draft>* drafts) {
  batch_.clear();
  chunks_.resize(active_.size());
  auto budget = static_cast<size_t>(max_tokens_per_forward_);
  // A finishing chunk draws num_wanted rows; one pass draws at most max_sample_rows (SSD's
  // cache builds run many branches at once): the rest finish in the next pass.
  const auto max_rows = static_cast<int32_t>(runner_->max_sample_rows());
  int32_t rows_left = max_rows;
  for (size_t i = 0; i < active_.size(); ++i) {
    Active& a = active_[i];
    // Draft j >= 1 reads the row of mask j; at most one forward's (and one draw's) worth.
    a.num_wanted = std::min({a.num_wanted, max_tokens_per_forward_, max_rows});
    const size_t remaining = a.pending.size() - a.offset;
    const auto masks = static_cast<size_t>(a.num_wanted - 1);
    const bool finishing = remaining + masks <= budget && a.num_wanted <= rows_left;
    if (finishing) rows_left -= a.num_wanted;
    // A catch-up piece leaves the last token for the pass that draws (its row is draft 1's).
    a.num_running = finishing ? remaining : std::min(remaining - 1, budget);
    a.row = finishing ? 0 : -1;  // 0: this pass draws its drafts
    if (a.num_running == 0) continue;
    std::vector<int32_t>& chunk = chunks_[i];
    chunk.assign(a.pending.begin() + static_cast<std::ptrdiff_t>(a.offset),
                 a.pending.begin() + static_cast<std::ptrdiff_t>(a.offset + a.num_running));
    if (finishing) chunk.insert(chunk.end(), masks, parallel_mask_);
    budget -= chunk.size();
    SequenceInput s;
    s.tokens = chunk;
    s.start_pos = static_cast<int32_t>(a.state->kv_tokens.size());
    s.block_table = a.state->blocks.ids();
    s.all_logits = finishing;
    batch_.push_back(s);
  }
  // On a device that samples (the CUDA runner), the finishing chunks' K rows are drawn there
  // (StepDraft: q stays in the probability slots PlanParallelSlots reserved) and only ids come
  // back, unless a row has penalties (draft j's would count drafts 0..j-1, drawn in the same
  // pass). SSD's cache passes (candidates per row) whose rows are all greedy rank and draw them
  // with the runner's Step (ids and candidates come back); all sampled, with StepDraft, which
  // ranks the processed rows and applies Saguaro sampling there; a mix draws on the host, where
  // DrawDraft gives both.
  bool device = parallel_slots_ > 0;  // PlanParallelSlots reserved every sequence's slots
  bool ranked = true;   // every finishing row greedy, unbanned, candidates the runner can rank
  bool sampled = true;  // every finishing row sampled (its candidates rank the processed row)
  bool any_cache = false;
  int32_t num_slots = 0;
  for (const Active& a : active_) {
    if (a.num_running == 0 || a.row < 0) continue;
    const DraftInput& in = inputs[a.input];
    device = device && !in.params->has_penalties() && slot_base_[a.input] >= 0;
    const bool wants = a.cache.num_candidates > 0 || a.cache.saguaro_fan_out > 0;
    any_cache = any_cache || wants;
    ranked = ranked && in.params->greedy() && in.num_banned_positions == 0 &&
             a.cache.num_candidates <= kMaxSampleCandidates;
    sampled = sampled && !in.params->greedy() && a.cache.num_candidates <= kMaxSampleCandidates &&
              a.cache.saguaro_fan_out <= kMaxSampleCandidates;
    num_slots += a.num_wanted;
  }
  const bool step = any_cache && ranked && num_slots > 0;
  // (More rows than the draft runner draws at once, a request's K above the server's, greedy and
  // sampled rows with candidates in one pass: the host.)
  device = !step && (!any_cache || sampled) && device && num_slots > 0 &&
           num_slots <= runner_->max_sample_rows();
  absl::Status status;
  if (step || device) {
    // Every finishing chunk's rows: draft j from the row of the context's last token + j.
    rows_.clear();
    slots_.clear();
    int32_t chunk = 0;
    for (Active& a : active_) {
      if (a.num_running == 0) continue;
      const int32_t c = chunk++;
      batch_[c].all_logits = false;
      if (a.row < 0) continue;
      const DraftInput& in = inputs[a.input];
      if (a.state->sampler == nullptr) a.state->sampler = std::make_unique<Sampler>(*in.params, 0);
      a.row = static_cast<int32_t>(rows_.size());
      for (int32_t j = 0; j < a.num_wanted; ++j) {
        SampleRow row;
        row.chunk = c;
        row.token = static_cast<int32_t>(a.num_running) - 1 + j;
        row.sampler = a.state->sampler.get();
        row.params = in.params;
        row.history = in.history;
        if (j < in.num_banned_positions) row.banned = in.banned;
        row.seed = in.seed;
        row.num_generated = in.num_generated + j;
        if (step) {
          row.num_candidates = a.cache.num_candidates;
        } else {
          SetCacheRow(in, a.cache, row);
        }
        rows_.push_back(row);
        if (device) slots_.push_back(slot_base_[a.input] + j);
      }
    }
    status = step ? runner_->Step(batch_, rows_, &drawn_)
                  : runner_->StepDraft(batch_, rows_, slots_, &drawn_);
  } else {
    status = runner_->Forward(batch_, &logits_);
  }
  if (!status.ok()) {
    for (const Active& a : active_) Release(inputs[a.input].seq_id);
    active_.clear();
    return absl::InternalError(absl::StrCat("draft model forward failed: ", status.message()));
  }
  const size_t vocab = static_cast<size_t>(runner_->config().vocab_size);
  size_t row = 0;  // the pass's first logits row of the chunk at hand
  size_t kept = 0;
  for (size_t i = 0; i < active_.size(); ++i) {
    Active& a = active_[i];
    if (a.num_running == 0) {
      if (kept != i) active_[kept] = std::move(a);
      ++kept;
      continue;
    }
    const auto ran = a.pending.begin() + static_cast<std::ptrdiff_t>(a.offset);
    a.state->kv_tokens.insert(a.state->kv_tokens.end(), ran,
                              ran + static_cast<std::ptrdiff_t>(a.num_running));
    a.offset += a.num_running;
    if (a.row < 0) {  // a catch-up piece: only its last row came back
      row += 1;
      if (kept != i) active_[kept] = std::move(a);
      ++kept;
      continue;
    }
    const DraftInput& in = inputs[a.input];
    Draft& draft = (*drafts)[a.input];
    if (step) {
      for (int32_t j = 0; j < a.num_wanted; ++j) {
        SampleResult& r = drawn_[static_cast<size_t>(a.row + j)];
        AppendGreedyDraft(in, a.cache, r.id, std::move(r.candidates), draft);
      }
      continue;
    }
    if (device) {
      for (int32_t j = 0; j < a.num_wanted; ++j) {
        SampleResult& r = drawn_[static_cast<size_t>(a.row + j)];
        int32_t token = r.id;
        if (in.params->greedy() && replay_ != nullptr) {
          token = replay_->Draft(in.tokens, draft.tokens, token);
        }
        if (!in.params->greedy() && a.cache.num_candidates > 0) {
          AppendCandidates(std::move(r.candidates), -1, draft);
        }
        draft.tokens.push_back(token);
      }
      if (!in.params->greedy()) draft.device_probs = runner_->prob_slot(slot_base_[a.input]);
      continue;
    }
    const size_t first = row + a.num_running - 1;  // the context's last token
    for (int32_t j = 0; j < a.num_wanted; ++j) {
      DrawDraft(in, a.cache, *a.state, std::span<const float>(&logits_[(first + j) * vocab], vocab),
                draft);
    }
    row += chunks_[i].size();
  }
  active_.resize(kept);
  return absl::OkStatus();
}

}  // namespace specd
