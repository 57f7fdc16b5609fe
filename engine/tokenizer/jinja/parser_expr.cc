// Expression parsing of the chat-template parser (see parser.h). The precedence ladder
// is jinja2's: conditional < or < and < not < comparisons/in < + - < ~ < * / // % < **
// < unary - + < primary with postfix (. [] ()) and then filters (|) and tests (is).
#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/base/status.h"
#include "engine/tokenizer/jinja/parser.h"

namespace specd::jinja {
namespace {

ExprPtr Binary(ExprKind kind, int op, ExprPtr left, ExprPtr right) {
  auto expr = std::make_unique<Expr>();
  expr->kind = kind;
  expr->op = op;
  expr->line = left->line;
  expr->column = left->column;
  expr->children.push_back(std::move(left));
  expr->children.push_back(std::move(right));
  return expr;
}

bool StartsPrimary(const Token& token) {
  switch (token.kind) {
    case TokenKind::kName:
      return token.text != "else" && token.text != "or" && token.text != "and";
    case TokenKind::kString:
    case TokenKind::kInteger:
    case TokenKind::kFloat:
      return true;
    case TokenKind::kOperator:
      return token.text == "(" || token.text == "[" || token.text == "{";
    default:
      return false;
  }
}

}  // namespace

bool Parser::AtTupleEnd(const std::vector<absl::string_view>& end_names) const {
  const Token& token = Peek();
  if (token.kind == TokenKind::kVariableEnd || token.kind == TokenKind::kBlockEnd ||
      token.kind == TokenKind::kEnd) {
    return true;
  }
  if (AtOperator(")")) return true;
  for (absl::string_view name : end_names) {
    if (AtName(name)) return true;
  }
  return false;
}

absl::StatusOr<ExprPtr> Parser::ParseExpression(bool with_condexpr) {
  return with_condexpr ? ParseCondExpr() : ParseOr();
}

absl::StatusOr<ExprPtr> Parser::ParseTuple(bool with_condexpr,
                                           std::vector<absl::string_view> end_names,
                                           bool explicit_parens) {
  const Token start = Peek();
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  for (;;) {
    if (!items.empty()) SPECD_RETURN_IF_ERROR(ExpectOperator(","));
    if (AtTupleEnd(end_names)) break;
    SPECD_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(with_condexpr));
    items.push_back(std::move(item));
    if (!AtOperator(",")) break;
    is_tuple = true;
  }
  if (!is_tuple) {
    if (!items.empty()) return std::move(items[0]);
    if (!explicit_parens) return Error(Peek(), "expected an expression");
  }
  ExprPtr tuple = MakeExpr(ExprKind::kTuple, start);
  tuple->children = std::move(items);
  return tuple;
}

absl::StatusOr<ExprPtr> Parser::ParseCondExpr() {
  SPECD_ASSIGN_OR_RETURN(ExprPtr expr, ParseOr());
  while (AtName("if")) {
    Next();
    auto cond = std::make_unique<Expr>();
    cond->kind = ExprKind::kCondExpr;
    cond->line = expr->line;
    cond->column = expr->column;
    SPECD_ASSIGN_OR_RETURN(ExprPtr test, ParseOr());
    ExprPtr otherwise;
    if (AtName("else")) {
      Next();
      SPECD_ASSIGN_OR_RETURN(otherwise, ParseCondExpr());
    }
    cond->children.push_back(std::move(expr));
    cond->children.push_back(std::move(test));
    cond->children.push_back(std::move(otherwise));
    expr = std::move(cond);
  }
  return expr;
}

absl::StatusOr<ExprPtr> Parser::ParseOr() {
  SPECD_ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
  while (AtName("or")) {
    Next();
    SPECD_ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
    left = Binary(ExprKind::kOr, 0, std::move(left), std::move(right));
  }
  return left;
}

absl::StatusOr<ExprPtr> Parser::ParseAnd() {
  SPECD_ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
  while (AtName("and")) {
    Next();
    SPECD_ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
    left = Binary(ExprKind::kAnd, 0, std::move(left), std::move(right));
  }
  return left;
}

absl::StatusOr<ExprPtr> Parser::ParseNot() {
  if (!AtName("not")) return ParseCompare();
  const Token at = Next();
  ++nesting_;
  absl::Cleanup leave = [this] { --nesting_; };
  SPECD_RETURN_IF_ERROR(EnterNesting());
  SPECD_ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
  ExprPtr expr = MakeExpr(ExprKind::kNot, at);
  expr->children.push_back(std::move(operand));
  return expr;
}

