// The speculative half of an engine step: Speculate -> Verify -> Apply over the continuous batch
// (docs/architecture.md, "Speculation"). Speculate asks each request's speculator for up to K
// drafts (K limited by the lookahead slots the scheduler reserved, the context and max_tokens)
// and appends them to the decode's chunk. VerifyAndApply runs ONE target pass over the whole
// ragged batch (prefill chunks, plain decodes and the drafted decodes), accepts per sequence
// (greedy: up to the first mismatch; sampled: speculative sampling against the draft's q, so the
// output distribution is the target's), commits the
// accepted drafts and the correction or bonus token through the same path as plain tokens
// (stop strings, max_tokens, logprobs from the target's logits), and marks the accepted
// drafts' KV computed. Rejected drafts' KV slots stay reserved and are overwritten next step;
// the draft model rolls its own KV back at its next Propose. Three ways to verify, the first
// that fits: when every drafted request is plain greedy (no penalties, bans or logprobs) the
// runner's Step draws the target's choice at every drafted position (on a GPU only token ids
// leave the device); when the runner keeps probabilities on its device (CUDA),
// StepSampledVerify builds p there, takes q from the draft's device slots (or
// the host, or one-hot for deterministic drafts) and runs speculative sampling there; else
// Forward returns the logits of every drafted position and acceptance runs on the host
// (Acceptor: processed distributions, rejection sampling, logprobs: the CPU backend's oracle).
// Engine thread only.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/engine.h"
#include "engine/engine_internal.h"

