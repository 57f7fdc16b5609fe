// Lexer of the chat-template (Jinja2 subset) language. It splits a template into text
// and tag tokens and applies Jinja's whitespace control exactly as transformers
// configures it: `{%-`/`-%}` strip, trim_blocks and lstrip_blocks on (`{%+`/`+%}` opt
// out), newlines normalized to "\n" and one trailing newline dropped. Raw blocks become
// text and comments vanish here. Any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specd::jinja {

enum class TokenKind {
  kText,           // literal template text (after whitespace control)
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,           // identifier or keyword
  kString,         // string literal, escapes already decoded
  kInteger,
  kFloat,
  kOperator,  // + - * / // % ** ~ == != < <= > >= = ( ) [ ] { } , . : |
  kEnd,       // end of template
};

struct Token {
  TokenKind kind = TokenKind::kEnd;
  std::string text;  // text, name, decoded string, operator
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
  int column = 1;
};

// Tokenizes `source`; syntax errors (unterminated tags, strings, comments, bad characters)
// are InvalidArgument with the line and column.
absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source);

}  // namespace specd::jinja
