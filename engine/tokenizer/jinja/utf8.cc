// UTF-8 decoding, encoding and Python-like character classes (see utf8.h).
#include "engine/tokenizer/jinja/utf8.h"

namespace specd::jinja {
namespace {

constexpr char32_t kEscapeBase = 0xDC80;

// Length of the UTF-8 sequence starting with `lead`, or 0 when `lead` cannot start one.
int SequenceLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Decodes one code point at text[*pos], advancing *pos.
char32_t DecodeOne(absl::string_view text, size_t* pos) {
  const auto lead = static_cast<unsigned char>(text[*pos]);
  const int len = SequenceLength(lead);
  if (len == 1) {
    ++*pos;
    return lead;
  }
  if (len == 0 || *pos + len > text.size()) {
    ++*pos;
    return kEscapeBase + lead;
  }
  char32_t cp = lead & (0xFF >> (len + 1));
  for (int i = 1; i < len; ++i) {
    const auto c = static_cast<unsigned char>(text[*pos + i]);
    if ((c & 0xC0) != 0x80) {
      ++*pos;
      return kEscapeBase + lead;
    }
    cp = (cp << 6) | (c & 0x3F);
  }
  const bool overlong = (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
  if (overlong || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++*pos;
    return kEscapeBase + lead;
  }
  *pos += len;
  return cp;
}

}  // namespace

std::u32string DecodeUtf8(absl::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) out.push_back(DecodeOne(text, &pos));
  return out;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp >= kEscapeBase && cp <= kEscapeBase + 0xFF && cp - kEscapeBase >= 0x80) {
    out->push_back(static_cast<char>(cp - kEscapeBase));
  } else if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string EncodeUtf8(std::u32string_view cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) AppendUtf8(cp, &out);
  return out;
}

size_t CodePointCount(absl::string_view text) {
  size_t count = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    DecodeOne(text, &pos);
    ++count;
  }
  return count;
}

bool IsPySpace(char32_t cp) {
  if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F)) return true;
  if (cp < 0x80) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

char32_t ToUpperCp(char32_t cp) {
  if (cp >= 'a' && cp <= 'z') return cp - 32;
  if (cp < 0x80) return cp;
  if (cp >= 0xE0 && cp <= 0xFE && cp != 0xF7) return cp - 32;
  if (cp == 0xFF) return 0x178;
  if (cp >= 0x3B1 && cp <= 0x3C9 && cp != 0x3C2) return cp - 32;
  if (cp >= 0x430 && cp <= 0x44F) return cp - 32;
  if (cp >= 0x450 && cp <= 0x45F) return cp - 80;
  return cp;
}

char32_t ToLowerCp(char32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + 32;
  if (cp < 0x80) return cp;
  if (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) return cp + 32;
  if (cp == 0x178) return 0xFF;
  if (cp >= 0x391 && cp <= 0x3A9 && cp != 0x3A2) return cp + 32;
  if (cp >= 0x410 && cp <= 0x42F) return cp + 32;
  if (cp >= 0x400 && cp <= 0x40F) return cp + 80;
  return cp;
}

bool IsCasedCp(char32_t cp) {
  return ToUpperCp(cp) != cp || ToLowerCp(cp) != cp || cp == 0xDF || cp == 0x3C2;
}

std::string PyUpper(absl::string_view text) {
  std::u32string cps = DecodeUtf8(text);
  for (char32_t& cp : cps) cp = ToUpperCp(cp);
  return EncodeUtf8(cps);
}

std::string PyLower(absl::string_view text) {
  std::u32string cps = DecodeUtf8(text);
  for (char32_t& cp : cps) cp = ToLowerCp(cp);
  return EncodeUtf8(cps);
}

}  // namespace specd::jinja
