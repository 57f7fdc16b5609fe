// What a caller hands the engine and gets back: a request (prompt, sampling, speculation,
// deadline), its generated tokens and usage, and the updates a serving request streams. Part of
// the engine's API (engine.h includes it); the step pipeline (engine/step) fills them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/sample/sampler.h"
#include "engine/sample/sampling_params.h"
#include "engine/speculation/spec_config.h"

namespace specd {

struct GenerateRequest {
  std::vector<int32_t> prompt_ids;  // [num_prompt_tokens], BOS included if wanted
  SamplingParams params;
  SpeculationParams speculation;  // method and K for this request (default: the server's)
  // Serving only: past it the request ends with DeadlineExceeded wherever it is.
  absl::Time deadline = absl::InfiniteFuture();
  std::string request_id;  // the front end's id, for logs (optional)
};

// kAbort: cancelled by Abort(), a deadline, Stop(), or an engine error (see the status).
enum class FinishReason { kStop, kLength, kAbort };
const char* FinishReasonName(FinishReason r);

struct GeneratedToken {
  int32_t id = 0;
  float logprob = 0.0f;           // when params.logprobs >= 0
  std::vector<TokenLogprob> top;  // [params.logprobs]
};

// Token counts of a request, as OpenAI's `usage` reports them.
struct RequestUsage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_prompt_tokens = 0;  // prompt tokens whose KV came from the prefix cache
  // Speculative decoding: verification rounds that carried drafts, draft tokens proposed,
  // and drafts the target accepted (every committed token is the target's either way).
  int64_t num_drafts = 0;
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  // SSD: rounds whose drafts came from the speculation cache, and their draft / accepted
  // tokens (the rest came from a fallback).
  int64_t num_cache_hit_drafts = 0;
  int64_t num_cache_hit_draft_tokens = 0;
  int64_t num_cache_hit_accepted_tokens = 0;
  // SSD: rounds with drafts that came from a fallback (the primary's re-draft, the backup, or
  // local n-gram drafts without a speculator), and the time the request's rounds waited for the
  // speculator's reply (each round's wait counts once per sequence in it; ssd_stats.h kWait).
  int64_t num_cache_miss_drafts = 0;
  double ssd_wait_seconds = 0;
  bool ssd = false;  // the request's speculation resolved to method ssd
  // The draft model's context (tokens) when the request grew past it: from there it decoded
  // without draft-model drafts (a draft whose max_position_embeddings is below max_model_len);
  // 0 when it never reached it.
  int32_t draft_context_stop = 0;
  // The same three counts per method that drafted (`auto` may use several), in the order
  // draft_model, ngram, ssd, vegas, streaming, eagle3; methods without rounds are left out.
  struct MethodUsage {
    const char* method = "";  // SpeculationMethodName
    int64_t num_drafts = 0;
    int64_t num_draft_tokens = 0;
    int64_t num_accepted_tokens = 0;
  };
  std::vector<MethodUsage> by_method = {};
  // Tokens committed per verification round: 1 + accepted / drafts (vLLM's "mean acceptance
  // length"); 0 without rounds.
  double mean_accepted_length() const {
    return num_drafts > 0 ? 1.0 + static_cast<double>(num_accepted_tokens) / num_drafts : 0.0;
  }
};

struct GenerateResult {
  std::vector<int32_t> prompt_ids;
  std::vector<GeneratedToken> tokens;  // generated, EOS included when it ended the request
  std::string text;                    // detokenized output, stop string removed
  FinishReason finish_reason = FinishReason::kLength;
  RequestUsage usage;  // token counts and speculation stats

  std::vector<int32_t> ids() const;
};

// Called for each generated token with the request's index in the batch and the text that
// became safe to stream (may be empty).
using TokenCallback = std::function<void(size_t index, const GeneratedToken&, std::string_view)>;

using RequestId = uint64_t;

// One update of a serving request. tokens/text are what is new since the previous update.
struct RequestOutput {
  RequestId id = 0;
  std::vector<GeneratedToken> tokens;
  std::string text;       // text that became safe to stream (stop strings held back, cut)
  bool finished = false;  // last update of this request
  FinishReason finish_reason = FinishReason::kLength;  // when finished
  // When finished: OK, or why the request failed: Cancelled (Abort), DeadlineExceeded,
  // Unavailable (Stop() before it finished), Internal (engine error). Tokens already
  // streamed stay valid.
  absl::Status status;
  RequestUsage usage;  // running totals; final when finished
};

// Called on the engine thread; must be quick and must not block or call back into the
// engine except Abort (e.g. post to an I/O loop, or push into a queue and notify).
using OutputCallback = std::function<void(RequestOutput&&)>;

}  // namespace specd
