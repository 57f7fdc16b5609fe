#include "engine/step/stop_checker.h"

#include <algorithm>

namespace specd {

StopChecker::StopChecker(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    if (s.empty()) continue;
    Matcher m;
    m.failure.assign(s.size(), 0);
    for (size_t i = 1, k = 0; i < s.size(); ++i) {
      while (k > 0 && s[i] != s[k]) k = static_cast<size_t>(m.failure[k - 1]);
      if (s[i] == s[k]) ++k;
      m.failure[i] = static_cast<int32_t>(k);
    }
    m.stop = std::move(s);
    matchers_.push_back(std::move(m));
  }
}

bool StopChecker::Step(Matcher& m, char c) {
  int32_t k = m.matched;
  // A full match only ends the text once; continue from its border for later bytes.
  if (k == static_cast<int32_t>(m.stop.size())) k = m.failure[k - 1];
  while (k > 0 && m.stop[k] != c) k = m.failure[k - 1];
  if (m.stop[k] == c) ++k;
  m.matched = k;
  return k == static_cast<int32_t>(m.stop.size());
}

bool StopChecker::Append(std::string_view delta) {
  if (stopped_) return true;
  const size_t base = text_.size();
  text_.append(delta);
  size_t best = std::string::npos;  // earliest start of a stop string ending in delta
  for (size_t i = 0; i < delta.size(); ++i) {
    for (Matcher& m : matchers_) {
      if (Step(m, delta[i])) best = std::min(best, base + i + 1 - m.stop.size());
    }
  }
  if (best == std::string::npos) return false;
  text_.resize(best);
  streamed_ = std::min(streamed_, text_.size());
  stopped_ = true;
  return true;
}

std::string StopChecker::TakeStreamable(bool final) {
  size_t end = text_.size();
  if (!final && !stopped_) {
    // Hold back the longest tail that is a proper prefix of some stop string.
    size_t hold = 0;
    for (const Matcher& m : matchers_) hold = std::max(hold, static_cast<size_t>(m.matched));
    end = text_.size() - std::min(hold, text_.size());
  }
  if (end <= streamed_) return {};
  std::string out = text_.substr(streamed_, end - streamed_);
  streamed_ = end;
  return out;
}

}  // namespace specd
