// One engine step as four stages (docs/architecture.md, "The step pipeline"):
// - Prepare: the scheduler's plan (admissions, chunked prefill, preemption) and the sample rows:
//   the chunks whose sequence has all its tokens computed after this step draw a token; then
//   each row's method and K for the step (Request::step: pinned, or the strategy policy's for
//   `auto` requests, engine_policy.cc).
// - Speculate: each speculating decode's speculator proposes up to K drafts (K limited by the
//   lookahead slots the scheduler reserved, the context and max_tokens).
// - Verify: the first verifier that fits these rows and drafts (engine/verification: greedy on
//   the runner, sampled on the device, exact on the host) runs ONE target pass over the whole
//   ragged batch, built once for it: prefill chunks, plain decodes and drafted decodes (the
//   sequence's last token, then its drafts). A plain step is the zero-draft case.
// - Apply: the one commit path. Each speculator is told its rows' outcomes, then every row's
//   tokens (a plain row's one token; a drafted row's accepted drafts and the correction or bonus
//   token) are committed in order (stop strings, max_tokens, logprobs) and the accepted drafts'
//   KV is marked computed. Rejected drafts' KV slots stay reserved and are overwritten next step.
// Engine thread only.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/engine.h"
#include "engine/engine_internal.h"
#include "engine/speculation/eagle3.h"
#include "engine/verification/verifier.h"

