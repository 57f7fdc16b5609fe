#include "engine/stop_checker.h"

#include <algorithm>

namespace specd {

StopChecker::StopChecker(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const auto& s : stops_) max_stop_len_ = std::max(max_stop_len_, s.size());
}

bool StopChecker::Append(std::string_view delta) {
  if (stopped_) return true;
  // A stop string can only end inside the new text, so search from where it could start.
  const size_t search_from = text_.size() > max_stop_len_ ? text_.size() - max_stop_len_ : 0;
  text_.append(delta);
  size_t best = std::string::npos;
  for (const auto& s : stops_) best = std::min(best, text_.find(s, search_from));
  if (best == std::string::npos) return false;
  text_.resize(best);
  streamed_ = std::min(streamed_, text_.size());
  stopped_ = true;
  return true;
}

std::string StopChecker::TakeStreamable(bool final) {
  size_t end = text_.size();
  if (!final && !stopped_ && max_stop_len_ > 0) {
    // Hold back the longest tail that is a proper prefix of some stop string.
    size_t hold = 0;
    for (const auto& s : stops_) {
      for (size_t len = std::min(s.size() - 1, text_.size()); len > hold; --len) {
        if (text_.compare(text_.size() - len, len, s, 0, len) == 0) {
          hold = len;
          break;
        }
      }
    }
    end = text_.size() - hold;
  }
  if (end <= streamed_) return {};
  std::string out = text_.substr(streamed_, end - streamed_);
  streamed_ = end;
  return out;
}

}  // namespace specd
