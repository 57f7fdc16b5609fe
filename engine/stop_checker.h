// Finds stop strings in a sequence's growing output text and decides how much text is
// safe to stream: the tail that could still become the start of a stop string is held
// back until it can't. Stop strings are not part of the returned text (OpenAI semantics).
// One per sequence; engine thread only.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace specd {

class StopChecker {
 public:
  explicit StopChecker(std::vector<std::string> stops);

  // Appends newly decoded text. Returns true if a stop string is now complete; the output
  // is then cut just before it.
  bool Append(std::string_view delta);

  // Text that can be streamed now and was not returned before. With final=true the held
  // back tail is released too (the sequence ended for another reason).
  std::string TakeStreamable(bool final);

  const std::string& text() const { return text_; }
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  size_t max_stop_len_ = 0;
  std::string text_;
  size_t streamed_ = 0;  // bytes of text_ already handed out
  bool stopped_ = false;
};

}  // namespace specd
