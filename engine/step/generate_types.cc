#include "engine/step/generate_types.h"

#include "engine/step/metrics.h"

namespace specd {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
  }
  return "unknown";
}

const char* RequestOutcomeName(RequestOutcome o) {
  switch (o) {
    case RequestOutcome::kStop:
      return "stop";
    case RequestOutcome::kLength:
      return "length";
    case RequestOutcome::kAbort:
      return "abort";
    case RequestOutcome::kDeadline:
      return "deadline";
    case RequestOutcome::kError:
      return "error";
  }
  return "unknown";
}

std::vector<int32_t> GenerateResult::ids() const {
  std::vector<int32_t> out;
  out.reserve(tokens.size());
  for (const auto& t : tokens) out.push_back(t.id);
  return out;
}

}  // namespace specd
