// Statement parsing and token helpers of the chat-template parser (see parser.h).
#include "engine/tokenizer/jinja/parser.h"

#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "engine/base/status.h"

namespace specd::jinja {
namespace {

// Deeper nesting of blocks or expressions is rejected before it can exhaust the stack.
constexpr int kMaxNesting = 100;

}  // namespace

std::string Describe(const Token& token) {
  switch (token.kind) {
    case TokenKind::kEnd:
      return "end of template";
    case TokenKind::kText:
      return "template text";
    case TokenKind::kVariableBegin:
      return "'{{'";
    case TokenKind::kVariableEnd:
      return "'}}'";
    case TokenKind::kBlockBegin:
      return "'{%'";
    case TokenKind::kBlockEnd:
      return "'%}'";
    case TokenKind::kString:
      return "string literal";
    default:
      return absl::StrCat("'", token.text, "'");
  }
}

absl::StatusOr<Body> ParseTemplate(absl::string_view source) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  return Parser(std::move(tokens)).ParseTemplate();
}

absl::StatusOr<Body> Parser::ParseTemplate() {
  Body body;
  std::string end_tag;
  SPECD_RETURN_IF_ERROR(ParseBody({}, &body, &end_tag));
  return body;
}

const Token& Parser::Peek(size_t ahead) const {
  return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
}

Token Parser::Next() {
  Token token = Peek();
  if (pos_ < tokens_.size() - 1) ++pos_;
  return token;
}

bool Parser::AtOperator(absl::string_view op, size_t ahead) const {
  const Token& token = Peek(ahead);
  return token.kind == TokenKind::kOperator && token.text == op;
}

bool Parser::AtName(absl::string_view name, size_t ahead) const {
  const Token& token = Peek(ahead);
  return token.kind == TokenKind::kName && token.text == name;
}

absl::Status Parser::Error(const Token& at, absl::string_view message) const {
  return absl::InvalidArgumentError(absl::StrCat("chat template syntax error at line ", at.line,
                                                 ", column ", at.column, ": ", message));
}

absl::Status Parser::ExpectOperator(absl::string_view op) {
  if (!AtOperator(op)) {
    return Error(Peek(), absl::StrCat("expected '", op, "', got ", Describe(Peek())));
  }
  Next();
  return absl::OkStatus();
}

absl::StatusOr<std::string> Parser::ExpectName() {
  if (Peek().kind != TokenKind::kName) {
    return Error(Peek(), absl::StrCat("expected a name, got ", Describe(Peek())));
  }
  return Next().text;
}

absl::Status Parser::ExpectBlockEnd() {
  if (Peek().kind != TokenKind::kBlockEnd) {
    return Error(Peek(), absl::StrCat("expected end of statement '%}', got ", Describe(Peek())));
  }
  Next();
  return absl::OkStatus();
}

absl::Status Parser::EnterNesting() {
  if (nesting_ > kMaxNesting) return Error(Peek(), "template is nested too deeply");
  return absl::OkStatus();
}

ExprPtr Parser::MakeExpr(ExprKind kind, const Token& at) const {
  auto expr = std::make_unique<Expr>();
  expr->kind = kind;
  expr->line = at.line;
  expr->column = at.column;
  return expr;
}

StmtPtr Parser::MakeStmt(StmtKind kind, const Token& at) const {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = kind;
  stmt->line = at.line;
  stmt->column = at.column;
  return stmt;
}

