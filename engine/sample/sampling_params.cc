#include "engine/sample/sampling_params.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/base/field_status.h"

namespace specd {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view why) {
  return FieldError(field, absl::StrCat(field, " ", why));
}

}  // namespace

absl::Status SamplingParams::Validate(int32_t vocab_size) const {
  constexpr int32_t kMaxLogprobs = 20;
  if (!std::isfinite(temperature) || temperature < 0.0f || temperature > 100.0f) {
    return Bad("temperature", "must be in [0, 100]");
  }
  if (!std::isfinite(top_p) || top_p <= 0.0f || top_p > 1.0f)
    return Bad("top_p", "must be in (0, 1]");
  if (top_k < -1) return Bad("top_k", "must be -1, 0 (off) or positive");
  if (!std::isfinite(min_p) || min_p < 0.0f || min_p > 1.0f)
    return Bad("min_p", "must be in [0, 1]");
  if (!std::isfinite(repetition_penalty) || repetition_penalty <= 0.0f ||
      repetition_penalty > 10.0f) {
    return Bad("repetition_penalty", "must be in (0, 10]");
  }
  if (!std::isfinite(presence_penalty) || std::fabs(presence_penalty) > 2.0f) {
    return Bad("presence_penalty", "must be in [-2, 2]");
  }
  if (!std::isfinite(frequency_penalty) || std::fabs(frequency_penalty) > 2.0f) {
    return Bad("frequency_penalty", "must be in [-2, 2]");
  }
  if (max_tokens < 1) return Bad("max_tokens", "must be at least 1");
  if (min_tokens < 0 || min_tokens > max_tokens)
    return Bad("min_tokens", "must be in [0, max_tokens]");
  if (logprobs < -1 || logprobs > kMaxLogprobs) {
    return Bad("logprobs", absl::StrCat("must be between 0 and ", kMaxLogprobs));
  }
  if (stop.size() > kMaxStopStrings) {
    return Bad("stop", absl::StrCat("has ", stop.size(), " strings; at most ", kMaxStopStrings,
                                    " are allowed"));
  }
  for (const std::string& s : stop) {
    if (s.empty()) return Bad("stop", "strings must not be empty");
    if (s.size() > kMaxStopStringBytes) {
      return Bad("stop", absl::StrCat("strings must be at most ", kMaxStopStringBytes,
                                      " bytes; one has ", s.size()));
    }
  }
  for (int32_t id : stop_token_ids) {
    if (id < 0 || id >= vocab_size)
      return Bad("stop_token_ids", absl::StrCat("has id ", id, " outside the vocabulary"));
  }
  return absl::OkStatus();
}

}  // namespace specd
