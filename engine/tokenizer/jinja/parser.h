// Parser of the chat-template (Jinja2 subset) language: tokens to a syntax tree, with
// jinja2's operator precedence and statement forms (if/elif/else, for with unpacking,
// `if` filter and else, set incl. namespace attributes and block set, macro, call,
// filter, with, raw, break/continue, and the transparent `generation` and `block` tags).
// Syntax errors are InvalidArgument with line and column. Any thread.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/tokenizer/jinja/ast.h"
#include "engine/tokenizer/jinja/lexer.h"

namespace specd::jinja {

// "'}}'", "end of template", "'foo'": a token as syntax errors name it.
std::string Describe(const Token& token);

// Parses a whole template.
absl::StatusOr<Body> ParseTemplate(absl::string_view source);

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  absl::StatusOr<Body> ParseTemplate();

 private:
  // Statements (parser.cc).
  // Parses statements until a block tag named in `end_tags`; consumes that name and
  // stores it in *end_tag. An empty `end_tags` means "until the end of the template".
  absl::Status ParseBody(std::vector<absl::string_view> end_tags, Body* body, std::string* end_tag);
  absl::StatusOr<StmtPtr> ParseStatement();
  absl::Status ParseIf(Stmt* stmt);
  absl::Status ParseFor(Stmt* stmt);
  absl::Status ParseSet(Stmt* stmt);
  absl::Status ParseMacro(Stmt* stmt);
  absl::Status ParseCallBlock(Stmt* stmt);
  absl::Status ParseFilterBlock(Stmt* stmt);
  absl::Status ParseWith(Stmt* stmt);
  absl::Status ParseScope(Stmt* stmt, absl::string_view tag);
  absl::Status ParseParams(std::vector<Param>* params);
  absl::StatusOr<AssignTarget> ParseAssignTarget(bool with_namespace);
  absl::Status ExpectBlockEnd();

  // Expressions (parser_expr.cc).
  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr = true);
  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr, std::vector<absl::string_view> end_names,
                                     bool explicit_parens = false);
  absl::StatusOr<ExprPtr> ParseCondExpr();
  absl::StatusOr<ExprPtr> ParseOr();
  absl::StatusOr<ExprPtr> ParseAnd();
  absl::StatusOr<ExprPtr> ParseNot();
  absl::StatusOr<ExprPtr> ParseCompare();
  absl::StatusOr<ExprPtr> ParseMath1();
  absl::StatusOr<ExprPtr> ParseConcat();
  absl::StatusOr<ExprPtr> ParseMath2();
  absl::StatusOr<ExprPtr> ParsePow();
  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter);
  absl::StatusOr<ExprPtr> ParsePrimary();
  absl::StatusOr<ExprPtr> ParseList();
  absl::StatusOr<ExprPtr> ParseDict();
  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node);
  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node);
  // `[key]` or `[start:stop:step]` after `at` ('['); children[0] is left for the object.
  absl::StatusOr<ExprPtr> ParseBracket(const Token& at);
  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node);
  // `| name(args)` applied to `node`.
  absl::StatusOr<ExprPtr> ParseFilter(ExprPtr node);
  absl::StatusOr<ExprPtr> ParseOneFilter(ExprPtr input);
  // `name(args) | name(args) ...` of filter and set blocks; the innermost input is null
  // (the block's output).
  absl::StatusOr<ExprPtr> ParseBlockFilter();
  absl::StatusOr<ExprPtr> ParseTest(ExprPtr node);
  absl::Status ParseCallArgs(Expr* call);
  absl::StatusOr<std::string> ParseDottedName();

  // Token helpers.
  const Token& Peek(size_t ahead = 0) const;
  Token Next();
  bool AtOperator(absl::string_view op, size_t ahead = 0) const;
  bool AtName(absl::string_view name, size_t ahead = 0) const;
  bool AtTupleEnd(const std::vector<absl::string_view>& end_names) const;
  absl::Status ExpectOperator(absl::string_view op);
  absl::StatusOr<std::string> ExpectName();
  absl::Status Error(const Token& at, absl::string_view message) const;
  absl::Status EnterNesting();
  ExprPtr MakeExpr(ExprKind kind, const Token& at) const;
  StmtPtr MakeStmt(StmtKind kind, const Token& at) const;

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int nesting_ = 0;             // current recursion depth, bounded to protect the stack
  int loop_depth_ = 0;          // for break/continue
  bool saw_loop_name_ = false;  // a `loop` name was parsed (see Stmt::uses_loop)
};

}  // namespace specd::jinja
