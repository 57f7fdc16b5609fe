#include "engine/tokenizer/byte_level.h"

#include <array>

#include "engine/tokenizer/utf8.h"

namespace specd::tok {
namespace {

constexpr int kNoByte = -1;
constexpr uint32_t kMaxAlphabetCodePoint = 0x200;

struct Tables {
  std::array<std::string, 256> byte_to_text;            // UTF-8 of the byte's code point
  std::array<int, kMaxAlphabetCodePoint> cp_to_byte{};  // kNoByte where not in the alphabet
};

bool IsSelfMapped(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

Tables BuildTables() {
  Tables t;
  t.cp_to_byte.fill(kNoByte);
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = IsSelfMapped(b) ? static_cast<uint32_t>(b) : next++;
    AppendUtf8(cp, &t.byte_to_text[b]);
    t.cp_to_byte[cp] = b;
  }
  return t;
}

const Tables& GetTables() {
  static const Tables* tables = new Tables(BuildTables());
  return *tables;
}

}  // namespace

void AppendByteLevel(std::string_view bytes, std::string* out) {
  const Tables& t = GetTables();
  for (char c : bytes) out->append(t.byte_to_text[static_cast<uint8_t>(c)]);
}

bool AppendBytesFromByteLevel(std::string_view text, std::string* out) {
  const Tables& t = GetTables();
  const size_t old_size = out->size();
  size_t pos = 0;
  while (pos < text.size()) {
    const Utf8Step step = DecodeUtf8(text, pos);
    if (!step.valid || step.code_point >= kMaxAlphabetCodePoint ||
        t.cp_to_byte[step.code_point] == kNoByte) {
      out->resize(old_size);
      return false;
    }
    out->push_back(static_cast<char>(t.cp_to_byte[step.code_point]));
    pos += step.len;
  }
  return true;
}

}  // namespace specd::tok