namespace specd {
namespace {

// The method of each of the engine's speculators, in Speculate's order (Core::method_seconds).
constexpr SpeculationMethod kSpeculatorMethods[kNumSpeculatorSlots] = {
    SpeculationMethod::kDraftModel, SpeculationMethod::kNgram,     SpeculationMethod::kSsd,
    SpeculationMethod::kVegas,      SpeculationMethod::kStreaming, SpeculationMethod::kEagle3};

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

int SpeculatorSlot(SpeculationMethod m) {
  for (int i = 0; i < kNumSpeculatorSlots; ++i) {
    if (kSpeculatorMethods[i] == m) return i;
  }
  return -1;
}

absl::StatusOr<bool> Engine::RunStep() {
  Core& c = *core_;
  c.step_start = absl::Now();
  // Prepare.
  const StepPlan plan = c.scheduler.Schedule();
  NoteScheduled(plan, absl::Now());
  if (plan.empty()) return false;
  // Admissions changed the queue: publish before any token is streamed, so that a client
  // reacting to its first token sees the waiting count without it.
  PublishStats(false);
  PlanSampling(plan);
  ChooseStrategies(plan);
  // Speculate.
  Speculate(plan);
  // Verify.
  Verifier& verifier = ChooseVerifier();
  BuildBatch(plan, verifier.wants_all_logits());
  const absl::Time verify_start = absl::Now();
  const absl::Status s =
      verifier.Verify(VerifyInput{c.batch, c.rows, c.drafts, c.acceptors}, &c.outcomes);
  c.verify_seconds = absl::ToDoubleSeconds(absl::Now() - verify_start);
  if (!s.ok()) {
    // A tensor-parallel group that lost a rank says so (Unavailable, naming the rank): that is
    // what every request of the step ends with; anything else is an internal failure.
    const absl::Status group = runner_->GroupStatus();
    const absl::Status failed =
        !group.ok() ? group : absl::InternalError(absl::StrCat("forward failed: ", s.message()));
    for (const ScheduledChunk& chunk : plan.chunks) {
      auto it = c.live.find(chunk.seq->id().value);
      if (it != c.live.end()) FinishRequest(*it->second, FinishReason::kAbort, failed, absl::Now());
    }
    return failed;
  }
  if (const absl::Status moved = CompactTreeKv(); !moved.ok()) {
    const absl::Status failed =
        absl::InternalError(absl::StrCat("token tree KV compaction failed: ", moved.message()));
    for (const ScheduledChunk& chunk : plan.chunks) {
      auto it = c.live.find(chunk.seq->id().value);
      if (it != c.live.end()) FinishRequest(*it->second, FinishReason::kAbort, failed, absl::Now());
    }
    return failed;
  }
  FeedEagle3();
  // Apply.
  Apply(plan);
  return true;
}

absl::Status Engine::CompactTreeKv() {
  Core& c = *core_;
  c.kv_moves.clear();
  for (size_t k = 0; k < c.rows.size(); ++k) {
    const std::vector<int32_t>& path = c.outcomes[k].path;
    if (path.empty() || c.drafts[k].parents.empty()) continue;
    const SequenceInput& chunk = c.batch[c.rows[k].chunk];
    // Draft j sat in slot start_pos + 1 + j; the i-th accepted one belongs in start_pos + 1 + i.
    for (size_t i = 0; i < path.size(); ++i) {
      const int32_t from = chunk.start_pos + 1 + path[i];
      const int32_t to = chunk.start_pos + 1 + static_cast<int32_t>(i);
      if (from != to) c.kv_moves.push_back(KvSlotMove{chunk.block_table, from, to});
    }
  }
  if (c.kv_moves.empty()) return absl::OkStatus();
  return runner_->MoveKv(c.kv_moves);
}

void Engine::FeedEagle3() {
  if (eagle3_ == nullptr) return;
  Core& c = *core_;
  c.eagle3_wanted.assign(c.batch.size(), 0);
  bool any = false;
  for (size_t i = 0; i < c.batch.size(); ++i) {
    auto it = c.live.find(static_cast<RequestId>(c.batch[i].seq_id));
    // Tree chunks too: the head keeps each node's hidden state until its next Propose finds
    // the accepted path (draft-model and n-gram trees are pinned to their method: not wanted).
    if (it == c.live.end()) continue;
    // Requests pinned to the head, and `auto` requests the policy may move to it: hidden states
    // a pass does not hand over cannot be had later.
    const ResolvedSpeculation& spec = it->second->spec;
    const bool head_may_draft =
        spec.method == SpeculationMethod::kEagle3 ||
        (spec.method == SpeculationMethod::kAuto && !spec.Forbids(SpeculationMethod::kEagle3));
    if (!head_may_draft) continue;
    c.eagle3_wanted[i] = 1;
    it->second->used_speculators |= 1u << SpeculatorSlot(SpeculationMethod::kEagle3);
    any = true;
  }
  if (!any) return;
  const absl::Status s = eagle3_->OnTargetPass(c.batch, c.eagle3_wanted);
  // The head then has no hidden states for these positions: it drafts less, nothing more.
  if (!s.ok()) SPECD_LOG_WARN("engine: EAGLE-3 head missed a target pass: {}", s.ToString());
}

void Engine::PlanSampling(const StepPlan& plan) {
  Core& c = *core_;
  c.rows.clear();
  c.row_requests.clear();
  if (c.banned.size() < plan.chunks.size()) c.banned.resize(plan.chunks.size());  // no moves
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const Sequence& seq = *plan.chunks[i].seq;
    if (seq.num_computed() + plan.chunks[i].num_new_tokens != seq.num_tokens()) {
      continue;  // a prefill chunk short of the end
    }
    Request& r = *c.live.find(seq.id().value)->second;
    const SamplingParams& p = r.request.params;
    std::vector<int32_t>& banned = c.banned[c.rows.size()];
    banned.clear();
    if (r.seq.num_generated() < p.min_tokens) {
      banned = p.stop_token_ids;
      if (!p.ignore_eos) banned.insert(banned.end(), eos_ids_.begin(), eos_ids_.end());
    }
    SampleRow row;
    row.chunk = static_cast<int32_t>(i);
    row.sampler = &r.sampler;
    row.params = &p;
    row.history = &r.history;
    row.banned = banned;
    row.seed = r.seed;
    row.num_generated = r.seq.num_generated();
    c.rows.push_back(row);
    c.row_requests.push_back(&r);
  }
}

void Engine::Speculate(const StepPlan& plan) {
  Core& c = *core_;
  c.num_spec_rows = 0;
  c.draft_seconds = 0;
  c.drafts.resize(c.rows.size());
  for (Draft& d : c.drafts) d.Reset();
  const absl::Time start = absl::Now();
  // Vegas and streaming share one speculator, proposed for once per method.
  for (int m = 0; m < kNumSpeculatorSlots; ++m) {
    c.method_seconds[m] = {SpeculationMethodName(kSpeculatorMethods[m]), 0, 0, 0};
    Speculator* speculator = SpeculatorAt(m);
    if (speculator == nullptr) continue;
    c.draft_inputs.clear();
    c.draft_rows.clear();
    for (size_t k = 0; k < c.rows.size(); ++k) {
      const ScheduledChunk& chunk = plan.chunks[c.rows[k].chunk];
      Request& r = *c.row_requests[k];
      if (chunk.num_lookahead_tokens == 0 || chunk.num_new_tokens != 1 ||
          r.step.method != kSpeculatorMethods[m]) {
        continue;
      }
      const SamplingParams& p = r.request.params;
      const int32_t num_tokens = r.seq.num_tokens();
      // Drafts sit at positions num_tokens .. num_tokens + k - 1; a round commits at most
      // k + 1 tokens, so no more than max_tokens - generated - 1 drafts are useful.
      const int32_t useful = p.max_tokens - r.seq.num_generated() - 1;
      int32_t k_max = std::min(
          {r.step.num_speculative_tokens, chunk.num_lookahead_tokens, max_model_len_ - num_tokens});
      // A tree: up to k_max nodes in the lookahead slots, paths no longer than useful. A runner
      // without trees verifies a chain of the tree's depth instead.
      const TreeShape& tree = r.step.tree;
      int32_t depth = 0;
      if (tree.enabled && trees_ok_) {
        depth = std::min({tree.depth, useful, k_max});
      } else {
        k_max = std::min({k_max, useful, tree.enabled ? tree.depth : k_max});
      }
      if (k_max <= 0 || (tree.enabled && trees_ok_ && depth <= 0)) continue;
      DraftInput in;
      in.seq_id = r.id;
      in.tokens = r.seq.tokens();
      in.num_draft_tokens = k_max;
      in.tree_depth = depth;
      in.tree_top_k = depth > 0 ? tree.top_k : 0;
      in.params = &p;
      in.history = &r.history;
      in.banned = c.rows[k].banned;
      in.num_banned_positions = std::max(0, p.min_tokens - r.seq.num_generated());
      in.seed = r.seed;
      in.num_generated = r.seq.num_generated();
      in.speculation = &r.step;
      in.block_table = r.seq.blocks().ids();
      in.num_computed = r.seq.num_computed();
      c.draft_inputs.push_back(in);
      c.draft_rows.push_back(static_cast<int32_t>(k));
      r.used_speculators |= 1u << m;
    }
    if (c.draft_inputs.empty()) continue;
    const absl::Time propose_start = absl::Now();
    const absl::Status s = speculator->Propose(c.draft_inputs, &c.proposed);
    c.method_seconds[m].draft = absl::ToDoubleSeconds(absl::Now() - propose_start);
    if (!s.ok()) {
      SPECD_LOG_WARN("engine: speculation failed, decoding without drafts this step: {}",
                     s.ToString());
      continue;
    }
    for (size_t i = 0; i < c.draft_inputs.size(); ++i) {
      Draft& d = c.proposed[i];
      if (d.tokens.empty()) continue;
      if (!d.parents.empty() && !ValidTreeDraft(d, c.draft_inputs[i])) {
        SPECD_LOG_WARN("engine: {} proposed a malformed tree; decoding without drafts",
                       SpeculationMethodName(kSpeculatorMethods[m]));
        continue;
      }
      d.tokens.resize(std::min<size_t>(d.tokens.size(), c.draft_inputs[i].num_draft_tokens));
      std::swap(c.drafts[c.draft_rows[i]], d);
      ++c.num_spec_rows;
    }
  }
  c.draft_seconds = absl::ToDoubleSeconds(absl::Now() - start);
}

Verifier& Engine::ChooseVerifier() {
  const Core& c = *core_;
  for (const std::unique_ptr<Verifier>& v : verifiers_) {
    if (v->Fits(c.rows, c.drafts)) return *v;
  }
  return *verifiers_.back();  // the host verifier takes anything
}

void Engine::BuildBatch(const StepPlan& plan, bool all_logits) {
  Core& c = *core_;
  // Each chunk's drafted row, if any (a drafted decode is its sequence's only sample row).
  c.chunk_row.assign(plan.chunks.size(), -1);
  for (size_t k = 0; k < c.rows.size(); ++k) {
    if (!c.drafts[k].tokens.empty()) c.chunk_row[c.rows[k].chunk] = static_cast<int32_t>(k);
  }
  if (c.spec_tokens.size() < c.rows.size()) c.spec_tokens.resize(c.rows.size());
  if (c.spec_parents.size() < c.rows.size()) c.spec_parents.resize(c.rows.size());
  c.spec_trees.assign(c.rows.size(), TokenTree{});  // pointers into it are taken below
  c.acceptors.assign(c.rows.size(), nullptr);
  // Pointers into these are taken below: sized once, before.
  c.row_attention.assign(c.rows.size(), ChunkAttention{});
  if (c.row_scores.size() < c.rows.size()) c.row_scores.resize(c.rows.size());
  c.scored_len.assign(c.rows.size(), -1);
  const int64_t num_layers = runner_->config().num_layers;
  const bool nsa = runner_->config().is_nsa();
  c.batch.clear();
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& chunk = plan.chunks[i];
    const Sequence& seq = *chunk.seq;
    SequenceInput in;
    in.start_pos = seq.num_computed();
    in.block_table = seq.blocks().ids();
    in.seq_id = static_cast<int64_t>(seq.id().value);
    if (const int32_t k = c.chunk_row[i]; k >= 0) {
      // The sequence's last committed token, then its drafts (KV in the lookahead slots).
      std::vector<int32_t>& tokens = c.spec_tokens[k];
      tokens.assign(1, seq.tokens().back());
      tokens.insert(tokens.end(), c.drafts[k].tokens.begin(), c.drafts[k].tokens.end());
      in.tokens = tokens;
      in.all_logits = all_logits;
      if (!c.drafts[k].parents.empty()) {
        // The tree rooted at the last committed token: draft j is chunk token j + 1.
        std::vector<int32_t>& parents = c.spec_parents[k];
        parents.assign(1, -1);
        for (int32_t p : c.drafts[k].parents) parents.push_back(p + 1);
        c.spec_trees[k] = TokenTree{in.start_pos, parents};
        in.tree = &c.spec_trees[k];
      }
      Request& r = *c.row_requests[k];
      if (r.acceptor) c.acceptors[k] = &*r.acceptor;
      if (nsa) in.ssv = &r.spec.ssv;  // how the NSA target's verification queries attend
      if (r.step.method == SpeculationMethod::kVegas) {
        // The verification pass also scores the prefix for the next round's selection.
        c.row_scores[k].resize(num_layers * 2 * in.start_pos);
        c.row_attention[k].scores = c.row_scores[k];
        c.scored_len[k] = in.start_pos;
        in.attention = &c.row_attention[k];
      }
    } else {
      in.tokens = seq.tokens().subspan(seq.num_computed(), chunk.num_new_tokens);
    }
    c.batch.push_back(in);
  }
}