namespace specd {
namespace {

// The method of each of the engine's speculators, in Speculate's order (Core::method_seconds).
constexpr SpeculationMethod kSpeculatorMethods[3] = {
    SpeculationMethod::kDraftModel, SpeculationMethod::kNgram, SpeculationMethod::kSsd};

}  // namespace

Speculator* Engine::SpeculatorFor(const Request& r) const {
  switch (r.spec.method) {
    case SpeculationMethod::kDraftModel:
      return draft_.get();
    case SpeculationMethod::kNgram:
      return ngram_.get();
    case SpeculationMethod::kSsd:
      return ssd_.get();
    default:
      return nullptr;
  }
}

void Engine::Speculate(const StepPlan& plan) {
  Core& c = *core_;
  c.num_spec_rows = 0;
  c.draft_seconds = 0;
  c.drafts.resize(c.rows.size());
  for (Draft& d : c.drafts) {
    d.tokens.clear();
    d.probs.clear();
    d.device_probs = nullptr;
  }
  if (c.spec_tokens.size() < c.rows.size()) c.spec_tokens.resize(c.rows.size());
  const absl::Time start = absl::Now();
  Speculator* const speculators[3] = {draft_.get(), ngram_.get(), ssd_.get()};
  for (int m = 0; m < 3; ++m) {
    c.method_seconds[m] = {SpeculationMethodName(kSpeculatorMethods[m]), 0, 0, 0};
    Speculator* speculator = speculators[m];
    if (speculator == nullptr) continue;
    c.draft_inputs.clear();
    c.draft_rows.clear();
    for (size_t k = 0; k < c.rows.size(); ++k) {
      const ScheduledChunk& chunk = plan.chunks[c.rows[k].chunk];
      Request& r = *c.row_requests[k];
      if (chunk.num_lookahead_tokens == 0 || chunk.num_new_tokens != 1 ||
          SpeculatorFor(r) != speculator) {
        continue;
      }
      const SamplingParams& p = r.request.params;
      const int32_t num_tokens = r.seq.num_tokens();
      // Drafts sit at positions num_tokens .. num_tokens + k - 1; a round commits at most
      // k + 1 tokens, so no more than max_tokens - generated - 1 drafts are useful.
      const int32_t k_max =
          std::min({r.spec.num_speculative_tokens, chunk.num_lookahead_tokens,
                    max_model_len_ - num_tokens, p.max_tokens - r.seq.num_generated() - 1});
      if (k_max <= 0) continue;
      DraftInput in;
      in.seq_id = r.id;
      in.tokens = r.seq.tokens();
      in.num_draft_tokens = k_max;
      in.params = &p;
      in.history = &r.history;
      in.banned = c.rows[k].banned;
      in.num_banned_positions = std::max(0, p.min_tokens - r.seq.num_generated());
      in.seed = r.seed;
      in.num_generated = r.seq.num_generated();
      in.saguaro_c = r.spec.saguaro_c;
      c.draft_inputs.push_back(in);
      c.draft_rows.push_back(static_cast<int32_t>(k));
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
      const int32_t k = c.draft_rows[i];
      Draft& d = c.proposed[i];
      if (d.tokens.empty()) continue;
      d.tokens.resize(std::min<size_t>(d.tokens.size(), c.draft_inputs[i].num_draft_tokens));
      std::swap(c.drafts[k], d);
      std::vector<int32_t>& tokens = c.spec_tokens[k];
      tokens.assign(1, c.row_requests[k]->seq.tokens().back());
      tokens.insert(tokens.end(), c.drafts[k].tokens.begin(), c.drafts[k].tokens.end());
      c.batch[c.rows[k].chunk].tokens = tokens;  // Verify decides whether it needs all logits
      ++c.num_spec_rows;
    }
  }
  c.draft_seconds = absl::ToDoubleSeconds(absl::Now() - start);
}

// Whether every drafted row can be verified by the runner's own sampler (Step rows at each
// drafted position: on a GPU no logits leave the device): greedy, no penalties (they would need
// the pending drafts), nothing banned, no logprobs, and the rows fit one Step.
bool Engine::GreedyVerifyFits() const {
  const Core& c = *core_;
  int64_t num_rows = 0;
  for (size_t k = 0; k < c.rows.size(); ++k) {
    const Draft& d = c.drafts[k];
    num_rows += static_cast<int64_t>(d.tokens.size()) + 1;
    if (d.tokens.empty()) continue;
    const SamplingParams& p = c.row_requests[k]->request.params;
    if (!p.greedy() || p.has_penalties() || p.logprobs >= 0 || !c.rows[k].banned.empty()) {
      return false;
    }
  }
  return num_rows <= runner_->max_sample_rows();
}

// What the runner's verification gave (c.verified) as each row's tokens to commit: the
// accepted drafts, then the correction or bonus token.
void Engine::CommitVerified() {
  Core& c = *core_;
  for (size_t k = 0; k < c.rows.size(); ++k) {
    std::vector<SampleResult>& commit = c.commits[k];
    commit.clear();
    const std::vector<int32_t>& drafts = c.drafts[k].tokens;
    GreedyVerifyResult& v = c.verified[k];
    if (!v.accepted.empty()) {  // with their logprobs
      for (SampleResult& a : v.accepted) commit.push_back(std::move(a));
    } else {
      for (int32_t j = 0; j < v.num_accepted; ++j) commit.push_back({drafts[j], 0.0f, {}, {}});
    }
    commit.push_back(std::move(v.next));
    c.accepted[k] = v.num_accepted;
  }
}

absl::Status Engine::VerifyGreedyOnRunner() {
  Core& c = *core_;
  c.draft_spans.clear();
  for (const Draft& d : c.drafts) c.draft_spans.emplace_back(d.tokens);
  SPECD_RETURN_IF_ERROR(runner_->StepGreedyVerify(c.batch, c.rows, c.draft_spans, &c.verified));
  CommitVerified();
  return absl::OkStatus();
}

// Whether the runner can verify every row with p and q on its device (StepSampledVerify):
// it keeps probabilities on a device, no row wants SSD's candidates and the rows' positions fit
// one Step.
bool Engine::SampledVerifyFits() const {
  const Core& c = *core_;
  if (!runner_->SamplesSpeculationOnDevice()) return false;
  int64_t num_rows = 0;
  for (size_t k = 0; k < c.rows.size(); ++k) {
    num_rows += static_cast<int64_t>(c.drafts[k].tokens.size()) + 1;
    if (c.rows[k].num_candidates > 0) return false;
  }
  return num_rows <= runner_->max_sample_rows();
}

absl::Status Engine::VerifySampledOnRunner() {
  Core& c = *core_;
  c.draft_spans.clear();
  c.draft_probs.clear();
  for (const Draft& d : c.drafts) {
    c.draft_spans.emplace_back(d.tokens);
    c.draft_probs.push_back(DraftProbs{d.device_probs, d.probs});
  }
  SPECD_RETURN_IF_ERROR(
      runner_->StepSampledVerify(c.batch, c.rows, c.draft_spans, c.draft_probs, &c.verified));
  CommitVerified();
  return absl::OkStatus();
}

absl::Status Engine::VerifyOnHost() {
  Core& c = *core_;
  for (size_t k = 0; k < c.rows.size(); ++k) {
    if (!c.drafts[k].tokens.empty()) c.batch[c.rows[k].chunk].all_logits = true;
  }
  SPECD_RETURN_IF_ERROR(runner_->Forward(c.batch, &c.logits));
  const size_t vocab = static_cast<size_t>(runner_->config().vocab_size);
  // First logits row of each chunk: one row per chunk, one per token for drafted decodes.
  std::vector<size_t> first_row(c.batch.size() + 1, 0);
  for (size_t i = 0; i < c.batch.size(); ++i) {
    first_row[i + 1] = first_row[i] + (c.batch[i].all_logits ? c.batch[i].tokens.size() : 1);
  }
  if (c.logits.size() != first_row.back() * vocab) {
    return absl::InternalError(absl::StrCat("verification pass returned ", c.logits.size(),
                                            " logits, expected ", first_row.back() * vocab));
  }
  auto row_logits = [&](size_t row, size_t count) {
    return std::span<float>(c.logits).subspan(row * vocab, count * vocab);
  };
  for (size_t k = 0; k < c.rows.size(); ++k) {
    const size_t row = first_row[c.rows[k].chunk];
    Request& r = *c.row_requests[k];
    const Draft& d = c.drafts[k];
    std::vector<SampleResult>& commit = c.commits[k];
    commit.clear();
    if (d.tokens.empty()) {
      commit.push_back(r.sampler.Sample(row_logits(row, 1), r.history, c.rows[k].banned));
      continue;
    }
    BannedIds banned;
    banned.ids = c.rows[k].banned;
    banned.num_positions = std::max(0, r.request.params.min_tokens - r.seq.num_generated());
    const AcceptResult a = r.acceptor->Verify(row_logits(row, d.tokens.size() + 1), d.tokens,
                                              d.probs, r.history, banned);
    // The target's raw logprobs for every committed token.
    const int32_t num_logprobs = r.request.params.logprobs;
    for (int32_t j = 0; j <= a.num_accepted; ++j) {
      const int32_t id = j < a.num_accepted ? d.tokens[j] : a.next_token;
      commit.push_back(RawTokenLogprobs(row_logits(row + j, 1), id, num_logprobs));
    }
    c.accepted[k] = a.num_accepted;
  }
  return absl::OkStatus();
}

absl::Status Engine::VerifyAndApply(const StepPlan& plan) {
  Core& c = *core_;
  const absl::Time start = absl::Now();
  c.commits.resize(c.rows.size());
  c.accepted.assign(c.rows.size(), 0);
  if (GreedyVerifyFits()) {
    SPECD_RETURN_IF_ERROR(VerifyGreedyOnRunner());
  } else if (SampledVerifyFits()) {
    SPECD_RETURN_IF_ERROR(VerifySampledOnRunner());
  } else {
    SPECD_RETURN_IF_ERROR(VerifyOnHost());
  }
  SpeculationStepMetrics metrics;
  metrics.draft_seconds = c.draft_seconds;
  metrics.ssd = ssd_stats_;
  metrics.verify_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  // Apply: commit each row's tokens (a plain row's one token; a drafted row's accepted drafts
  // and the token after them) until one finishes the request, which destroys it.
  // Positions each method verified, taken before Apply: a commit may finish (and destroy) the
  // request.
  double positions[3] = {0, 0, 0};
  for (size_t k = 0; k < c.rows.size(); ++k) {
    const size_t num_draft = c.drafts[k].tokens.size();
    for (int m = 0; m < 3 && num_draft > 0; ++m) {
      if (c.row_requests[k]->spec.method == kSpeculatorMethods[m]) {
        positions[m] += static_cast<double>(num_draft + 1);
      }
    }
  }
  c.scheduler.Postprocess(plan);
  const absl::Time now = absl::Now();
  for (size_t k = 0; k < c.rows.size(); ++k) {
    Request& r = *c.row_requests[k];
    const int32_t num_draft = static_cast<int32_t>(c.drafts[k].tokens.size());
    if (num_draft > 0) {
      metrics.num_draft_tokens.push_back(num_draft);
      metrics.num_accepted.push_back(c.accepted[k]);
      r.num_drafts += 1;
      r.num_draft_tokens += num_draft;
      r.num_accepted_tokens += c.accepted[k];
      const bool hit = c.drafts[k].origin == DraftOrigin::kCacheHit;
      metrics.from_cache.push_back(hit ? 1 : 0);
      if (hit) {
        r.num_cache_hit_drafts += 1;
        r.num_cache_hit_draft_tokens += num_draft;
        r.num_cache_hit_accepted_tokens += c.accepted[k];
      }
    }
    Sequence* seq = &r.seq;
    bool finished = false;
    for (size_t j = 0; j < c.commits[k].size() && !finished; ++j) {
      finished = CommitToken(r, std::move(c.commits[k][j]), now);
    }
    if (!finished && num_draft > 0) c.scheduler.AcceptSpeculated(seq, c.accepted[k]);
  }
  if (options_.observer) {
    AttributeStepTime(positions, metrics);
    options_.observer->OnSpeculation(metrics);
  }
  return absl::OkStatus();
}

void Engine::AttributeStepTime(const double (&positions)[3], SpeculationStepMetrics& metrics) {
  Core& c = *core_;
  const double total_positions = positions[0] + positions[1] + positions[2];
  if (total_positions == 0) return;
  const double step = absl::ToDoubleSeconds(absl::Now() - c.step_start);
  const double other = std::max(0.0, step - metrics.draft_seconds - metrics.verify_seconds);
  for (int m = 0; m < 3; ++m) {
    SpeculationStepMetrics::MethodSeconds t = c.method_seconds[m];
    if (t.draft == 0 && positions[m] == 0) continue;
    const double share = positions[m] / total_positions;
    t.verify = metrics.verify_seconds * share;
    t.other = other * share;
    metrics.by_method.push_back(t);
  }
}

}  // namespace specd
