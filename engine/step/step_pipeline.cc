// The step pipeline (step_pipeline.h). Engine thread only.
#include "engine/step/step_pipeline.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/monotonic_clock.h"
#include "engine/base/status.h"
#include "engine/speculation/eagle3.h"
#include "engine/speculation/ssd/ssd_speculator.h"
#include "engine/speculation/vegas.h"
#include "engine/step/auto_strategy.h"
#include "engine/step/speculator_set.h"

namespace specd {
namespace {

// Requests pinned to the EAGLE-3 head, and `auto` requests the policy may move to it.
bool HeadMayDraft(const ResolvedSpeculation& spec) {
  return spec.method == SpeculationMethod::kEagle3 ||
         (spec.method == SpeculationMethod::kAuto && !spec.Forbids(SpeculationMethod::kEagle3));
}

// A tree a speculator proposed fits what was asked: a parent per draft, each -1 or earlier, no
// more nodes than asked and no path deeper than the tree's depth.
bool ValidTreeDraft(const Draft& d, const DraftInput& in) {
  if (d.parents.size() != d.tokens.size() ||
      d.tokens.size() > static_cast<size_t>(in.num_draft_tokens) || !in.wants_tree() ||
      !ValidateTreeParents(d.parents).ok()) {
    return false;
  }
  std::vector<int32_t> depths;
  TreeDepths(d.parents, &depths);
  return std::all_of(depths.begin(), depths.end(),
                     [&](int32_t depth) { return depth < in.tree_depth; });
}

}  // namespace

StepPipeline::StepPipeline(const StepPipelineOptions& options, ModelRunner* runner,
                           SpeculatorSet* speculators, AutoStrategy* strategy,
                           const Tokenizer* tokenizer)
    : options_(options),
      runner_(runner),
      speculators_(speculators),
      strategy_(strategy),
      tokenizer_(tokenizer),
      blocks_(options.num_kv_blocks, options.block_size, options.enable_prefix_caching),
      scheduler_({options.max_num_seqs, options.max_num_batched_tokens}, &blocks_) {
  verifiers_.push_back(std::make_unique<GreedyVerifier>(runner));
  verifiers_.push_back(std::make_unique<SampledVerifier>(runner));
  verifiers_.push_back(std::make_unique<HostVerifier>(runner));
}

StepPipeline::~StepPipeline() = default;

LiveRequest& StepPipeline::Add(RequestId id, GenerateRequest request,
                               const ResolvedSpeculation& spec, OutputCallback on_output,
                               absl::Time arrival) {
  auto owned =
      std::make_unique<LiveRequest>(id, std::move(request), spec, options_.block_size, tokenizer_);
  LiveRequest& r = *owned;
  // Lossy SSV verification writes KV that is not the model's: only the prompt's (prefilled
  // exactly) may serve other requests from the prefix cache.
  if (spec.enabled() && spec.ssv.lossy()) r.seq.set_num_shareable_tokens(r.seq.num_prompt_tokens());
  // The EAGLE-3 head needs its entries at every position it attends: a head whose KV lives in
  // the target's blocks reads cached blocks it wrote (and marks those it writes); one that keeps
  // a cache per sequence never sees a cached position's hidden states, so the target computes
  // the whole prompt.
  if (const Eagle3Speculator* head = speculators_->eagle3();
      head != nullptr && HeadMayDraft(spec)) {
    if (head->reads_prefix_cache()) {
      r.seq.set_head_kv(true);
    } else {
      r.seq.set_reuses_cached_prefix(false);
    }
  }
  // A head in SSD's speculator has a cache of its own: the same, across the process boundary.
  if (SsdHeadMayDraft(spec)) r.seq.set_reuses_cached_prefix(false);
  r.on_output = std::move(on_output);
  r.arrival = arrival;
  scheduler_.Add(&r.seq);
  live_[id] = std::move(owned);
  return r;
}

LiveRequest* StepPipeline::Find(RequestId id) {
  auto it = live_.find(id);
  return it != live_.end() ? it->second.get() : nullptr;
}

void StepPipeline::SetPaused(RequestId id, bool paused) {
  if (LiveRequest* r = Find(id)) scheduler_.SetPaused(&r->seq, paused);
}

void StepPipeline::Finish(LiveRequest& r, FinishReason reason, absl::Status status, absl::Time now,
                          std::vector<GeneratedToken> tokens, std::string text) {
  scheduler_.Finish(&r.seq);
  // Every speculator that drafted for it (`auto` may have used several) drops its state.
  speculators_->Release(r.id, r.used_speculators);
  if (r.used_policy) strategy_->Forget(r.id);
  if (options_.observer != nullptr) {
    options_.observer->OnRequestFinished(r.FinishMetrics(reason, status, now));
  }
  if (!status.ok()) {
    SPECD_LOG_DEBUG("engine: request {} ({}) ended: {}", r.id, r.request.request_id,
                    status.ToString());
  }
  r.Emit(on_token_, std::move(tokens), std::move(text), true, reason, std::move(status));
  live_.erase(r.id);
}

void StepPipeline::FinishAll(const absl::Status& status) {
  std::vector<RequestId> ids;
  for (const auto& [id, r] : live_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  const absl::Time now = absl::Now();
  for (RequestId id : ids) Finish(*live_[id], FinishReason::kAbort, status, now);
}

void StepPipeline::NoteScheduled(const StepPlan& plan, absl::Time now) {
  for (const Sequence* seq : plan.admitted) {
    LiveRequest& r = *live_.find(seq->id().value)->second;
    if (!r.first_scheduled) r.first_scheduled = now;
  }
  if (!plan.preempted.empty()) {
    SPECD_LOG_DEBUG("engine: preempted {} sequences (KV full)", plan.preempted.size());
  }
  EngineObserver* observer = options_.observer;
  if (observer == nullptr) return;
  if (plan.num_queried_blocks > 0)
    observer->OnPrefixCache(plan.num_queried_blocks, plan.num_hit_blocks);
  if (!plan.preempted.empty()) {
    observer->OnPreemption(static_cast<int32_t>(plan.preempted.size()));
  }
}

bool StepPipeline::CommitToken(LiveRequest& r, SampleResult sampled, absl::Time now) {
  LiveRequest::Committed c = r.Commit(
      std::move(sampled), now, {&options_.eos_ids, options_.max_model_len, options_.observer});
  if (c.finished) {
    Finish(r, c.reason, absl::OkStatus(), now, std::move(c.token), std::move(c.text));
    return true;
  }
  r.Emit(on_token_, std::move(c.token), std::move(c.text), false, FinishReason::kLength,
         absl::OkStatus());
  return false;
}

absl::StatusOr<bool> StepPipeline::Run(const std::function<void()>& on_scheduled) {
  step_start_ = absl::Now();
  step_start_ns_ = MonotonicNanos();
  // Prepare.
  const StepPlan plan = scheduler_.Schedule();
  NoteScheduled(plan, absl::Now());
  if (plan.empty()) return false;
  // Admissions changed the queue: publish before any token is streamed, so that a client
  // reacting to its first token sees the waiting count without it.
  if (on_scheduled) on_scheduled();
  PlanSampling(plan);
  strategy_->Choose(plan, rows_, row_requests_, scheduler_.num_waiting());
  // Speculate.
  Speculate(plan);
  // Verify.
  Verifier& verifier = ChooseVerifier();
  BuildBatch(plan, verifier.wants_all_logits());
  const absl::Time verify_start = absl::Now();
  const int64_t verify_start_ns = MonotonicNanos();
  const absl::Status s =
      verifier.Verify(VerifyInput{batch_, rows_, drafts_, acceptors_}, &outcomes_);
  verify_seconds_ = absl::ToDoubleSeconds(absl::Now() - verify_start);
  SsdSpeculator::EngineRoundSeconds ssd_round;
  ssd_round.sampling = verifier.last_sampling_seconds();
  ssd_round.verify =
      std::max(0.0, NanosToSeconds(verify_start_ns, MonotonicNanos()) - ssd_round.sampling);
  if (!s.ok()) {
    // A tensor-parallel group that lost a rank says so (Unavailable, naming the rank): that is
    // what every request of the step ends with; anything else is an internal failure.
    const absl::Status group = runner_->GroupStatus();
    const absl::Status failed =
        !group.ok() ? group : absl::InternalError(absl::StrCat("forward failed: ", s.message()));
    FailStep(plan, failed);
    return failed;
  }
  if (const absl::Status moved = CompactTreeKv(); !moved.ok()) {
    const absl::Status failed =
        absl::InternalError(absl::StrCat("token tree KV compaction failed: ", moved.message()));
    FailStep(plan, failed);
    return failed;
  }
  FeedEagle3();
  FeedSsd();
  // Apply.
  const int64_t commit_start_ns = MonotonicNanos();
  Apply(plan);
  if (SsdSpeculator* ssd = speculators_->ssd(); ssd != nullptr && ssd_proposed_) {
    const int64_t end_ns = MonotonicNanos();
    ssd_round.commit = NanosToSeconds(commit_start_ns, end_ns);
    ssd_round.round = NanosToSeconds(step_start_ns_, end_ns);
    ssd->EndRound(ssd_round);
  }
  return true;
}

void StepPipeline::FailStep(const StepPlan& plan, const absl::Status& failed) {
  for (const ScheduledChunk& chunk : plan.chunks) {
    auto it = live_.find(chunk.seq->id().value);
    if (it != live_.end()) Finish(*it->second, FinishReason::kAbort, failed, absl::Now());
  }
}

absl::Status StepPipeline::CompactTreeKv() {
  kv_moves_.clear();
  for (size_t k = 0; k < rows_.size(); ++k) {
    const std::vector<int32_t>& path = outcomes_[k].path;
    if (path.empty() || drafts_[k].parents.empty()) continue;
    const SequenceInput& chunk = batch_[rows_[k].chunk];
    // Draft j sat in slot start_pos + 1 + j; the i-th accepted one belongs in start_pos + 1 + i.
    for (size_t i = 0; i < path.size(); ++i) {
      const int32_t from = chunk.start_pos + 1 + path[i];
      const int32_t to = chunk.start_pos + 1 + static_cast<int32_t>(i);
      if (from != to) kv_moves_.push_back(KvSlotMove{chunk.block_table, from, to});
    }
  }
  if (kv_moves_.empty()) return absl::OkStatus();
  return runner_->MoveKv(kv_moves_);
}

void StepPipeline::FeedEagle3() {
  Eagle3Speculator* eagle3 = speculators_->eagle3();
  if (eagle3 == nullptr) return;
  eagle3_wanted_.assign(batch_.size(), 0);
  bool any = false;
  for (size_t i = 0; i < batch_.size(); ++i) {
    auto it = live_.find(static_cast<RequestId>(batch_[i].seq_id));
    // Tree chunks too: the head keeps each node's hidden state until its next Propose finds
    // the accepted path (draft-model and n-gram trees are pinned to their method: not wanted).
    if (it == live_.end()) continue;
    // Requests pinned to the head, and `auto` requests the policy may move to it: hidden states
    // a pass does not hand over cannot be had later.
    if (!HeadMayDraft(it->second->spec)) continue;
    eagle3_wanted_[i] = 1;
    it->second->used_speculators |= 1u << DraftMethodIndex(DraftMethod::kEagle3);
    any = true;
  }
  if (!any) return;
  const absl::Status s = eagle3->OnTargetPass(batch_, eagle3_wanted_);
  // The head then has no hidden states for these positions: it drafts less, nothing more.
  if (!s.ok()) SPECD_LOG_WARN("engine: EAGLE-3 head missed a target pass: {}", s.ToString());
}

bool StepPipeline::SsdHeadMayDraft(const ResolvedSpeculation& spec) const {
  const SsdSpeculator* ssd = speculators_->ssd();
  if (ssd == nullptr || !ssd->wants_hidden()) return false;
  return spec.method == SpeculationMethod::kSsd ||
         (spec.method == SpeculationMethod::kAuto && !spec.Forbids(SpeculationMethod::kSsd) &&
          strategy_->MayChoose(DraftMethod::kSsd));
}

void StepPipeline::FeedSsd() {
  SsdSpeculator* ssd = speculators_->ssd();
  if (ssd == nullptr || !ssd->wants_hidden()) return;
  ssd_wanted_.assign(batch_.size(), 0);
  bool any = false;
  for (size_t i = 0; i < batch_.size(); ++i) {
    auto it = live_.find(static_cast<RequestId>(batch_[i].seq_id));
    if (it == live_.end() || !SsdHeadMayDraft(it->second->spec)) continue;
    ssd_wanted_[i] = 1;
    // Its rows wait in the speculator's client until sent: Release must reach it.
    it->second->used_speculators |= 1u << DraftMethodIndex(DraftMethod::kSsd);
    any = true;
  }
  if (!any) return;
  const absl::Status s = ssd->OnTargetPass(batch_, ssd_wanted_, *runner_);
  if (!s.ok()) SPECD_LOG_WARN("engine: the SSD speculator missed a target pass: {}", s.ToString());
}

void StepPipeline::PlanSampling(const StepPlan& plan) {
  rows_.clear();
  row_requests_.clear();
  if (banned_.size() < plan.chunks.size()) banned_.resize(plan.chunks.size());  // no moves
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const Sequence& seq = *plan.chunks[i].seq;
    if (seq.num_computed() + plan.chunks[i].num_new_tokens != seq.num_tokens()) {
      continue;  // a prefill chunk short of the end
    }
    LiveRequest& r = *live_.find(seq.id().value)->second;
    const SamplingParams& p = r.request.params;
    std::vector<int32_t>& banned = banned_[rows_.size()];
    banned.clear();
    if (r.seq.num_generated() < p.min_tokens) {
      banned = p.stop_token_ids;
      if (!p.ignore_eos)
        banned.insert(banned.end(), options_.eos_ids.begin(), options_.eos_ids.end());
    }
    SampleRow row;
    row.chunk = static_cast<int32_t>(i);
    row.sampler = &r.sampler;
    row.params = &p;
    row.history = &r.history;
    row.banned = banned;
    row.seed = r.seed;
    row.num_generated = r.seq.num_generated();
    rows_.push_back(row);
    row_requests_.push_back(&r);
  }
}

void StepPipeline::Speculate(const StepPlan& plan) {
  num_spec_rows_ = 0;
  draft_seconds_ = 0;
  ssd_proposed_ = false;
  drafts_.resize(rows_.size());
  for (Draft& d : drafts_) d.Reset();
  const absl::Time start = absl::Now();
  // Vegas and streaming share one speculator, proposed for once per method.
  for (DraftMethod method : kDraftingMethods) {
    const int m = DraftMethodIndex(method);
    method_seconds_[m] = {SpeculationMethodName(method), 0, 0, 0};
    Speculator* speculator = speculators_->at(method);
    if (speculator == nullptr) continue;
    draft_inputs_.clear();
    draft_rows_.clear();
    for (size_t k = 0; k < rows_.size(); ++k) {
      const ScheduledChunk& chunk = plan.chunks[rows_[k].chunk];
      LiveRequest& r = *row_requests_[k];
      if (chunk.num_lookahead_tokens == 0 || chunk.num_new_tokens != 1 || r.step.method != method) {
        continue;
      }
      const SamplingParams& p = r.request.params;
      const int32_t num_tokens = r.seq.num_tokens();
      // Drafts sit at positions num_tokens .. num_tokens + k - 1; a round commits at most
      // k + 1 tokens, so no more than max_tokens - generated - 1 drafts are useful.
      const int32_t useful = p.max_tokens - r.seq.num_generated() - 1;
      int32_t k_max = std::min({r.step.num_speculative_tokens, chunk.num_lookahead_tokens,
                                options_.max_model_len - num_tokens});
      if (method == DraftMethod::kDraftModel) {
        // The draft's inputs sit at positions up to num_tokens + k - 2, inside its context; a
        // sequence past it decodes on without its drafts (and the usage says where).
        const int32_t context = speculators_->draft_context();
        const int32_t room = context - num_tokens + 1;
        k_max = std::min(k_max, room);
        if (room <= 0 && r.draft_context_stop == 0) {
          r.draft_context_stop = context;
          speculator->Release(r.id);  // its draft KV is of no further use
        }
      }
      // A tree: up to k_max nodes in the lookahead slots, paths no longer than useful. A runner
      // without trees verifies a chain of the tree's depth instead.
      const TreeShape& tree = r.step.tree;
      int32_t depth = 0;
      if (tree.enabled && speculators_->trees_ok()) {
        depth = std::min({tree.depth, useful, k_max});
      } else {
        k_max = std::min({k_max, useful, tree.enabled ? tree.depth : k_max});
      }
      if (k_max <= 0 || (tree.enabled && speculators_->trees_ok() && depth <= 0)) continue;
      DraftInput in;
      in.seq_id = r.id;
      in.tokens = r.seq.tokens();
      in.num_draft_tokens = k_max;
      in.tree_depth = depth;
      in.tree_top_k = depth > 0 ? tree.top_k : 0;
      in.params = &p;
      in.history = &r.history;
      in.banned = rows_[k].banned;
      in.num_banned_positions = std::max(0, p.min_tokens - r.seq.num_generated());
      in.seed = r.seed;
      in.num_generated = r.seq.num_generated();
      in.speculation = &r.step;
      in.block_table = r.seq.blocks().ids();
      in.num_computed = r.seq.num_computed();
      draft_inputs_.push_back(in);
      draft_rows_.push_back(static_cast<int32_t>(k));
      r.used_speculators |= 1u << m;
    }
    if (draft_inputs_.empty()) continue;
    const absl::Time propose_start = absl::Now();
    const absl::Status s = speculator->Propose(draft_inputs_, &proposed_);
    method_seconds_[m].draft = absl::ToDoubleSeconds(absl::Now() - propose_start);
    if (method == DraftMethod::kSsd && speculators_->ssd() != nullptr) {
      ssd_proposed_ = true;
      // Every sequence of the round waited for the speculator's reply.
      const double wait = speculators_->ssd()->last_wait_seconds();
      for (int32_t k : draft_rows_) row_requests_[k]->ssd_wait_seconds += wait;
    }
    if (!s.ok()) {
      SPECD_LOG_WARN("engine: speculation failed, decoding without drafts this step: {}",
                     s.ToString());
      continue;
    }
    for (size_t i = 0; i < draft_inputs_.size(); ++i) {
      Draft& d = proposed_[i];
      if (d.tokens.empty()) continue;
      if (!d.parents.empty() && !ValidTreeDraft(d, draft_inputs_[i])) {
        SPECD_LOG_WARN("engine: {} proposed a malformed tree; decoding without drafts",
                       SpeculationMethodName(method));
        continue;
      }
      d.tokens.resize(std::min<size_t>(d.tokens.size(), draft_inputs_[i].num_draft_tokens));
      std::swap(drafts_[draft_rows_[i]], d);
      ++num_spec_rows_;
    }
  }
  draft_seconds_ = absl::ToDoubleSeconds(absl::Now() - start);
}

Verifier& StepPipeline::ChooseVerifier() {
  for (const std::unique_ptr<Verifier>& v : verifiers_) {
    if (v->Fits(rows_, drafts_)) return *v;
  }
  return *verifiers_.back();  // the host verifier takes anything
}

void StepPipeline::BuildBatch(const StepPlan& plan, bool all_logits) {
  // Each chunk's drafted row, if any (a drafted decode is its sequence's only sample row).
  chunk_row_.assign(plan.chunks.size(), -1);
  for (size_t k = 0; k < rows_.size(); ++k) {
    if (!drafts_[k].tokens.empty()) chunk_row_[rows_[k].chunk] = static_cast<int32_t>(k);
  }
  if (spec_tokens_.size() < rows_.size()) spec_tokens_.resize(rows_.size());
  if (spec_parents_.size() < rows_.size()) spec_parents_.resize(rows_.size());
  spec_trees_.assign(rows_.size(), TokenTree{});  // pointers into it are taken below
  acceptors_.assign(rows_.size(), nullptr);
  // Pointers into these are taken below: sized once, before.
  row_attention_.assign(rows_.size(), ChunkAttention{});
  if (row_scores_.size() < rows_.size()) row_scores_.resize(rows_.size());
  scored_len_.assign(rows_.size(), -1);
  const int64_t num_layers = runner_->config().num_layers;
  const bool nsa = runner_->config().is_nsa();
  batch_.clear();
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& chunk = plan.chunks[i];
    const Sequence& seq = *chunk.seq;
    SequenceInput in;
    in.start_pos = seq.num_computed();
    in.block_table = seq.blocks().ids();
    in.seq_id = static_cast<int64_t>(seq.id().value);
    if (const int32_t k = chunk_row_[i]; k >= 0) {
      // The sequence's last committed token, then its drafts (KV in the lookahead slots).
      std::vector<int32_t>& tokens = spec_tokens_[k];
      tokens.assign(1, seq.tokens().back());
      tokens.insert(tokens.end(), drafts_[k].tokens.begin(), drafts_[k].tokens.end());
      in.tokens = tokens;
      in.all_logits = all_logits;
      if (!drafts_[k].parents.empty()) {
        // The tree rooted at the last committed token: draft j is chunk token j + 1.
        std::vector<int32_t>& parents = spec_parents_[k];
        parents.assign(1, -1);
        for (int32_t p : drafts_[k].parents) parents.push_back(p + 1);
        spec_trees_[k] = TokenTree{in.start_pos, parents};
        in.tree = &spec_trees_[k];
      }
      LiveRequest& r = *row_requests_[k];
      if (r.acceptor) acceptors_[k] = &*r.acceptor;
      if (nsa) in.ssv = &r.step.ssv;  // how the NSA target's verification queries attend
      if (r.step.method == SpeculationMethod::kVegas) {
        // The verification pass also scores the prefix for the next round's selection: into
        // the sequence's selection slot on the runner's device, or to the host.
        VegasSpeculator* vegas = speculators_->vegas();
        if (vegas == nullptr || !vegas->PrepareScoring(r.id, &row_attention_[k])) {
          row_scores_[k].resize(num_layers * 2 * in.start_pos);
          row_attention_[k].scores = row_scores_[k];
        }
        scored_len_[k] = in.start_pos;
        in.attention = &row_attention_[k];
      }
    } else {
      in.tokens = seq.tokens().subspan(seq.num_computed(), chunk.num_new_tokens);
    }
    batch_.push_back(in);
  }
}