void Engine::Apply(const StepPlan& plan) {
  Core& c = *core_;
  const bool speculative = c.num_spec_rows > 0;
  SpeculationStepMetrics metrics;
  // Positions each method verified, taken before any commit: a commit may finish (and destroy)
  // the request.
  double positions[kNumSpeculatorSlots] = {};
  if (speculative) TellSpeculators(positions);
  ReportToPolicy();
  c.scheduler.Postprocess(plan);
  int64_t committed = 0;
  const absl::Time now = absl::Now();
  for (size_t k = 0; k < c.rows.size(); ++k) {
    Request& r = *c.row_requests[k];
    RowOutcome& o = c.outcomes[k];
    if (o.num_drafts > 0) {
      metrics.num_draft_tokens.push_back(o.num_drafts);
      metrics.num_accepted.push_back(o.num_accepted);
      r.num_drafts += 1;
      r.num_draft_tokens += o.num_drafts;
      r.num_accepted_tokens += o.num_accepted;
      if (const int slot = SpeculatorSlot(r.step.method); slot >= 0) {
        RequestUsage::MethodUsage& u = r.by_method[slot];
        u.method = SpeculationMethodName(r.step.method);
        u.num_drafts += 1;
        u.num_draft_tokens += o.num_drafts;
        u.num_accepted_tokens += o.num_accepted;
      }
      const bool hit = c.drafts[k].origin == DraftOrigin::kCacheHit;
      metrics.from_cache.push_back(hit ? 1 : 0);
      metrics.methods.push_back(SpeculationMethodName(r.step.method));
      metrics.trees.push_back(c.drafts[k].parents.empty() ? 0 : 1);
      if (runner_->config().is_nsa()) metrics.ssv_strategies.push_back(SsvStrategyName(r.spec.ssv));
      if (c.drafts[k].num_kept_tokens >= 0) {
        metrics.sparse_kept_tokens.push_back(c.drafts[k].num_kept_tokens);
      }
      if (hit) {
        r.num_cache_hit_drafts += 1;
        r.num_cache_hit_draft_tokens += o.num_drafts;
        r.num_cache_hit_accepted_tokens += o.num_accepted;
      }
    }
    Sequence* seq = &r.seq;
    committed += static_cast<int64_t>(o.tokens.size());
    bool finished = false;
    for (size_t j = 0; j < o.tokens.size() && !finished; ++j) {
      finished = CommitToken(r, std::move(o.tokens[j]), now);
    }
    if (!finished && o.num_drafts > 0) c.scheduler.AcceptSpeculated(seq, o.num_accepted);
  }
  if (speculative && options_.observer) {
    if (runner_->config().is_nsa()) {
      const SsvLoadStats now_ssv = runner_->ssv_load_stats();
      metrics.ssv = now_ssv - c.ssv_reported;
      c.ssv_reported = now_ssv;
    }
    metrics.draft_seconds = c.draft_seconds;
    metrics.verify_seconds = c.verify_seconds;
    metrics.ssd = ssd_stats_;
    AttributeStepTime(positions, metrics);
    options_.observer->OnSpeculation(metrics);
  }
  FinishPolicyStep(committed);
}

