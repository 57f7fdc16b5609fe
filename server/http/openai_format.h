// Engine results -> OpenAI response bodies and SSE events, in OpenAI's exact shapes:
// text_completion / chat.completion objects, streamed chunks (chat: a role delta first,
// then content deltas, then an empty delta with finish_reason), the include_usage chunk
// (empty choices), legacy completion logprobs (tokens / token_logprobs / top_logprobs /
// text_offset) and chat logprobs (content[] with token / logprob / bytes / top_logprobs),
// SSE error events and `data: [DONE]`. Pure; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "server/http/errors.h"
#include "server/http/openai_api.h"

namespace specd {
class Tokenizer;
}  // namespace specd

namespace specd::http {

// What every body of one response shares.
struct ResponseMeta {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;       // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  bool include_usage = false;            // streams: chunks carry "usage": null
  const Tokenizer* tokenizer = nullptr;  // token strings for logprobs; may be null
  bool tokens_as_ids = false;            // logprobs tokens as "token_id:N"
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  // Speculative decoding, summed over choices; reported as usage.speculation {num_drafts,
  // num_draft_tokens, num_accepted_tokens, mean_accepted_length} only when set.
  bool report_speculation = false;
  int64_t num_drafts = 0;
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  // SSD (reported as usage.speculation.ssd when report_ssd: a choice ran SSD, RequestUsage::ssd):
  // rounds drafted from the speculation cache and their draft / accepted tokens, rounds drafted
  // by a fallback, and the time the rounds waited for the speculator.
  bool report_ssd = false;
  int64_t num_cache_hit_drafts = 0;
  int64_t num_cache_hit_draft_tokens = 0;
  int64_t num_cache_hit_accepted_tokens = 0;
  int64_t num_cache_miss_drafts = 0;
  double ssd_wait_seconds = 0;
  // The draft model's context where a choice grew past it (usage.speculation.draft_context_stop
  // when > 0: that choice decoded on without draft-model drafts).
  int32_t draft_context_stop = 0;
  // Per method that drafted (usage.speculation.by_method), summed over choices.
  std::vector<RequestUsage::MethodUsage> by_method = {};
  // Adds one choice's per-method counts to by_method.
  void AddByMethod(const std::vector<RequestUsage::MethodUsage>& counts);
};

// One finished choice of a non-streamed response.
struct ChoiceOutput {
  std::string text;
  std::vector<GeneratedToken> tokens;
  FinishReason finish_reason = FinishReason::kLength;
};

// The whole non-streamed body; choices[i] has index i.
std::string FormatResponse(const ResponseMeta& meta, const std::vector<ChoiceOutput>& choices,
                           const Usage& usage);

// SSE events ("data: ...\n\n"). A content chunk carries `text` and, with logprobs, the
// logprobs of `tokens`; text_offset is the choice's running character offset (completions).
std::string ContentEvent(const ResponseMeta& meta, int32_t index, std::string_view text,
                         std::span<const GeneratedToken> tokens, int64_t* text_offset);
// Chat only: the first delta of a choice, {"role": "assistant", "content": ""}.
std::string RoleEvent(const ResponseMeta& meta, int32_t index);
// The last chunk of a choice: empty delta / text, finish_reason set.
std::string FinishEvent(const ResponseMeta& meta, int32_t index, FinishReason reason);
std::string UsageEvent(const ResponseMeta& meta, const Usage& usage);
std::string ErrorEvent(const ApiError& error);
std::string DoneEvent();

// The token's text for logprobs ("token_id:N" without a tokenizer) and its raw bytes.
std::string TokenText(const Tokenizer* tokenizer, int32_t id);
std::vector<uint8_t> TokenBytes(const Tokenizer* tokenizer, int32_t id);

}  // namespace specd::http