absl::Status Parser::ParseBody(std::vector<absl::string_view> end_tags, Body* body,
                               std::string* end_tag) {
  ++nesting_;
  absl::Cleanup leave = [this] { --nesting_; };
  SPECD_RETURN_IF_ERROR(EnterNesting());
  for (;;) {
    const Token& token = Peek();
    switch (token.kind) {
      case TokenKind::kEnd:
        if (end_tags.empty()) return absl::OkStatus();
        return Error(token, absl::StrCat("unexpected end of template, expected '",
                                         absl::StrJoin(end_tags, "' or '"), "'"));
      case TokenKind::kText: {
        StmtPtr stmt = MakeStmt(StmtKind::kText, token);
        stmt->text = Next().text;
        body->push_back(std::move(stmt));
        break;
      }
      case TokenKind::kVariableBegin: {
        StmtPtr stmt = MakeStmt(StmtKind::kOutput, Next());
        SPECD_ASSIGN_OR_RETURN(stmt->expr, ParseTuple(true, {}));
        if (Peek().kind != TokenKind::kVariableEnd) {
          return Error(Peek(), absl::StrCat("expected '}}', got ", Describe(Peek())));
        }
        Next();
        body->push_back(std::move(stmt));
        break;
      }
      case TokenKind::kBlockBegin: {
        const Token& tag = Peek(1);
        if (tag.kind == TokenKind::kName &&
            std::find(end_tags.begin(), end_tags.end(), tag.text) != end_tags.end()) {
          Next();
          *end_tag = Next().text;
          return absl::OkStatus();
        }
        SPECD_ASSIGN_OR_RETURN(StmtPtr stmt, ParseStatement());
        body->push_back(std::move(stmt));
        break;
      }
      default:
        return Error(token, absl::StrCat("unexpected ", Describe(token)));
    }
  }
}

absl::StatusOr<StmtPtr> Parser::ParseStatement() {
  Next();  // {%
  const Token tag = Peek();
  if (tag.kind != TokenKind::kName) {
    return Error(tag, absl::StrCat("expected a statement name, got ", Describe(tag)));
  }
  Next();
  const std::string& name = tag.text;
  StmtPtr stmt = MakeStmt(StmtKind::kText, tag);
  absl::Status status;
  if (name == "if") {
    status = ParseIf(stmt.get());
  } else if (name == "for") {
    status = ParseFor(stmt.get());
  } else if (name == "set") {
    status = ParseSet(stmt.get());
  } else if (name == "macro") {
    status = ParseMacro(stmt.get());
  } else if (name == "call") {
    status = ParseCallBlock(stmt.get());
  } else if (name == "filter") {
    status = ParseFilterBlock(stmt.get());
  } else if (name == "with") {
    status = ParseWith(stmt.get());
  } else if (name == "generation" || name == "block") {
    status = ParseScope(stmt.get(), name);
  } else if (name == "break" || name == "continue") {
    if (loop_depth_ == 0) return Error(tag, absl::StrCat("'", name, "' outside of a loop"));
    stmt->kind = name == "break" ? StmtKind::kBreak : StmtKind::kContinue;
    status = ExpectBlockEnd();
  } else if (name == "include" || name == "import" || name == "from" || name == "extends") {
    return Error(tag, absl::StrCat("'", name, "' is not supported in chat templates"));
  } else {
    return Error(tag, absl::StrCat("unknown or unexpected tag '", name, "'"));
  }
  if (!status.ok()) return status;
  return stmt;
}

absl::Status Parser::ParseIf(Stmt* stmt) {
  stmt->kind = StmtKind::kIf;
  for (;;) {
    Branch branch;
    SPECD_ASSIGN_OR_RETURN(branch.condition, ParseTuple(false, {}));
    SPECD_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end_tag;
    SPECD_RETURN_IF_ERROR(ParseBody({"elif", "else", "endif"}, &branch.body, &end_tag));
    stmt->branches.push_back(std::move(branch));
    if (end_tag == "elif") continue;
    if (end_tag == "else") {
      SPECD_RETURN_IF_ERROR(ExpectBlockEnd());
      Branch else_branch;
      SPECD_RETURN_IF_ERROR(ParseBody({"endif"}, &else_branch.body, &end_tag));
      stmt->branches.push_back(std::move(else_branch));
    }
    return ExpectBlockEnd();
  }
}