void Engine::TellSpeculators(double (&positions)[kNumSpeculatorSlots]) {
  Core& c = *core_;
  for (int m = 0; m < kNumSpeculatorSlots; ++m) {
    Speculator* speculator = SpeculatorAt(m);
    if (speculator == nullptr) continue;
    c.rounds.clear();
    for (size_t k = 0; k < c.rows.size(); ++k) {
      const RowOutcome& o = c.outcomes[k];
      const Request& r = *c.row_requests[k];
      if (o.num_drafts == 0 || r.step.method != kSpeculatorMethods[m]) continue;
      positions[m] += static_cast<double>(o.num_drafts + 1);
      VerifiedRound round;
      round.seq_id = r.id;
      round.num_drafts = o.num_drafts;
      round.num_accepted = o.num_accepted;
      round.next_token = o.tokens.back().id;
      round.path = o.path;
      if (c.scored_len[k] >= 0) {
        round.scores = c.row_scores[k];
        round.num_scored = c.scored_len[k];
      }
      c.rounds.push_back(round);
    }
    if (!c.rounds.empty()) speculator->OnVerified(c.rounds);
  }
}

void Engine::AttributeStepTime(const double (&positions)[kNumSpeculatorSlots],
                               SpeculationStepMetrics& metrics) {
  Core& c = *core_;
  double total_positions = 0;
  for (double p : positions) total_positions += p;
  if (total_positions == 0) return;
  const double step = absl::ToDoubleSeconds(absl::Now() - c.step_start);
  const double other = std::max(0.0, step - metrics.draft_seconds - metrics.verify_seconds);
  for (int m = 0; m < kNumSpeculatorSlots; ++m) {
    SpeculationStepMetrics::MethodSeconds t = c.method_seconds[m];
    if (t.draft == 0 && positions[m] == 0) continue;
    const double share = positions[m] / total_positions;
    t.verify = metrics.verify_seconds * share;
    t.other = other * share;
    metrics.by_method.push_back(t);
  }
}

}  // namespace specd
