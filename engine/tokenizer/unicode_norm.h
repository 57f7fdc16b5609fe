// Unicode normalization forms and lowercasing for the NFC/NFD/NFKC/NFKD and Lowercase
// normalizers (Qwen2 uses NFC). Backed by ICU when the build found it; without ICU the
// forms are unavailable and callers fall back as documented. Any thread.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace specd::tok {

enum class UnicodeForm { kNfc, kNfd, kNfkc, kNfkd };

// True if this build can normalize / lowercase beyond ASCII.
bool HaveUnicodeNormalization();

// Rewrites `text` (valid UTF-8) into `form`. Unimplemented without ICU.
absl::Status NormalizeUnicode(UnicodeForm form, std::string* text);

// Full Unicode lowercase (root locale) with ICU; ASCII-only otherwise.
absl::Status LowercaseUnicode(std::string* text);

}  // namespace specd::tok
