// The speculative half of an engine step: Speculate -> Verify -> Apply over the continuous batch
// (docs/architecture.md, "Speculation"). Speculate asks each request's speculator for up to K
// drafts (K limited by the lookahead slots the scheduler reserved, the context and max_tokens)
// and appends them to the decode's chunk. VerifyAndApply runs ONE target pass over the whole
// ragged batch (prefill chunks, plain decodes and the drafted decodes with logits for every
// position), accepts per sequence (greedy: up to the first mismatch; sampled: speculative
// sampling against the draft's q, so the output distribution is the target's), commits the
// accepted drafts and the correction or bonus token through the same path as plain tokens
// (stop strings, max_tokens, logprobs from the target's logits), and marks the accepted
// drafts' KV computed. Rejected drafts' KV slots stay reserved and are overwritten next step;
// the draft model rolls its own KV back at its next Propose. Engine thread only.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/engine.h"
#include "engine/engine_internal.h"

namespace specd {
namespace {

// The target's raw logprobs for a committed token, as the Sampler reports them.
SampleResult TargetToken(std::span<const float> logits, int32_t id, int32_t num_logprobs) {
  SampleResult out;
  out.id = id;
  if (num_logprobs < 0) return out;
  const std::vector<float> logprobs = LogSoftmax(logits);
  out.logprob = logprobs[id];
  out.top = TopN(logprobs, num_logprobs);
  return out;
}

}  // namespace

Speculator* Engine::SpeculatorFor(const Request& r) const {
  switch (r.spec.method) {
    case SpeculationMethod::kDraftModel:
      return draft_.get();
    case SpeculationMethod::kNgram:
      return ngram_.get();
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
  }
  if (c.spec_tokens.size() < c.rows.size()) c.spec_tokens.resize(c.rows.size());
  const absl::Time start = absl::Now();
  for (Speculator* speculator : {draft_.get(), ngram_.get()}) {
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
      c.draft_inputs.push_back(in);
      c.draft_rows.push_back(static_cast<int32_t>(k));
    }
    if (c.draft_inputs.empty()) continue;
    if (absl::Status s = speculator->Propose(c.draft_inputs, &c.proposed); !s.ok()) {
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
      SequenceInput& in = c.batch[c.rows[k].chunk];
      in.tokens = tokens;
      in.all_logits = true;
      ++c.num_spec_rows;
    }
  }
  c.draft_seconds = absl::ToDoubleSeconds(absl::Now() - start);
}

absl::Status Engine::VerifyAndApply(const StepPlan& plan) {
  Core& c = *core_;
  const absl::Time start = absl::Now();
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
  // Verify: acceptance for drafted rows, a plain draw for the others.
  std::vector<AcceptResult> accepted(c.rows.size());
  c.sampled.resize(c.rows.size());
  for (size_t k = 0; k < c.rows.size(); ++k) {
    const size_t row = first_row[c.rows[k].chunk];
    Request& r = *c.row_requests[k];
    const Draft& d = c.drafts[k];
    if (d.tokens.empty()) {
      c.sampled[k] = r.sampler.Sample(row_logits(row, 1), r.history, c.rows[k].banned);
      continue;
    }
    BannedIds banned;
    banned.ids = c.rows[k].banned;
    banned.num_positions = std::max(0, r.request.params.min_tokens - r.seq.num_generated());
    accepted[k] = r.acceptor->Verify(row_logits(row, d.tokens.size() + 1), d.tokens, d.probs,
                                     r.history, banned);
  }
  SpeculationStepMetrics metrics;
  metrics.draft_seconds = c.draft_seconds;
  metrics.verify_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  // Apply.
  c.scheduler.Postprocess(plan);
  const absl::Time now = absl::Now();
  for (size_t k = 0; k < c.rows.size(); ++k) {
    Request& r = *c.row_requests[k];
    const Draft& d = c.drafts[k];
    if (d.tokens.empty()) {
      CommitToken(r, std::move(c.sampled[k]), now);
      continue;
    }
    const AcceptResult a = accepted[k];
    const int32_t num_draft = static_cast<int32_t>(d.tokens.size());
    metrics.num_draft_tokens.push_back(num_draft);
    metrics.num_accepted.push_back(a.num_accepted);
    r.num_drafts += 1;
    r.num_draft_tokens += num_draft;
    r.num_accepted_tokens += a.num_accepted;
    const size_t row = first_row[c.rows[k].chunk];
    const int32_t num_logprobs = r.request.params.logprobs;
    // r may be destroyed by the commit that finishes it: stop there.
    bool finished = false;
    for (int32_t j = 0; j < a.num_accepted && !finished; ++j) {
      finished =
          CommitToken(r, TargetToken(row_logits(row + j, 1), d.tokens[j], num_logprobs), now);
    }
    if (finished) continue;
    Sequence* seq = &r.seq;
    finished = CommitToken(
        r, TargetToken(row_logits(row + a.num_accepted, 1), a.next_token, num_logprobs), now);
    if (!finished) c.scheduler.AcceptSpeculated(seq, a.num_accepted);
  }
  if (options_.observer) options_.observer->OnSpeculation(metrics);
  return absl::OkStatus();
}

}  // namespace specd
