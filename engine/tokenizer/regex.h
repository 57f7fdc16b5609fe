// A compiled Unicode regular expression for pre-tokenizer splits and normalizer replaces
// (PCRE2 in UTF + UCP mode, JIT-compiled when the platform allows). HF tokenizers use
// Oniguruma, whose `\s` is Unicode White_Space; patterns are rewritten so PCRE2 agrees.
// Immutable after Compile(): FindAll may run on any thread concurrently.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace specd::tok {

class Regex {
 public:
  // [begin, end) byte offsets of one match.
  using Match = std::pair<size_t, size_t>;

  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends every non-overlapping, non-empty match in `text` (valid UTF-8), left to right.
  absl::Status FindAll(std::string_view text, std::vector<Match>* matches) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  Regex(std::string pattern, std::unique_ptr<Code> code);

  std::string pattern_;
  std::unique_ptr<Code> code_;
};

// Escapes `literal` so it matches itself inside a pattern.
std::string RegexQuote(std::string_view literal);

}  // namespace specd::tok