absl::Status Parser::ParseFor(Stmt* stmt) {
  stmt->kind = StmtKind::kFor;
  SPECD_ASSIGN_OR_RETURN(stmt->target, ParseAssignTarget(/*with_namespace=*/false));
  if (!AtName("in")) return Error(Peek(), absl::StrCat("expected 'in', got ", Describe(Peek())));
  Next();
  SPECD_ASSIGN_OR_RETURN(stmt->expr, ParseTuple(false, {"recursive"}));
  if (AtName("if")) {
    Next();
    SPECD_ASSIGN_OR_RETURN(stmt->filter, ParseExpression());
  }
  if (AtName("recursive")) return Error(Peek(), "recursive loops are not supported");
  SPECD_RETURN_IF_ERROR(ExpectBlockEnd());
  std::string end_tag;
  ++loop_depth_;
  const bool saw_loop_outside = saw_loop_name_;
  saw_loop_name_ = false;
  absl::Status status = ParseBody({"else", "endfor"}, &stmt->body, &end_tag);
  stmt->uses_loop = saw_loop_name_;
  saw_loop_name_ = saw_loop_outside || saw_loop_name_;
  --loop_depth_;
  SPECD_RETURN_IF_ERROR(status);
  if (end_tag == "else") {
    SPECD_RETURN_IF_ERROR(ExpectBlockEnd());
    SPECD_RETURN_IF_ERROR(ParseBody({"endfor"}, &stmt->else_body, &end_tag));
  }
  return ExpectBlockEnd();
}

absl::Status Parser::ParseSet(Stmt* stmt) {
  SPECD_ASSIGN_OR_RETURN(stmt->target, ParseAssignTarget(/*with_namespace=*/true));
  if (AtOperator("=")) {
    Next();
    stmt->kind = StmtKind::kSet;
    SPECD_ASSIGN_OR_RETURN(stmt->expr, ParseTuple(true, {}));
    return ExpectBlockEnd();
  }
  stmt->kind = StmtKind::kSetBlock;
  if (stmt->target.is_tuple || !stmt->target.attribute.empty()) {
    return Error(Peek(), "a block set assigns a single name");
  }
  if (AtOperator("|")) {
    Next();
    SPECD_ASSIGN_OR_RETURN(stmt->filter, ParseBlockFilter());
  }
  SPECD_RETURN_IF_ERROR(ExpectBlockEnd());
  std::string end_tag;
  SPECD_RETURN_IF_ERROR(ParseBody({"endset"}, &stmt->body, &end_tag));
  return ExpectBlockEnd();
}

absl::StatusOr<AssignTarget> Parser::ParseAssignTarget(bool with_namespace) {
  AssignTarget target;
  const bool parens = AtOperator("(");
  if (parens) Next();
  SPECD_ASSIGN_OR_RETURN(std::string first, ExpectName());
  target.names.push_back(first);
  if (with_namespace && !parens && AtOperator(".")) {
    Next();
    SPECD_ASSIGN_OR_RETURN(target.attribute, ExpectName());
    return target;
  }
  while (AtOperator(",")) {
    Next();
    target.is_tuple = true;
    if (Peek().kind != TokenKind::kName || AtName("in")) break;  // trailing comma
    SPECD_ASSIGN_OR_RETURN(std::string name, ExpectName());
    target.names.push_back(name);
  }
  if (parens) {
    SPECD_RETURN_IF_ERROR(ExpectOperator(")"));
    target.is_tuple = true;
  }
  for (const std::string& name : target.names) {
    if (name == "true" || name == "false" || name == "none" || name == "True" || name == "False" ||
        name == "None") {
      return Error(Peek(), absl::StrCat("cannot assign to '", name, "'"));
    }
  }
  return target;
}

