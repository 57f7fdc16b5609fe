// Tree-walking interpreter for parsed chat templates. One Interpreter renders one
// template once: it owns the scopes (Jinja's: a frame per loop iteration, macros see only
// the template's top level), the output buffer and the limits that keep a hostile or
// buggy template from running away (output size, work steps, call depth). Errors are
// InvalidArgument with the line and column of the failing expression; raise_exception's
// message is passed through verbatim. Single-threaded: create one per render.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "engine/tokenizer/jinja/ast.h"
#include "engine/tokenizer/jinja/value.h"

namespace specd::jinja {

struct RenderLimits {
  // Largest rendered prompt, and largest string any expression may build.
  size_t max_output_bytes = size_t{8} << 20;
  // Statements executed + loop iterations + calls + expression nodes evaluated.
  int64_t max_steps = 5'000'000;
  // Nested macro calls.
  int max_call_depth = 64;
};

class Interpreter {
 public:
  Interpreter(RenderLimits limits, absl::Time now, absl::TimeZone time_zone);

  // Renders `body` with the entries of `context` (a dict) as top-level variables.
  absl::StatusOr<std::string> Render(const Body& body, const Value& context);

  // Services for filters, tests, methods and callables.
  absl::StatusOr<Value> CallValue(const Value& callee, CallArgs args);
  absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& input, CallArgs args);
  absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& input, CallArgs args);
  // obj.name and obj[key] with Jinja's fallbacks; missing members are Undefined, members
  // of Undefined are an error.
  absl::StatusOr<Value> GetAttr(const Value& obj, absl::string_view name);
  absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);
  // Items of a for loop / list(): list items, dict keys, string characters.
  absl::StatusOr<ValueList> Iterate(const Value& value);
  // An error when a string of `bytes` bytes would exceed the output limit.
  absl::Status CheckSize(size_t bytes) const;
  // Counts `n` units of work against the step limit.
  absl::Status Step(int64_t n = 1);
  // Charges the work of building `v`: a step per item of a list or dict, per 64 bytes of a
  // string.
  absl::Status ChargeCopy(const Value& v);
  // The error of raise_exception(message): passed to the caller verbatim.
  absl::Status Raise(std::string message);
  // Runs a macro (or a call block's caller) with bound arguments; returns its output.
  absl::StatusOr<Value> CallMacro(const Stmt& def, CallArgs args, const Value* caller);
  size_t max_output_bytes() const { return limits_.max_output_bytes; }
  absl::Time now() const { return now_; }
  absl::TimeZone time_zone() const { return time_zone_; }

 private:
  struct Frame {
    ValueDict vars;
    bool isolated = false;  // a macro body: outer frames other than the top level are hidden
  };
  enum class Flow { kNormal, kBreak, kContinue };

  // Statements (interpreter.cc).
  absl::Status Exec(const Body& body);
  absl::Status ExecStmt(const Stmt& stmt);
  absl::Status ExecOutput(const Stmt& stmt);
  absl::Status ExecIf(const Stmt& stmt);
  absl::Status ExecFor(const Stmt& stmt);
  absl::Status RunLoopBody(const Stmt& stmt, const ValueList& items);
  absl::Status ExecSet(const Stmt& stmt);
  absl::Status ExecSetBlock(const Stmt& stmt);
  absl::Status ExecCallBlock(const Stmt& stmt);
  absl::Status ExecFilterBlock(const Stmt& stmt);
  absl::Status ExecWith(const Stmt& stmt);
  absl::StatusOr<std::string> Capture(const Body& body);
  // Binds a macro's parameters (and varargs, kwargs, caller) in the current frame.
  absl::Status BindMacroArgs(const Stmt& def, CallArgs args, const Value* caller);
  absl::Status Write(absl::string_view text);
  absl::Status Bind(const AssignTarget& target, const Value& value);
  Value Lookup(absl::string_view name) const;
  void Assign(const std::string& name, Value value);

  // Expressions (evaluator.cc).
  absl::StatusOr<Value> Eval(const Expr& expr);
  absl::StatusOr<Value> EvalImpl(const Expr& expr);
  absl::StatusOr<Value> EvalAccess(const Expr& expr);
  absl::StatusOr<Value> EvalLogic(const Expr& expr);
  absl::StatusOr<Value> EvalCondExpr(const Expr& expr);
  absl::StatusOr<Value> EvalSequence(const Expr& expr);
  absl::StatusOr<Value> EvalDict(const Expr& expr);
  absl::StatusOr<Value> EvalSlice(const Expr& expr);
  absl::StatusOr<Value> EvalUnary(const Expr& expr);
  absl::StatusOr<Value> EvalConcat(const Expr& expr);
  absl::StatusOr<Value> EvalCompare(const Expr& expr);
  absl::StatusOr<Value> EvalFilter(const Expr& expr, const Value* block_input);
  absl::StatusOr<Value> EvalTest(const Expr& expr);
  absl::StatusOr<Value> EvalCall(const Expr& expr);
  absl::StatusOr<CallArgs> EvalArgs(const Expr& expr, size_t first_arg);

  // Prefixes the first error of the render (the innermost node that failed) with
  // "chat template error at line L, column C: "; an error only ever propagates outwards,
  // so later calls leave the message alone.
  absl::Status Locate(absl::Status status, int line, int column);

  RenderLimits limits_;
  absl::Time now_;
  absl::TimeZone time_zone_;
  std::vector<Frame> frames_;
  std::string* out_ = nullptr;
  Flow flow_ = Flow::kNormal;
  int64_t steps_ = 0;
  int call_depth_ = 0;
  bool error_final_ = false;  // the pending error has its final message
};

}  // namespace specd::jinja
