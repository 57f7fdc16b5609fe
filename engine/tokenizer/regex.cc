#include "engine/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/string_view_compat.h"
#include "engine/tokenizer/utf8.h"

namespace specd::tok {
namespace {

// Oniguruma's (and Rust's) \s is the White_Space property; PCRE2 10.42's UCP \s differs
// slightly, so spell the property out. Other escapes are copied unchanged.
std::string TranslatePattern(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 16);
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c != '\\' || i + 1 == pattern.size()) {
      out.push_back(c);
      continue;
    }
    const char next = pattern[++i];
    if (next == 's') {
      out.append("\\p{White_Space}");
    } else if (next == 'S') {
      out.append("\\P{White_Space}");
    } else {
      out.push_back('\\');
      out.push_back(next);
    }
  }
  return out;
}

std::string ErrorMessage(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* md) const { pcre2_match_data_free(md); }
};

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

Regex::Regex(std::string pattern, std::unique_ptr<Code> code)
    : pattern_(std::move(pattern)), code_(std::move(code)) {}

Regex::~Regex() = default;

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern) {
  if (!IsValidUtf8(pattern)) {
    return absl::InvalidArgumentError("regex pattern is not valid UTF-8");
  }
  const std::string translated = TranslatePattern(pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  auto code = std::make_unique<Code>();
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                             PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code->code == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("bad regex '", AsAbsl(pattern), "' at offset ",
                                                   error_offset, ": ", ErrorMessage(error_code)));
  }
  // JIT is an optimisation only; the interpreter is used where it is unavailable.
  pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<Regex>(new Regex(std::string(pattern), std::move(code)));
}

absl::Status Regex::FindAll(std::string_view text, std::vector<Match>* matches) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(
      pcre2_match_data_create_from_pattern(code_->code, nullptr));
  if (md == nullptr) return absl::ResourceExhaustedError("pcre2 match data allocation failed");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start < text.size()) {
    int rc = pcre2_match(code_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, md.get(),
                         nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // Very long runs can exhaust the JIT stack; the interpreter keeps its frames on the heap.
      rc = pcre2_match(code_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       md.get(), nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return absl::InternalError(absl::StrCat("regex '", pattern_, "' failed: ", ErrorMessage(rc)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(md.get());
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (end > begin) {
      matches->emplace_back(begin, end);
      start = end;
    } else {
      // Empty match: step over one character, as Rust's find_iter does.
      start = begin + Utf8LeadLength(static_cast<uint8_t>(text[begin]));
    }
  }
  return absl::OkStatus();
}

std::string RegexQuote(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}-/#&~").find(c) != std::string_view::npos) {
      out.push_back('\\');
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace specd::tok
