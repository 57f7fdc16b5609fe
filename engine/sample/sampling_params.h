// Per-request sampling parameters with OpenAI / vLLM semantics, validated once when a
// request is accepted and immutable afterwards. Any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace specd {

// Limits on stop strings (OpenAI allows 4; vLLM has no limit): what a request may ask the
// stop checker to watch for on every token.
inline constexpr size_t kMaxStopStrings = 64;
inline constexpr size_t kMaxStopStringBytes = 1024;

struct SamplingParams {
  float temperature = 1.0f;         // 0 = greedy
  float top_p = 1.0f;               // (0, 1]
  int32_t top_k = 0;                // 0 or -1 = off
  float min_p = 0.0f;               // [0, 1]
  float repetition_penalty = 1.0f;  // > 0; prompt and output tokens (HF / vLLM rule)
  float presence_penalty = 0.0f;    // [-2, 2]; output tokens
  float frequency_penalty = 0.0f;   // [-2, 2]; output tokens
  std::optional<uint64_t> seed;     // same seed, same output
  int32_t max_tokens = 16;          // >= 1 generated tokens
  int32_t min_tokens = 0;           // EOS / stop ids suppressed before this many
  std::vector<std::string> stop;    // stop strings; not included in the returned text
                                    // (at most kMaxStopStrings of 1..kMaxStopStringBytes)
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int32_t logprobs = -1;  // -1: none; n >= 0: sampled token's logprob plus top-n

  bool greedy() const { return temperature == 0.0f; }
  bool has_penalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
  // InvalidArgument naming the field (the message's first word and the field payload, FieldOf
  // in engine/base/status.h) for out-of-range or non-finite values.
  absl::Status Validate(int32_t vocab_size) const;
};

}  // namespace specd
