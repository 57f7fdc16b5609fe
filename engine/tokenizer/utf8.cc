#include "engine/tokenizer/utf8.h"

namespace specd::tok {
namespace {

bool IsContinuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// Allowed range of the second byte for a lead byte (Unicode Table 3-7); the remaining
// continuation bytes are always 0x80..0xBF.
void SecondByteRange(uint8_t lead, uint8_t* lo, uint8_t* hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (lead == 0xE0) *lo = 0xA0;
  if (lead == 0xED) *hi = 0x9F;
  if (lead == 0xF0) *lo = 0x90;
  if (lead == 0xF4) *hi = 0x8F;
}

}  // namespace

size_t Utf8LeadLength(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 1;
}

Utf8Step DecodeUtf8(std::string_view text, size_t pos) {
  Utf8Step step;
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  const uint8_t lead = s[pos];
  if (lead < 0x80) {
    step.code_point = lead;
    step.valid = true;
    return step;
  }
  const size_t need = Utf8LeadLength(lead);
  if (need == 1) return step;  // continuation byte or invalid lead: one byte, invalid
  uint32_t cp = lead & (need == 2 ? 0x1F : need == 3 ? 0x0F : 0x07);
  uint8_t lo, hi;
  SecondByteRange(lead, &lo, &hi);
  size_t i = 1;
  for (; i < need; ++i) {
    if (pos + i >= n) break;
    const uint8_t b = s[pos + i];
    const bool ok = (i == 1) ? (b >= lo && b <= hi) : IsContinuation(b);
    if (!ok) break;
    cp = (cp << 6) | (b & 0x3F);
  }
  step.len = i;
  if (i == need) {
    step.code_point = cp;
    step.valid = true;
  }
  return step;
}

bool IsValidUtf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Utf8Step step = DecodeUtf8(text, pos);
    if (!step.valid) return false;
    pos += step.len;
  }
  return true;
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    const Utf8Step step = DecodeUtf8(bytes, pos);
    if (step.valid) {
      out.append(bytes.substr(pos, step.len));
    } else {
      out.append(kReplacementChar);
    }
    pos += step.len;
  }
  return out;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
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

bool IsUnicodeWhitespace(uint32_t cp) {
  if (cp >= 0x09 && cp <= 0x0D) return true;
  switch (cp) {
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

}  // namespace specd::tok
