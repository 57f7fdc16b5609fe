// One request while it is live: its scheduler Sequence plus what turns drawn tokens into streamed
// text, usage and metrics (its lifecycle: commit, finish, emit, usage). The step pipeline
// (step_pipeline.h) owns every LiveRequest; engine thread (or the offline caller) only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/base/draft_method.h"
#include "engine/policy/ssv_planner.h"
#include "engine/sample/acceptance.h"
#include "engine/sample/sampler.h"
#include "engine/sched/sequence.h"
#include "engine/speculation/spec_config.h"
#include "engine/step/generate_types.h"
#include "engine/step/metrics.h"
#include "engine/step/stop_checker.h"
#include "engine/tokenizer/incremental_detokenizer.h"

namespace specd {

class Tokenizer;

// What LiveRequest::Commit needs to know of the server.
struct CommitLimits {
  const std::vector<int32_t>* eos_ids = nullptr;  // the model's EOS ids
  int32_t max_model_len = 0;
  EngineObserver* observer = nullptr;  // inter-token latency; may be null
};

struct LiveRequest {
  LiveRequest(RequestId id, GenerateRequest req, ResolvedSpeculation spec, int32_t block_size,
              const Tokenizer* tok);

  RequestId id;
  GenerateRequest request;
  Sequence seq;
  uint64_t seed;  // the request's, or drawn at arrival: CPU sampler RNG and GPU Philox key
  Sampler sampler;
  ResolvedSpeculation spec;          // what this request speculates with (Admit resolved it)
  std::optional<Acceptor> acceptor;  // when spec.enabled(): verification, its own seeded RNG
  int64_t num_drafts = 0;            // speculation stats (RequestUsage)
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  int64_t num_cache_hit_drafts = 0;  // SSD: rounds drafted from the speculation cache
  int64_t num_cache_hit_draft_tokens = 0;
  int64_t num_cache_hit_accepted_tokens = 0;
  int64_t num_cache_miss_drafts = 0;  // SSD: rounds drafted by a fallback
  double ssd_wait_seconds = 0;        // SSD: its rounds' waits for the speculator's reply
  int32_t draft_context_stop = 0;     // the draft model's context, once the request passed it
  // This step's speculation (Prepare): `spec`, or for auto `spec` with the policy's method and
  // K (method kNone: plain). What Speculate, BuildBatch and Apply read.
  ResolvedSpeculation step;
  bool used_policy = false;    // auto: the policy has state for it (Forget when it ends)
  int32_t policy_method = -1;  // the policy's last strategy for it (DraftMethod, K)
  int32_t policy_k = 0;
  // NSA targets with an SSV plan: the profile strategy (CostProfile::ssv() index) this step's
  // verification runs, -1: `step.ssv` as resolved; and the request's acceptance per strategy.
  int32_t ssv_index = -1;
  int32_t ssv_held = -1;  // the last strategy the plan gave it (SsvPlanner's hysteresis)
  SsvAcceptance ssv_acceptance;
  uint32_t used_speculators = 0;  // bit DraftMethodIndex(m): method m's speculator drafted for it
  // Rounds, draft and accepted tokens per method (DraftMethodIndex).
  std::array<RequestUsage::MethodUsage, kNumDraftMethods> by_method{};
  TokenHistory history;
  std::optional<IncrementalDetokenizer> detok;
  StopChecker stop;
  OutputCallback on_output;            // serving
  GenerateResult* sink = nullptr;      // offline: where the result goes when finished
  size_t index = 0;                    // offline: index in the batch, for on_token
  std::vector<GeneratedToken> tokens;  // generated so far (offline result)
  absl::Time arrival;
  std::optional<absl::Time> first_scheduled;
  std::optional<absl::Time> first_token;
  absl::Time last_token;

  // Appends one drawn token (history, stop strings, max_tokens, the context limit, timing) and
  // returns what it made: the token and the text that became safe to stream, and whether it
  // finished the request (and why). The caller emits it or finishes the request with it.
  struct Committed {
    bool finished = false;
    FinishReason reason = FinishReason::kLength;  // when finished
    std::vector<GeneratedToken> token;            // the one token
    std::string text;
  };
  Committed Commit(SampleResult sampled, absl::Time now, const CommitLimits& limits);
  // Sends an update: to on_output (serving) or on_token and the result (offline).
  void Emit(const TokenCallback* on_token, std::vector<GeneratedToken> new_tokens, std::string text,
            bool finished, FinishReason reason, absl::Status status);
  RequestUsage Usage() const;
  // The metrics of this request finishing now.
  FinishedRequestMetrics FinishMetrics(FinishReason reason, const absl::Status& status,
                                       absl::Time now) const;
};

}  // namespace specd
