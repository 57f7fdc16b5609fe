// Jinja lexer with transformers' whitespace settings (see lexer.h). Mirrors the rules of
// jinja2's lexer: tag ends are only recognized outside brackets, lstrip_blocks strips
// the indentation before `{%`/`{#` when nothing else precedes it on the line, and
// trim_blocks drops the newline right after `%}`/`#}`.
#include "engine/tokenizer/jinja/lexer.h"

#include <algorithm>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/tokenizer/jinja/utf8.h"

namespace specd::jinja {
namespace {

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Decodes the code point at s[pos] and returns its byte length (0 at the end).
size_t NextCodePoint(absl::string_view s, size_t pos, char32_t* cp) {
  if (pos >= s.size()) return 0;
  size_t len = 1;
  const auto lead = static_cast<unsigned char>(s[pos]);
  if (lead >= 0xF0) {
    len = 4;
  } else if (lead >= 0xE0) {
    len = 3;
  } else if (lead >= 0xC0) {
    len = 2;
  }
  len = std::min(len, s.size() - pos);
  const std::u32string cps = DecodeUtf8(s.substr(pos, len));
  *cp = cps.empty() ? 0 : cps[0];
  // An invalid sequence decodes to several escape code points: consume one byte.
  return cps.size() == 1 ? len : 1;
}

// Index of the first non-whitespace (Python \s) character at or after `pos`.
size_t SkipSpace(absl::string_view s, size_t pos) {
  char32_t cp = 0;
  while (size_t len = NextCodePoint(s, pos, &cp)) {
    if (!IsPySpace(cp)) break;
    pos += len;
  }
  return pos;
}

// Length of `s` without its trailing whitespace.
size_t RStripLength(absl::string_view s) {
  size_t end = 0;
  size_t pos = 0;
  char32_t cp = 0;
  while (size_t len = NextCodePoint(s, pos, &cp)) {
    pos += len;
    if (!IsPySpace(cp)) end = pos;
  }
  return end;
}

std::string NormalizeNewlines(absl::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  // keep_trailing_newline=False: the template's last newline is not output.
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

void AppendEscape(absl::string_view body, size_t* i, std::string* out);

// Decodes a Python string literal body (the text between the quotes).
std::string DecodeStringBody(absl::string_view body) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 >= body.size()) {
      out.push_back(body[i]);
      continue;
    }
    ++i;
    AppendEscape(body, &i, &out);
  }
  return out;
}

// The character a one-letter escape stands for, or 0.
char SimpleEscape(char c) {
  static constexpr absl::string_view kFrom = "ntr\\'\"abfv";
  static constexpr absl::string_view kTo = "\n\t\r\\'\"\a\b\f\v";
  const size_t at = kFrom.find(c);
  return at == absl::string_view::npos ? 0 : kTo[at];
}

// Decodes the octal (\ooo) or hex (\xhh, \uhhhh, \Uhhhhhhhh) escape whose first character
// after the backslash is body[*i]; returns false when it is not one.
bool AppendNumericEscape(absl::string_view body, size_t* i, std::string* out) {
  const char c = body[*i];
  size_t start = *i;
  size_t len = 0;
  int base = 8;
  if (c >= '0' && c <= '7') {
    while (len < 3 && start + len < body.size() && body[start + len] >= '0' &&
           body[start + len] <= '7') {
      ++len;
    }
  } else {
    len = c == 'x' ? 2 : (c == 'u' ? 4 : (c == 'U' ? 8 : 0));
    start = *i + 1;
    base = 16;
    if (len == 0 || start + len > body.size()) return false;
    for (char h : body.substr(start, len)) {
      if (!IsDigit(h) && !(h >= 'a' && h <= 'f') && !(h >= 'A' && h <= 'F')) return false;
    }
  }
  const unsigned long cp =
      std::strtoul(std::string(body.substr(start, len)).c_str(), nullptr, base);
  AppendUtf8(static_cast<char32_t>(std::min<unsigned long>(cp, 0x10FFFF)), out);
  *i = start + len - 1;
  return true;
}

// Appends the escape whose character after the backslash is body[*i]; leaves *i on the
// escape's last character.
void AppendEscape(absl::string_view body, size_t* i, std::string* out) {
  const char c = body[*i];
  if (c == '\n') return;  // line continuation
  if (const char simple = SimpleEscape(c)) {
    out->push_back(simple);
    return;
  }
  if (AppendNumericEscape(body, i, out)) return;
  out->push_back('\\');  // unknown escapes stay as written, as in Python
  out->push_back(c);
}