void StepPipeline::Apply(const StepPlan& plan) {
  const bool speculative = num_spec_rows_ > 0;
  SpeculationStepMetrics metrics;
  // Positions each method verified, taken before any commit: a commit may finish (and destroy)
  // the request.
  double positions[kNumDraftMethods] = {};
  if (speculative) TellSpeculators(positions);
  strategy_->Report(row_requests_, outcomes_);
  scheduler_.Postprocess(plan);
  int64_t committed = 0;
  const absl::Time now = absl::Now();
  for (size_t k = 0; k < rows_.size(); ++k) {
    LiveRequest& r = *row_requests_[k];
    RowOutcome& o = outcomes_[k];
    if (o.num_drafts > 0) {
      metrics.num_draft_tokens.push_back(o.num_drafts);
      metrics.num_accepted.push_back(o.num_accepted);
      r.num_drafts += 1;
      r.num_draft_tokens += o.num_drafts;
      r.num_accepted_tokens += o.num_accepted;
      if (speculators_->at(r.step.method) != nullptr) {
        RequestUsage::MethodUsage& u = r.by_method[DraftMethodIndex(r.step.method)];
        u.method = SpeculationMethodName(r.step.method);
        u.num_drafts += 1;
        u.num_draft_tokens += o.num_drafts;
        u.num_accepted_tokens += o.num_accepted;
      }
      const bool hit = drafts_[k].origin == DraftOrigin::kCacheHit;
      metrics.from_cache.push_back(hit ? 1 : 0);
      metrics.methods.push_back(SpeculationMethodName(r.step.method));
      metrics.trees.push_back(drafts_[k].parents.empty() ? 0 : 1);
      if (runner_->config().is_nsa()) metrics.ssv_strategies.push_back(SsvStrategyName(r.step.ssv));
      if (drafts_[k].num_kept_tokens >= 0) {
        metrics.sparse_kept_tokens.push_back(drafts_[k].num_kept_tokens);
      }
      if (hit) {
        r.num_cache_hit_drafts += 1;
        r.num_cache_hit_draft_tokens += o.num_drafts;
        r.num_cache_hit_accepted_tokens += o.num_accepted;
      } else if (r.step.method == DraftMethod::kSsd) {
        r.num_cache_miss_drafts += 1;  // a fallback drafted: primary, backup or local
      }
    }
    Sequence* seq = &r.seq;
    committed += static_cast<int64_t>(o.tokens.size());
    bool finished = false;
    for (size_t j = 0; j < o.tokens.size() && !finished; ++j) {
      finished = CommitToken(r, std::move(o.tokens[j]), now);
    }
    if (!finished && o.num_drafts > 0) scheduler_.AcceptSpeculated(seq, o.num_accepted);
  }
  if (speculative && options_.observer != nullptr) {
    if (runner_->config().is_nsa()) {
      const SsvLoadStats now_ssv = runner_->ssv_load_stats();
      metrics.ssv = now_ssv - ssv_reported_;
      ssv_reported_ = now_ssv;
    }
    metrics.draft_seconds = draft_seconds_;
    metrics.verify_seconds = verify_seconds_;
    metrics.ssd = speculators_->ssd_stats();
    AttributeStepTime(positions, metrics);
    options_.observer->OnSpeculation(metrics);
  }
  strategy_->FinishStep(committed, step_start_, options_.observer);
}

