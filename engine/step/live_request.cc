#include "engine/step/live_request.h"

#include <algorithm>
#include <random>
#include <utility>

namespace specd {
namespace {

uint64_t SeedFor(const SamplingParams& p) {
  if (p.seed) return *p.seed;
  std::random_device rd;
  return (uint64_t{rd()} << 32) | rd();
}

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

bool Contains(const std::vector<int32_t>& v, int32_t id) {
  return std::find(v.begin(), v.end(), id) != v.end();
}

RequestOutcome OutcomeOf(FinishReason reason, const absl::Status& status) {
  if (status.ok())
    return reason == FinishReason::kStop ? RequestOutcome::kStop : RequestOutcome::kLength;
  switch (status.code()) {
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kUnavailable:
      return RequestOutcome::kAbort;
    case absl::StatusCode::kDeadlineExceeded:
      return RequestOutcome::kDeadline;
    default:
      return RequestOutcome::kError;
  }
}

// Mixed into the request's seed for the acceptance RNG, so it is not the sampler's stream.
constexpr uint64_t kAcceptSeedSalt = 0xbb67ae8584caa73bULL;

}  // namespace

LiveRequest::LiveRequest(RequestId id, GenerateRequest req, ResolvedSpeculation spec,
                         int32_t block_size, const Tokenizer* tok)
    : id(id),
      request(std::move(req)),
      seq(SeqId{id}, request.prompt_ids, block_size),
      seed(SeedFor(request.params)),
      sampler(request.params, seed),
      spec(spec),
      step(spec),
      stop(request.params.stop) {
  if (spec.enabled()) {
    acceptor.emplace(request.params, seed ^ kAcceptSeedSalt);
    seq.set_num_lookahead_tokens(spec.num_speculative_tokens);
  }
  history.AddPrompt(request.prompt_ids);
  if (tok) detok.emplace(*tok, request.prompt_ids, /*skip_special=*/true);
}

LiveRequest::Committed LiveRequest::Commit(SampleResult sampled, absl::Time now,
                                           const CommitLimits& limits) {
  const SamplingParams& p = request.params;
  const int32_t num_generated = seq.num_generated();
  seq.AppendToken(sampled.id);
  history.AddOutput(sampled.id);
  Committed out;
  out.token = {{sampled.id, sampled.logprob, std::move(sampled.top)}};

  bool stopped = (!p.ignore_eos && Contains(*limits.eos_ids, sampled.id)) ||
                 Contains(p.stop_token_ids, sampled.id);
  if (detok) stopped |= stop.Append(detok->Push(sampled.id));
  const bool length = num_generated + 1 >= p.max_tokens || seq.num_tokens() >= limits.max_model_len;
  out.finished = stopped || length;
  if (out.finished && detok && !stop.stopped()) stopped |= stop.Append(detok->Flush());
  out.text = stop.TakeStreamable(out.finished);
  if (first_token && limits.observer != nullptr) {
    limits.observer->OnInterTokenLatency(Seconds(now - last_token));
  }
  if (!first_token) first_token = now;
  last_token = now;
  out.reason = stopped ? FinishReason::kStop : FinishReason::kLength;
  return out;
}

void LiveRequest::Emit(const TokenCallback* on_token, std::vector<GeneratedToken> new_tokens,
                       std::string text, bool finished, FinishReason reason, absl::Status status) {
  if (sink != nullptr) {  // offline
    for (GeneratedToken& t : new_tokens) {
      if (on_token != nullptr && *on_token) (*on_token)(index, t, text);
      tokens.push_back(std::move(t));
    }
    if (finished) {
      sink->prompt_ids = request.prompt_ids;
      sink->tokens = std::move(tokens);
      sink->text = stop.text();
      sink->finish_reason = reason;
      sink->usage = Usage();
    }
    return;
  }
  if (!on_output) return;
  RequestOutput out;
  out.id = id;
  out.tokens = std::move(new_tokens);
  out.text = std::move(text);
  out.finished = finished;
  out.finish_reason = reason;
  out.status = std::move(status);
  out.usage = Usage();
  on_output(std::move(out));
}

RequestUsage LiveRequest::Usage() const {
  RequestUsage u;
  u.prompt_tokens = seq.num_prompt_tokens();
  u.completion_tokens = seq.num_generated();
  u.cached_prompt_tokens = std::max(0, seq.num_cached_prompt_tokens());
  u.num_drafts = num_drafts;
  u.num_draft_tokens = num_draft_tokens;
  u.num_accepted_tokens = num_accepted_tokens;
  u.num_cache_hit_drafts = num_cache_hit_drafts;
  u.num_cache_hit_draft_tokens = num_cache_hit_draft_tokens;
  u.num_cache_hit_accepted_tokens = num_cache_hit_accepted_tokens;
  u.num_cache_miss_drafts = num_cache_miss_drafts;
  u.ssd_wait_seconds = ssd_wait_seconds;
  u.draft_context_stop = draft_context_stop;
  u.ssd = spec.method == SpeculationMethod::kSsd;
  for (const RequestUsage::MethodUsage& m : by_method) {
    if (m.num_drafts > 0) u.by_method.push_back(m);
  }
  return u;
}

FinishedRequestMetrics LiveRequest::FinishMetrics(FinishReason reason, const absl::Status& status,
                                                  absl::Time now) const {
  FinishedRequestMetrics m;
  m.outcome = OutcomeOf(reason, status);
  m.prompt_tokens = seq.num_prompt_tokens();
  m.generated_tokens = seq.num_generated();
  m.queue_seconds = Seconds(first_scheduled.value_or(now) - arrival);
  m.ttft_seconds = first_token ? Seconds(*first_token - arrival) : -1.0;
  m.e2e_seconds = Seconds(now - arrival);
  return m;
}

}  // namespace specd
