// UTF-8 helpers for the tokenizer: validation, code point iteration, and lossy repair with
// the same "maximal subpart" rule as Rust's String::from_utf8_lossy (what HF tokenizers
// uses), so decoded text never carries a broken sequence. Pure functions; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace specd::tok {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// One step of decoding at `pos`: the code point and the number of bytes it used. For an
// invalid sequence `valid` is false and `len` is the length of its maximal subpart (>= 1),
// the bytes that one U+FFFD stands for.
struct Utf8Step {
  uint32_t code_point = 0;
  size_t len = 1;
  bool valid = false;
};
Utf8Step DecodeUtf8(std::string_view text, size_t pos);

bool IsValidUtf8(std::string_view text);

// Replaces every invalid sequence (maximal subpart) with U+FFFD.
std::string Utf8Lossy(std::string_view bytes);

// Appends the UTF-8 encoding of `cp` (must be a scalar value).
void AppendUtf8(uint32_t cp, std::string* out);

// Byte length of the character starting with `lead` (1 for continuation/invalid bytes).
size_t Utf8LeadLength(uint8_t lead);

// Unicode White_Space property (what Rust's char::is_whitespace tests).
bool IsUnicodeWhitespace(uint32_t cp);

}  // namespace specd::tok