void StepPipeline::TellSpeculators(double (&positions)[kNumDraftMethods]) {
  for (DraftMethod method : kDraftingMethods) {
    const int m = DraftMethodIndex(method);
    Speculator* speculator = speculators_->at(method);
    if (speculator == nullptr) continue;
    rounds_.clear();
    for (size_t k = 0; k < rows_.size(); ++k) {
      const RowOutcome& o = outcomes_[k];
      const LiveRequest& r = *row_requests_[k];
      if (o.num_drafts == 0 || r.step.method != method) continue;
      positions[m] += static_cast<double>(o.num_drafts + 1);
      VerifiedRound round;
      round.seq_id = r.id;
      round.num_drafts = o.num_drafts;
      round.num_accepted = o.num_accepted;
      round.next_token = o.tokens.back().id;
      round.path = o.path;
      if (scored_len_[k] >= 0) {
        if (!row_attention_[k].scores.empty()) round.scores = row_scores_[k];
        round.num_scored = scored_len_[k];
      }
      rounds_.push_back(round);
    }
    if (!rounds_.empty()) speculator->OnVerified(rounds_);
  }
}

void StepPipeline::AttributeStepTime(const double (&positions)[kNumDraftMethods],
                                     SpeculationStepMetrics& metrics) {
  double total_positions = 0;
  for (double p : positions) total_positions += p;
  if (total_positions == 0) return;
  const double step = absl::ToDoubleSeconds(absl::Now() - step_start_);
  const double other = std::max(0.0, step - metrics.draft_seconds - metrics.verify_seconds);
  for (DraftMethod method : kDraftingMethods) {
    const int m = DraftMethodIndex(method);
    SpeculationStepMetrics::MethodSeconds t = method_seconds_[m];
    if (t.draft == 0 && positions[m] == 0) continue;
    const double share = positions[m] / total_positions;
    t.verify = metrics.verify_seconds * share;
    t.other = other * share;
    metrics.by_method.push_back(t);
  }
}

}  // namespace specd
