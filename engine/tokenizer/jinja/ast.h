// Syntax tree of a parsed chat template: expressions and statements as the parser builds
// them and the interpreter walks them. Immutable after parsing, so one tree may be
// rendered by many threads at once.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tokenizer/jinja/value.h"

namespace specd::jinja {

enum class ExprKind {
  kLiteral,   // literal
  kName,      // name
  kList,      // children: items
  kTuple,     // children: items
  kDict,      // children: key0, value0, key1, value1, ...
  kGetAttr,   // children: [object]; name: attribute
  kGetItem,   // children: [object, key]
  kSlice,     // children: [object, start, stop, step] (null when omitted)
  kUnary,     // op: kNeg / kPos; children: [operand]
  kBinary,    // op: BinaryOp; children: [left, right]
  kConcat,    // children: operands of ~
  kAnd,       // children: [left, right]
  kOr,        // children: [left, right]
  kNot,       // children: [operand]
  kCompare,   // children: [first, operand...]; compare_ops: one per operand
  kCondExpr,  // children: [then, condition, else (null: undefined)]
  kFilter,    // name; children: [input (null inside a filter block), args...]; kwargs
  kTest,      // name; children: [input, args...]; kwargs; negated
  kCall,      // children: [callee, args...]; kwargs
};

enum class UnaryOp { kNeg, kPos };
enum class BinaryOp { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow };
enum class CompareOp { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind = ExprKind::kLiteral;
  int line = 0;
  int column = 0;
  Value literal;
  std::string name;
  int op = 0;  // UnaryOp or BinaryOp
  std::vector<CompareOp> compare_ops;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;
};

enum class StmtKind {
  kText,         // text
  kOutput,       // {{ expr }}
  kIf,           // branches
  kFor,          // target, expr (iterable), filter, body, else_body
  kSet,          // target, expr
  kSetBlock,     // target, body, filter (a kFilter chain, optional)
  kMacro,        // name, params, body
  kCallBlock,    // expr (a kCall), params (the caller's), body
  kFilterBlock,  // filter (a kFilter chain), body
  kWith,         // assignments, body
  kScope,        // body run in place: {% generation %}, {% block %}
  kBreak,
  kContinue,
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// Left-hand side of set / for: names (several for tuple unpacking) or `ns.attr`.
struct AssignTarget {
  std::vector<std::string> names;
  bool is_tuple = false;
  std::string attribute;  // non-empty for `{% set ns.attr = ... %}`
};

struct Branch {
  ExprPtr condition;  // null for else
  Body body;
};

struct Param {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct Stmt {
  StmtKind kind = StmtKind::kText;
  int line = 0;
  int column = 0;
  std::string text;  // kText; macro name for kMacro
  ExprPtr expr;
  ExprPtr filter;
  AssignTarget target;
  std::vector<Branch> branches;
  std::vector<Param> params;
  std::vector<std::pair<std::string, ExprPtr>> assignments;
  Body body;
  Body else_body;
  bool uses_loop = true;  // kFor: the body may read `loop` (else its object is not built)
};

}  // namespace specd::jinja
