// UTF-8 helpers for the chat-template interpreter. Template strings are Python str
// values: indexing, slicing, length and case mapping work on code points. Bytes that are
// not valid UTF-8 map to U+DC80..U+DCFF (Python's surrogateescape) so that decoding and
// re-encoding is lossless. Any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/string_view.h"

namespace specd::jinja {

// Decodes `text` into code points (invalid bytes become U+DC80 + byte).
std::u32string DecodeUtf8(absl::string_view text);

// Appends the UTF-8 encoding of `cp` (surrogate-escaped bytes are written back raw).
void AppendUtf8(char32_t cp, std::string* out);
std::string EncodeUtf8(std::u32string_view cps);

// Number of code points in `text`.
size_t CodePointCount(absl::string_view text);

// Python's str.isspace() for one code point.
bool IsPySpace(char32_t cp);

// Case mapping for ASCII, Latin-1, Greek and Cyrillic; other code points are unchanged.
char32_t ToUpperCp(char32_t cp);
char32_t ToLowerCp(char32_t cp);
// True when the code point has a case in the tables above (Python's "cased").
bool IsCasedCp(char32_t cp);

std::string PyUpper(absl::string_view text);
std::string PyLower(absl::string_view text);

}  // namespace specd::jinja