class Lexer {
 public:
  explicit Lexer(absl::string_view source) : src_(NormalizeNewlines(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  absl::StatusOr<std::vector<Token>> Run() {
    while (pos_ < src_.size()) {
      const size_t tag = FindTagStart(pos_);
      if (tag == std::string::npos) {
        EmitText(src_.substr(pos_), pos_);
        break;
      }
      absl::Status status = LexTagAt(tag);
      if (!status.ok()) return status;
    }
    Token end;
    end.kind = TokenKind::kEnd;
    SetPosition(src_.size(), &end);
    tokens_.push_back(std::move(end));
    return std::move(tokens_);
  }

 private:
  // True when `text` occurs at src_[pos].
  bool At(size_t pos, absl::string_view text) const {
    return pos <= src_.size() && absl::StartsWith(absl::string_view(src_).substr(pos), text);
  }

  size_t FindTagStart(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  void SetPosition(size_t offset, Token* token) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line_index = static_cast<size_t>(it - line_starts_.begin()) - 1;
    token->line = static_cast<int>(line_index + 1);
    token->column = static_cast<int>(offset - line_starts_[line_index] + 1);
  }

  absl::Status Error(size_t offset, absl::string_view message) const {
    Token where;
    SetPosition(offset, &where);
    return absl::InvalidArgumentError(absl::StrCat("chat template syntax error at line ",
                                                   where.line, ", column ", where.column, ": ",
                                                   message));
  }

  void EmitText(absl::string_view text, size_t offset) {
    if (text.empty()) return;
    Token token;
    token.kind = TokenKind::kText;
    token.text = std::string(text);
    SetPosition(offset, &token);
    tokens_.push_back(std::move(token));
  }

  void Emit(TokenKind kind, std::string text, size_t offset) {
    Token token;
    token.kind = kind;
    token.text = std::move(text);
    SetPosition(offset, &token);
    tokens_.push_back(std::move(token));
  }

  // Applies `{%-` stripping or lstrip_blocks to the text before a tag.
  absl::string_view StripBefore(absl::string_view text, char sign, bool lstrip_applies) const {
    if (sign == '-') return text.substr(0, RStripLength(text));
    if (sign == '+' || !lstrip_applies) return text;
    const size_t newline = text.rfind('\n');
    const size_t line_start = newline == absl::string_view::npos ? 0 : newline + 1;
    if (line_start == 0 && !line_starting_) return text;
    if (line_start < text.size() && SkipSpace(text, line_start) == text.size()) {
      return text.substr(0, line_start);
    }
    return text;
  }

  // Moves past a tag end: `-` strips the whitespace that follows, trim_blocks drops one
  // newline after block and comment tags.
  void FinishTag(size_t after_end, char sign, bool trim_applies) {
    pos_ = after_end;
    if (sign == '-') {
      pos_ = SkipSpace(src_, pos_);
    } else if (sign != '+' && trim_applies && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
    line_starting_ = pos_ > 0 && src_[pos_ - 1] == '\n';
  }

  absl::Status LexTagAt(size_t tag) {
    const char type = src_[tag + 1];
    char sign = 0;
    if (tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+')) {
      sign = src_[tag + 2];
    }
    const size_t body = tag + 2 + (sign != 0 ? 1 : 0);
    EmitText(StripBefore(absl::string_view(src_).substr(pos_, tag - pos_), sign, type != '{'),
             pos_);
    if (type == '#') return LexComment(tag, body);
    if (type == '%') {
      size_t raw_body = 0;
      if (IsRawBegin(body, &raw_body)) return LexRaw(raw_body);
    }
    return LexTag(type, tag, body);
  }

  absl::Status LexComment(size_t tag, size_t body) {
    const size_t end = src_.find("#}", body);
    if (end == std::string::npos) return Error(tag, "unterminated comment");
    char sign = 0;
    if (end > body && (src_[end - 1] == '-' || src_[end - 1] == '+')) sign = src_[end - 1];
    FinishTag(end + 2, sign, /*trim_applies=*/true);
    return absl::OkStatus();
  }

  // True when the block tag whose body starts at `body` is `{% raw %}`; sets *content to
  // where the raw text starts.
  bool IsRawBegin(size_t body, size_t* content) const {
    size_t p = SkipSpace(src_, body);
    if (src_.compare(p, 3, "raw") != 0 || (p + 3 < src_.size() && IsNameChar(src_[p + 3]))) {
      return false;
    }
    p = SkipSpace(src_, p + 3);
    if (src_.compare(p, 3, "-%}") == 0) {
      *content = SkipSpace(src_, p + 3);
      return true;
    }
    if (src_.compare(p, 2, "%}") == 0) {
      *content = p + 2;
      return true;
    }
    return false;
  }

  absl::Status LexRaw(size_t content) {
    for (size_t at = src_.find("{%", content); at != std::string::npos;
         at = src_.find("{%", at + 2)) {
      size_t p = at + 2;
      const char sign = (src_[p] == '-' || src_[p] == '+') ? src_[p] : 0;
      if (sign != 0) ++p;
      p = SkipSpace(src_, p);
      if (src_.compare(p, 6, "endraw") != 0) continue;
      p = SkipSpace(src_, p + 6);
      char end_sign = 0;
      if (src_[p] == '-' || src_[p] == '+') end_sign = src_[p++];
      if (src_.compare(p, 2, "%}") != 0) continue;
      line_starting_ = content > 0 && src_[content - 1] == '\n';
      EmitText(StripBefore(absl::string_view(src_).substr(content, at - content), sign, true),
               content);
      FinishTag(p + 2, end_sign, /*trim_applies=*/true);
      return absl::OkStatus();
    }
    return Error(content, "missing end of raw directive");
  }

  absl::Status LexTag(char type, size_t tag, size_t body) {
    Emit(type == '{' ? TokenKind::kVariableBegin : TokenKind::kBlockBegin, "", tag);
    pos_ = body;
    std::string brackets;
    for (;;) {
      pos_ = SkipSpace(src_, pos_);
      if (pos_ >= src_.size()) {
        return Error(tag, type == '{' ? "missing '}}' before end of template"
                                      : "missing '%}' before end of template");
      }
      if (brackets.empty() && TryTagEnd(type)) return absl::OkStatus();
      absl::Status status = LexToken(&brackets);
      if (!status.ok()) return status;
    }
  }

  bool TryTagEnd(char type) {
    const absl::string_view close = type == '{' ? "}}" : "%}";
    const size_t start = pos_;
    char sign = 0;
    size_t p = pos_;
    if (src_[p] == '-' || (type == '%' && src_[p] == '+')) sign = src_[p++];
    if (!At(p, close)) return false;
    Emit(type == '{' ? TokenKind::kVariableEnd : TokenKind::kBlockEnd, "", start);
    FinishTag(p + 2, sign, /*trim_applies=*/type == '%');
    return true;
  }

  absl::Status LexToken(std::string* brackets) {
    const char c = src_[pos_];
    if (IsNameStart(c)) {
      const size_t start = pos_;
      while (pos_ < src_.size() && IsNameChar(src_[pos_])) ++pos_;
      Emit(TokenKind::kName, src_.substr(start, pos_ - start), start);
      return absl::OkStatus();
    }
    if (IsDigit(c)) return LexNumber();
    if (c == '\'' || c == '"') return LexString();
    return LexOperator(brackets);
  }

  absl::Status LexNumber() {
    const size_t start = pos_;
    auto digits = [&] {
      while (pos_ < src_.size() && (IsDigit(src_[pos_]) || src_[pos_] == '_')) ++pos_;
    };
    digits();
    bool is_float = false;
    const bool after_dot = start > 0 && src_[start - 1] == '.';
    if (!after_dot && pos_ + 1 < src_.size() && src_[pos_] == '.' && IsDigit(src_[pos_ + 1])) {
      ++pos_;
      digits();
      is_float = true;
    }
    if (!after_dot && pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t p = pos_ + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && IsDigit(src_[p])) {
        pos_ = p;
        digits();
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = start; i < pos_; ++i) {
      if (src_[i] != '_') text.push_back(src_[i]);
    }
    Token token;
    token.text = text;
    SetPosition(start, &token);
    if (is_float) {
      token.kind = TokenKind::kFloat;
      if (!absl::SimpleAtod(text, &token.float_value)) return Error(start, "invalid number");
    } else {
      token.kind = TokenKind::kInteger;
      if (!absl::SimpleAtoi(text, &token.int_value)) {
        return Error(start, "integer literal is too large");
      }
    }
    tokens_.push_back(std::move(token));
    return absl::OkStatus();
  }

  absl::Status LexString() {
    const size_t start = pos_;
    const char quote = src_[pos_++];
    while (pos_ < src_.size() && src_[pos_] != quote) {
      pos_ += src_[pos_] == '\\' ? 2 : 1;
    }
    if (pos_ >= src_.size()) return Error(start, "unterminated string literal");
    ++pos_;
    Emit(TokenKind::kString,
         DecodeStringBody(absl::string_view(src_).substr(start + 1, pos_ - start - 2)), start);
    return absl::OkStatus();
  }

  absl::Status LexOperator(std::string* brackets) {
    static constexpr absl::string_view kTwoChar[] = {"//", "**", "==", "!=", "<=", ">="};
    for (absl::string_view op : kTwoChar) {
      if (At(pos_, op)) {
        Emit(TokenKind::kOperator, std::string(op), pos_);
        pos_ += 2;
        return absl::OkStatus();
      }
    }
    const char c = src_[pos_];
    if (absl::string_view("+-*/%~<>=()[]{},.:|").find(c) == absl::string_view::npos) {
      return Error(pos_, absl::StrCat("unexpected character '", std::string(1, c), "'"));
    }
    if (c == '(' || c == '[' || c == '{') {
      brackets->push_back(c == '(' ? ')' : (c == '[' ? ']' : '}'));
    } else if (c == ')' || c == ']' || c == '}') {
      if (brackets->empty())
        return Error(pos_, absl::StrCat("unexpected '", std::string(1, c), "'"));
      if (brackets->back() != c) {
        return Error(pos_, absl::StrCat("unexpected '", std::string(1, c), "', expected '",
                                        std::string(1, brackets->back()), "'"));
      }
      brackets->pop_back();
    }
    Emit(TokenKind::kOperator, std::string(1, c), pos_);
    ++pos_;
    return absl::OkStatus();
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  size_t pos_ = 0;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source) {
  return Lexer(source).Run();
}

}  // namespace specd::jinja
