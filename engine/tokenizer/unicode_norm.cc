#include "engine/tokenizer/unicode_norm.h"

#include <vector>

#ifdef SPECD_HAVE_ICU
#include <unicode/unorm2.h>
#include <unicode/ustring.h>
#endif

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace specd::tok {

#ifdef SPECD_HAVE_ICU
namespace {

absl::Status IcuError(UErrorCode err, const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ICU error ", u_errorName(err)));
}

absl::Status ToUtf16(const std::string& text, std::vector<UChar>* out) {
  UErrorCode err = U_ZERO_ERROR;
  int32_t len = 0;
  u_strFromUTF8(nullptr, 0, &len, text.data(), static_cast<int32_t>(text.size()), &err);
  if (err != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(err)) return IcuError(err, "utf8->utf16");
  err = U_ZERO_ERROR;
  out->resize(len);
  u_strFromUTF8(out->data(), len, nullptr, text.data(), static_cast<int32_t>(text.size()), &err);
  return U_FAILURE(err) ? IcuError(err, "utf8->utf16") : absl::OkStatus();
}

absl::Status ToUtf8(const std::vector<UChar>& text, std::string* out) {
  UErrorCode err = U_ZERO_ERROR;
  int32_t len = 0;
  u_strToUTF8(nullptr, 0, &len, text.data(), static_cast<int32_t>(text.size()), &err);
  if (err != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(err)) return IcuError(err, "utf16->utf8");
  err = U_ZERO_ERROR;
  out->resize(len);
  u_strToUTF8(out->data(), len, nullptr, text.data(), static_cast<int32_t>(text.size()), &err);
  return U_FAILURE(err) ? IcuError(err, "utf16->utf8") : absl::OkStatus();
}

const UNormalizer2* GetNormalizer(UnicodeForm form, UErrorCode* err) {
  switch (form) {
    case UnicodeForm::kNfc:
      return unorm2_getNFCInstance(err);
    case UnicodeForm::kNfd:
      return unorm2_getNFDInstance(err);
    case UnicodeForm::kNfkc:
      return unorm2_getNFKCInstance(err);
    case UnicodeForm::kNfkd:
      return unorm2_getNFKDInstance(err);
  }
  return nullptr;
}

}  // namespace

bool HaveUnicodeNormalization() { return true; }

absl::Status NormalizeUnicode(UnicodeForm form, std::string* text) {
  bool ascii = true;
  for (char c : *text) ascii &= static_cast<unsigned char>(c) < 0x80;
  if (ascii) return absl::OkStatus();  // ASCII is invariant under every form
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* norm = GetNormalizer(form, &err);
  if (U_FAILURE(err)) return IcuError(err, "normalizer instance");
  std::vector<UChar> src, dst;
  if (absl::Status s = ToUtf16(*text, &src); !s.ok()) return s;
  int32_t len =
      unorm2_normalize(norm, src.data(), static_cast<int32_t>(src.size()), nullptr, 0, &err);
  if (err != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(err)) return IcuError(err, "normalize");
  err = U_ZERO_ERROR;
  dst.resize(len);
  unorm2_normalize(norm, src.data(), static_cast<int32_t>(src.size()), dst.data(), len, &err);
  if (U_FAILURE(err)) return IcuError(err, "normalize");
  return ToUtf8(dst, text);
}

absl::Status LowercaseUnicode(std::string* text) {
  std::vector<UChar> src, dst;
  if (absl::Status s = ToUtf16(*text, &src); !s.ok()) return s;
  UErrorCode err = U_ZERO_ERROR;
  int32_t len = u_strToLower(nullptr, 0, src.data(), static_cast<int32_t>(src.size()), "", &err);
  if (err != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(err)) return IcuError(err, "lowercase");
  err = U_ZERO_ERROR;
  dst.resize(len);
  u_strToLower(dst.data(), len, src.data(), static_cast<int32_t>(src.size()), "", &err);
  if (U_FAILURE(err)) return IcuError(err, "lowercase");
  return ToUtf8(dst, text);
}

#else  // !SPECD_HAVE_ICU

bool HaveUnicodeNormalization() { return false; }

absl::Status NormalizeUnicode(UnicodeForm, std::string*) {
  return absl::UnimplementedError("Unicode normalization needs ICU (not found at build time)");
}

absl::Status LowercaseUnicode(std::string* text) {
  absl::AsciiStrToLower(text);
  return absl::OkStatus();
}

#endif  // SPECD_HAVE_ICU

}  // namespace specd::tok
