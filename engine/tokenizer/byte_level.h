// GPT-2's byte-level alphabet: every byte maps to a printable code point (printable
// Latin-1 bytes to themselves, the rest to U+0100 onwards), so byte-level BPE vocabularies
// are plain strings. Pure functions over a static table; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace specd::tok {

// Appends the byte-level form of every byte of `bytes`.
void AppendByteLevel(std::string_view bytes, std::string* out);

// Appends the bytes that byte-level `text` (valid UTF-8) stands for. Returns false, with
// `out` unchanged, if a character is outside the alphabet.
bool AppendBytesFromByteLevel(std::string_view text, std::string* out);

}  // namespace specd::tok