absl::StatusOr<ExprPtr> Parser::ParseCompare() {
  SPECD_ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
  ExprPtr compare;
  for (;;) {
    CompareOp op;
    const Token& token = Peek();
    if (token.kind == TokenKind::kOperator && token.text == "==") {
      op = CompareOp::kEq;
    } else if (token.kind == TokenKind::kOperator && token.text == "!=") {
      op = CompareOp::kNe;
    } else if (token.kind == TokenKind::kOperator && token.text == "<") {
      op = CompareOp::kLt;
    } else if (token.kind == TokenKind::kOperator && token.text == "<=") {
      op = CompareOp::kLe;
    } else if (token.kind == TokenKind::kOperator && token.text == ">") {
      op = CompareOp::kGt;
    } else if (token.kind == TokenKind::kOperator && token.text == ">=") {
      op = CompareOp::kGe;
    } else if (AtName("in")) {
      op = CompareOp::kIn;
    } else if (AtName("not") && AtName("in", 1)) {
      Next();
      op = CompareOp::kNotIn;
    } else {
      break;
    }
    Next();
    if (compare == nullptr) {
      compare = MakeExpr(ExprKind::kCompare, token);
      compare->line = first->line;
      compare->column = first->column;
      compare->children.push_back(std::move(first));
    }
    SPECD_ASSIGN_OR_RETURN(ExprPtr operand, ParseMath1());
    compare->compare_ops.push_back(op);
    compare->children.push_back(std::move(operand));
  }
  return compare != nullptr ? std::move(compare) : std::move(first);
}

absl::StatusOr<ExprPtr> Parser::ParseMath1() {
  SPECD_ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
  while (AtOperator("+") || AtOperator("-")) {
    const BinaryOp op = Next().text == "+" ? BinaryOp::kAdd : BinaryOp::kSub;
    SPECD_ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
    left = Binary(ExprKind::kBinary, static_cast<int>(op), std::move(left), std::move(right));
  }
  return left;
}

absl::StatusOr<ExprPtr> Parser::ParseConcat() {
  SPECD_ASSIGN_OR_RETURN(ExprPtr first, ParseMath2());
  if (!AtOperator("~")) return first;
  ExprPtr concat = MakeExpr(ExprKind::kConcat, Peek());
  concat->line = first->line;
  concat->column = first->column;
  concat->children.push_back(std::move(first));
  while (AtOperator("~")) {
    Next();
    SPECD_ASSIGN_OR_RETURN(ExprPtr next, ParseMath2());
    concat->children.push_back(std::move(next));
  }
  return concat;
}

absl::StatusOr<ExprPtr> Parser::ParseMath2() {
  SPECD_ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
  for (;;) {
    BinaryOp op;
    if (AtOperator("*")) {
      op = BinaryOp::kMul;
    } else if (AtOperator("/")) {
      op = BinaryOp::kDiv;
    } else if (AtOperator("//")) {
      op = BinaryOp::kFloorDiv;
    } else if (AtOperator("%")) {
      op = BinaryOp::kMod;
    } else {
      return left;
    }
    Next();
    SPECD_ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
    left = Binary(ExprKind::kBinary, static_cast<int>(op), std::move(left), std::move(right));
  }
}

absl::StatusOr<ExprPtr> Parser::ParsePow() {
  SPECD_ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
  while (AtOperator("**")) {
    Next();
    SPECD_ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
    left = Binary(ExprKind::kBinary, static_cast<int>(BinaryOp::kPow), std::move(left),
                  std::move(right));
  }
  return left;
}

absl::StatusOr<ExprPtr> Parser::ParseUnary(bool with_filter) {
  ++nesting_;
  absl::Cleanup leave = [this] { --nesting_; };
  SPECD_RETURN_IF_ERROR(EnterNesting());
  ExprPtr node;
  if (AtOperator("-") || AtOperator("+")) {
    const Token at = Next();
    SPECD_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
    node = MakeExpr(ExprKind::kUnary, at);
    node->op = static_cast<int>(at.text == "-" ? UnaryOp::kNeg : UnaryOp::kPos);
    node->children.push_back(std::move(operand));
  } else {
    SPECD_ASSIGN_OR_RETURN(node, ParsePrimary());
  }
  SPECD_ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
  if (with_filter) return ParseFilterExpr(std::move(node));
  return node;
}