absl::Status Parser::ParseParams(std::vector<Param>* params) {
  SPECD_RETURN_IF_ERROR(ExpectOperator("("));
  while (!AtOperator(")")) {
    if (!params->empty()) SPECD_RETURN_IF_ERROR(ExpectOperator(","));
    if (AtOperator(")")) break;
    Param param;
    SPECD_ASSIGN_OR_RETURN(param.name, ExpectName());
    if (AtOperator("=")) {
      Next();
      SPECD_ASSIGN_OR_RETURN(param.default_value, ParseExpression());
    }
    params->push_back(std::move(param));
  }
  return ExpectOperator(")");
}

absl::Status Parser::ParseMacro(Stmt* stmt) {
  stmt->kind = StmtKind::kMacro;
  SPECD_ASSIGN_OR_RETURN(stmt->text, ExpectName());
  SPECD_RETURN_IF_ERROR(ParseParams(&stmt->params));
  SPECD_RETURN_IF_ERROR(ExpectBlockEnd());
  const int saved_loop_depth = loop_depth_;
  loop_depth_ = 0;
  std::string end_tag;
  absl::Status status = ParseBody({"endmacro"}, &stmt->body, &end_tag);
  loop_depth_ = saved_loop_depth;
  SPECD_RETURN_IF_ERROR(status);
  if (Peek().kind == TokenKind::kName) Next();  // {% endmacro name %}
  return ExpectBlockEnd();
}

absl::Status Parser::ParseCallBlock(Stmt* stmt) {
  stmt->kind = StmtKind::kCallBlock;
  if (AtOperator("(")) SPECD_RETURN_IF_ERROR(ParseParams(&stmt->params));
  const Token at = Peek();
  SPECD_ASSIGN_OR_RETURN(stmt->expr, ParseExpression());
  if (stmt->expr->kind != ExprKind::kCall) return Error(at, "expected a call after 'call'");
  SPECD_RETURN_IF_ERROR(ExpectBlockEnd());
  std::string end_tag;
  SPECD_RETURN_IF_ERROR(ParseBody({"endcall"}, &stmt->body, &end_tag));
  return ExpectBlockEnd();
}

absl::Status Parser::ParseFilterBlock(Stmt* stmt) {
  stmt->kind = StmtKind::kFilterBlock;
  SPECD_ASSIGN_OR_RETURN(stmt->filter, ParseBlockFilter());
  SPECD_RETURN_IF_ERROR(ExpectBlockEnd());
  std::string end_tag;
  SPECD_RETURN_IF_ERROR(ParseBody({"endfilter"}, &stmt->body, &end_tag));
  return ExpectBlockEnd();
}

absl::Status Parser::ParseWith(Stmt* stmt) {
  stmt->kind = StmtKind::kWith;
  while (Peek().kind != TokenKind::kBlockEnd) {
    if (!stmt->assignments.empty()) SPECD_RETURN_IF_ERROR(ExpectOperator(","));
    SPECD_ASSIGN_OR_RETURN(std::string name, ExpectName());
    SPECD_RETURN_IF_ERROR(ExpectOperator("="));
    SPECD_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
    stmt->assignments.emplace_back(std::move(name), std::move(value));
  }
  SPECD_RETURN_IF_ERROR(ExpectBlockEnd());
  std::string end_tag;
  SPECD_RETURN_IF_ERROR(ParseBody({"endwith"}, &stmt->body, &end_tag));
  return ExpectBlockEnd();
}

absl::Status Parser::ParseScope(Stmt* stmt, absl::string_view tag) {
  stmt->kind = StmtKind::kScope;
  if (tag == "block") SPECD_RETURN_IF_ERROR(ExpectName().status());
  SPECD_RETURN_IF_ERROR(ExpectBlockEnd());
  std::string end_tag;
  SPECD_RETURN_IF_ERROR(ParseBody({absl::StrCat("end", tag)}, &stmt->body, &end_tag));
  if (tag == "block" && Peek().kind == TokenKind::kName) Next();
  return ExpectBlockEnd();
}

}  // namespace specd::jinja
