// Finds stop strings in a sequence's growing output text and decides how much text is
// safe to stream: the tail that could still become the start of a stop string is held
// back until it can't. Stop strings are not part of the returned text (OpenAI semantics).
// Each stop string keeps a Knuth-Morris-Pratt match state across appends, so a new byte
// costs amortized O(number of stop strings), whatever their lengths or the text's, and the
// held-back tail is the longest of those states. One per sequence; engine thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace specd {

class StopChecker {
 public:
  // Empty strings never match (requests with one are refused by SamplingParams::Validate).
  explicit StopChecker(std::vector<std::string> stops);

  // Appends newly decoded text. Returns true if a stop string is now complete; the output
  // is then cut just before the earliest-starting stop string found in this delta.
  bool Append(std::string_view delta);

  // Text that can be streamed now and was not returned before. With final=true the held
  // back tail is released too (the sequence ended for another reason).
  std::string TakeStreamable(bool final);

  const std::string& text() const { return text_; }
  bool stopped() const { return stopped_; }

 private:
  struct Matcher {
    std::string stop;
    std::vector<int32_t> failure;  // [stop.size()] KMP: longest proper border of stop[0..i]
    int32_t matched = 0;           // longest suffix of the text that is a prefix of stop
  };
  // Advances m over byte c; true when the whole stop string has just matched.
  static bool Step(Matcher& m, char c);

  std::vector<Matcher> matchers_;
  std::string text_;
  size_t streamed_ = 0;  // bytes of text_ already handed out
  bool stopped_ = false;
};

}  // namespace specd