absl::StatusOr<ExprPtr> Parser::ParsePrimary() {
  const Token token = Peek();
  switch (token.kind) {
    case TokenKind::kName: {
      Next();
      ExprPtr expr = MakeExpr(ExprKind::kLiteral, token);
      if (token.text == "true" || token.text == "True") {
        expr->literal = Value::Bool(true);
      } else if (token.text == "false" || token.text == "False") {
        expr->literal = Value::Bool(false);
      } else if (token.text == "none" || token.text == "None") {
        expr->literal = Value::None();
      } else {
        expr->kind = ExprKind::kName;
        expr->name = token.text;
        saw_loop_name_ = saw_loop_name_ || token.text == "loop";
      }
      return expr;
    }
    case TokenKind::kString: {
      std::string text;
      while (Peek().kind == TokenKind::kString) text += Next().text;
      ExprPtr expr = MakeExpr(ExprKind::kLiteral, token);
      expr->literal = Value::String(std::move(text));
      return expr;
    }
    case TokenKind::kInteger:
    case TokenKind::kFloat: {
      Next();
      ExprPtr expr = MakeExpr(ExprKind::kLiteral, token);
      expr->literal = token.kind == TokenKind::kInteger ? Value::Int(token.int_value)
                                                        : Value::Float(token.float_value);
      return expr;
    }
    default:
      break;
  }
  if (AtOperator("(")) {
    Next();
    SPECD_ASSIGN_OR_RETURN(ExprPtr expr, ParseTuple(true, {}, /*explicit_parens=*/true));
    SPECD_RETURN_IF_ERROR(ExpectOperator(")"));
    return expr;
  }
  if (AtOperator("[")) return ParseList();
  if (AtOperator("{")) return ParseDict();
  return Error(token, absl::StrCat("unexpected ", Describe(token), " in expression"));
}

absl::StatusOr<ExprPtr> Parser::ParseList() {
  ExprPtr list = MakeExpr(ExprKind::kList, Next());
  while (!AtOperator("]")) {
    if (!list->children.empty()) SPECD_RETURN_IF_ERROR(ExpectOperator(","));
    if (AtOperator("]")) break;
    SPECD_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
    list->children.push_back(std::move(item));
  }
  Next();
  return list;
}

absl::StatusOr<ExprPtr> Parser::ParseDict() {
  ExprPtr dict = MakeExpr(ExprKind::kDict, Next());
  while (!AtOperator("}")) {
    if (!dict->children.empty()) SPECD_RETURN_IF_ERROR(ExpectOperator(","));
    if (AtOperator("}")) break;
    SPECD_ASSIGN_OR_RETURN(ExprPtr key, ParseExpression());
    SPECD_RETURN_IF_ERROR(ExpectOperator(":"));
    SPECD_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
    dict->children.push_back(std::move(key));
    dict->children.push_back(std::move(value));
  }
  Next();
  return dict;
}

absl::StatusOr<ExprPtr> Parser::ParsePostfix(ExprPtr node) {
  for (;;) {
    if (AtOperator(".") || AtOperator("[")) {
      SPECD_ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node)));
    } else if (AtOperator("(")) {
      ExprPtr call = MakeExpr(ExprKind::kCall, Peek());
      call->line = node->line;
      call->column = node->column;
      call->children.push_back(std::move(node));
      SPECD_RETURN_IF_ERROR(ParseCallArgs(call.get()));
      node = std::move(call);
    } else {
      return node;
    }
  }
}

absl::StatusOr<ExprPtr> Parser::ParseSubscript(ExprPtr node) {
  const Token at = Next();
  ExprPtr expr;
  if (at.text == ".") {
    const Token attr = Next();
    if (attr.kind == TokenKind::kName) {
      expr = MakeExpr(ExprKind::kGetAttr, attr);
      expr->name = attr.text;
    } else if (attr.kind == TokenKind::kInteger) {
      expr = MakeExpr(ExprKind::kGetItem, attr);
      expr->children.push_back(nullptr);  // the object, set below
      ExprPtr key = MakeExpr(ExprKind::kLiteral, attr);
      key->literal = Value::Int(attr.int_value);
      expr->children.push_back(std::move(key));
    } else {
      return Error(attr, "expected an attribute name after '.'");
    }
  } else {
    SPECD_ASSIGN_OR_RETURN(expr, ParseBracket(at));
  }
  // Errors point at the start of the whole access.
  expr->line = node->line;
  expr->column = node->column;
  if (expr->children.empty()) {
    expr->children.push_back(std::move(node));
  } else {
    expr->children[0] = std::move(node);
  }
  return expr;
}

absl::StatusOr<ExprPtr> Parser::ParseBracket(const Token& at) {
  std::vector<ExprPtr> parts;  // start, stop, step
  bool is_slice = false;
  for (int part = 0; part < 3; ++part) {
    if (AtOperator(":") || AtOperator("]")) {
      parts.push_back(nullptr);
    } else {
      SPECD_ASSIGN_OR_RETURN(ExprPtr expr, ParseExpression());
      parts.push_back(std::move(expr));
    }
    if (!AtOperator(":")) break;
    Next();
    is_slice = true;
  }
  SPECD_RETURN_IF_ERROR(ExpectOperator("]"));
  ExprPtr expr = MakeExpr(is_slice ? ExprKind::kSlice : ExprKind::kGetItem, at);
  expr->children.push_back(nullptr);  // the object, set by the caller
  if (!is_slice) {
    if (parts[0] == nullptr) return Error(at, "expected an expression inside '[]'");
    expr->children.push_back(std::move(parts[0]));
    return expr;
  }
  parts.resize(3);
  for (ExprPtr& part : parts) expr->children.push_back(std::move(part));
  return expr;
}

absl::Status Parser::ParseCallArgs(Expr* call) {
  SPECD_RETURN_IF_ERROR(ExpectOperator("("));
  bool first = true;
  while (!AtOperator(")")) {
    if (!first) SPECD_RETURN_IF_ERROR(ExpectOperator(","));
    first = false;
    if (AtOperator(")")) break;
    if (AtOperator("*") || AtOperator("**")) {
      return Error(Peek(), "'*' and '**' arguments are not supported");
    }
    if (Peek().kind == TokenKind::kName && AtOperator("=", 1)) {
      std::string name = Next().text;
      Next();
      SPECD_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
      call->kwargs.emplace_back(std::move(name), std::move(value));
      continue;
    }
    if (!call->kwargs.empty()) {
      return Error(Peek(), "positional argument follows keyword argument");
    }
    SPECD_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
    call->children.push_back(std::move(value));
  }
  Next();
  return absl::OkStatus();
}

absl::StatusOr<std::string> Parser::ParseDottedName() {
  SPECD_ASSIGN_OR_RETURN(std::string name, ExpectName());
  while (AtOperator(".")) {
    Next();
    SPECD_ASSIGN_OR_RETURN(std::string part, ExpectName());
    absl::StrAppend(&name, ".", part);
  }
  return name;
}

absl::StatusOr<ExprPtr> Parser::ParseFilterExpr(ExprPtr node) {
  for (;;) {
    if (AtOperator("|")) {
      SPECD_ASSIGN_OR_RETURN(node, ParseFilter(std::move(node)));
    } else if (AtName("is")) {
      SPECD_ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
    } else if (AtOperator("(")) {
      ExprPtr call = MakeExpr(ExprKind::kCall, Peek());
      call->children.push_back(std::move(node));
      SPECD_RETURN_IF_ERROR(ParseCallArgs(call.get()));
      node = std::move(call);
    } else {
      return node;
    }
  }
}

absl::StatusOr<ExprPtr> Parser::ParseFilter(ExprPtr node) {
  SPECD_RETURN_IF_ERROR(ExpectOperator("|"));
  return ParseOneFilter(std::move(node));
}

absl::StatusOr<ExprPtr> Parser::ParseOneFilter(ExprPtr input) {
  const Token at = Peek();
  ExprPtr filter = MakeExpr(ExprKind::kFilter, at);
  SPECD_ASSIGN_OR_RETURN(filter->name, ParseDottedName());
  filter->children.push_back(std::move(input));
  if (AtOperator("(")) SPECD_RETURN_IF_ERROR(ParseCallArgs(filter.get()));
  return filter;
}

absl::StatusOr<ExprPtr> Parser::ParseBlockFilter() {
  SPECD_ASSIGN_OR_RETURN(ExprPtr chain, ParseOneFilter(nullptr));
  while (AtOperator("|")) {
    Next();
    SPECD_ASSIGN_OR_RETURN(chain, ParseOneFilter(std::move(chain)));
  }
  return chain;
}

absl::StatusOr<ExprPtr> Parser::ParseTest(ExprPtr node) {
  Next();  // is
  ExprPtr test = MakeExpr(ExprKind::kTest, Peek());
  test->line = node->line;
  test->column = node->column;
  if (AtName("not")) {
    Next();
    test->negated = true;
  }
  SPECD_ASSIGN_OR_RETURN(test->name, ParseDottedName());
  test->children.push_back(std::move(node));
  if (AtOperator("(")) {
    SPECD_RETURN_IF_ERROR(ParseCallArgs(test.get()));
  } else if (StartsPrimary(Peek())) {
    if (AtName("is")) return Error(Peek(), "you cannot chain multiple tests with 'is'");
    SPECD_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
    SPECD_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
    test->children.push_back(std::move(arg));
  }
  return test;
}

}  // namespace specd::jinja
