// Statement execution, scopes and limits of the chat-template interpreter (see
// interpreter.h).
#include "engine/tokenizer/jinja/interpreter.h"

#include <memory>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/base/status.h"
#include "engine/tokenizer/jinja/library.h"

namespace specd::jinja {
namespace {

// Jinja's loop.cycle(a, b, ...): picks by the current iteration index.
class LoopCycle : public Callable {
 public:
  explicit LoopCycle(std::shared_ptr<const size_t> index) : index_(std::move(index)) {}
  absl::string_view name() const override { return "cycle"; }
  absl::StatusOr<Value> Call(Interpreter&, CallArgs args) const override {
    if (args.positional.empty()) return TypeError("no items for cycling given");
    return args.positional[*index_ % args.positional.size()];
  }

 private:
  std::shared_ptr<const size_t> index_;
};

// A macro as a value: calling it runs its body.
class MacroValue : public Callable {
 public:
  explicit MacroValue(const Stmt* def, Value caller = Value())
      : def_(def), caller_(std::move(caller)) {}
  absl::string_view name() const override { return def_->text; }
  absl::StatusOr<Value> Call(Interpreter& interp, CallArgs args) const override {
    return interp.CallMacro(*def_, std::move(args), caller_.is_undefined() ? nullptr : &caller_);
  }
  const Stmt* def() const { return def_; }

 private:
  const Stmt* def_;
  Value caller_;
};

Value MakeLoop(const ValueList& items, size_t i, const Value& cycle) {
  const auto n = static_cast<int64_t>(items.size());
  const auto index = static_cast<int64_t>(i);
  ValueDict loop;
  loop.Set("index", Value::Int(index + 1));
  loop.Set("index0", Value::Int(index));
  loop.Set("revindex", Value::Int(n - index));
  loop.Set("revindex0", Value::Int(n - index - 1));
  loop.Set("first", Value::Bool(i == 0));
  loop.Set("last", Value::Bool(index == n - 1));
  loop.Set("length", Value::Int(n));
  loop.Set("depth", Value::Int(1));
  loop.Set("depth0", Value::Int(0));
  loop.Set("previtem", i > 0 ? items[i - 1] : Value::Undefined("there is no previous item"));
  loop.Set("nextitem", index + 1 < n ? items[i + 1] : Value::Undefined("there is no next item"));
  loop.Set("cycle", cycle);
  return Value::Dict(std::move(loop));
}

}  // namespace

Interpreter::Interpreter(RenderLimits limits, absl::Time now, absl::TimeZone time_zone)
    : limits_(limits), now_(now), time_zone_(time_zone) {}

absl::StatusOr<std::string> Interpreter::Render(const Body& body, const Value& context) {
  frames_.clear();
  frames_.emplace_back();
  for (auto& [name, value] : BuiltinGlobals()) frames_[0].vars.Set(name, std::move(value));
  frames_.emplace_back();
  if (context.is_dict()) {
    for (const auto& [name, value] : context.dict().entries()) frames_[1].vars.Set(name, value);
  }
  std::string out;
  out_ = &out;
  absl::Status status = Exec(body);
  out_ = nullptr;
  SPECD_RETURN_IF_ERROR(status);
  return out;
}

absl::Status Interpreter::Locate(absl::Status status, int line, int column) {
  if (status.ok() || error_final_) return status;
  error_final_ = true;
  return absl::Status(status.code(), absl::StrCat("chat template error at line ", line, ", column ",
                                                  column, ": ", status.message()));
}

absl::Status Interpreter::Raise(std::string message) {
  error_final_ = true;
  return absl::InvalidArgumentError(std::move(message));
}

absl::Status Interpreter::CheckSize(size_t bytes) const {
  if (bytes <= limits_.max_output_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("chat template output exceeds the limit of ",
                                                 limits_.max_output_bytes, " bytes"));
}

absl::Status Interpreter::Step(int64_t n) {
  steps_ += n;
  if (steps_ <= limits_.max_steps) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("chat template exceeded its work limit of ",
                                                 limits_.max_steps, " steps (runaway loop?)"));
}

absl::Status Interpreter::Write(absl::string_view text) {
  SPECD_RETURN_IF_ERROR(CheckSize(out_->size() + text.size()));
  absl::StrAppend(out_, text);
  return absl::OkStatus();
}

Value Interpreter::Lookup(absl::string_view name) const {
  for (size_t i = frames_.size(); i-- > 0;) {
    if (const Value* v = frames_[i].vars.Find(name)) return *v;
    if (frames_[i].isolated && i > 2) i = 2;  // skip to the top level
  }
  return Value::Undefined(absl::StrCat("'", name, "' is undefined"));
}

void Interpreter::Assign(const std::string& name, Value value) {
  frames_.back().vars.Set(name, std::move(value));
}

absl::Status Interpreter::Exec(const Body& body) {
  for (const StmtPtr& stmt : body) {
    SPECD_RETURN_IF_ERROR(ExecStmt(*stmt));
    if (flow_ != Flow::kNormal) break;
  }
  return absl::OkStatus();
}

absl::Status Interpreter::ExecStmt(const Stmt& stmt) {
  SPECD_RETURN_IF_ERROR(Step());
  absl::Status status;
  switch (stmt.kind) {
    case StmtKind::kText:
      status = Write(stmt.text);
      break;
    case StmtKind::kOutput:
      status = ExecOutput(stmt);
      break;
    case StmtKind::kIf:
      status = ExecIf(stmt);
      break;
    case StmtKind::kFor:
      status = ExecFor(stmt);
      break;
    case StmtKind::kSet:
      status = ExecSet(stmt);
      break;
    case StmtKind::kSetBlock:
      status = ExecSetBlock(stmt);
      break;
    case StmtKind::kMacro:
      Assign(stmt.text, Value::Function(std::make_shared<MacroValue>(&stmt)));
      break;
    case StmtKind::kCallBlock:
      status = ExecCallBlock(stmt);
      break;
    case StmtKind::kFilterBlock:
      status = ExecFilterBlock(stmt);
      break;
    case StmtKind::kWith:
      status = ExecWith(stmt);
      break;
    case StmtKind::kScope:
      status = Exec(stmt.body);
      break;
    case StmtKind::kBreak:
      flow_ = Flow::kBreak;
      break;
    case StmtKind::kContinue:
      flow_ = Flow::kContinue;
      break;
  }
  return Locate(std::move(status), stmt.line, stmt.column);
}

absl::Status Interpreter::ExecOutput(const Stmt& stmt) {
  SPECD_ASSIGN_OR_RETURN(Value value, Eval(*stmt.expr));
  if (value.is_string()) return Write(value.str());
  std::string text;
  AppendPyStr(value, &text, limits_.max_output_bytes);
  return Write(text);
}

absl::Status Interpreter::ExecIf(const Stmt& stmt) {
  for (const Branch& branch : stmt.branches) {
    if (branch.condition != nullptr) {
      SPECD_ASSIGN_OR_RETURN(Value cond, Eval(*branch.condition));
      if (!Truthy(cond)) continue;
    }
    return Exec(branch.body);
  }
  return absl::OkStatus();
}

absl::Status Interpreter::ExecFor(const Stmt& stmt) {
  SPECD_ASSIGN_OR_RETURN(Value iterable, Eval(*stmt.expr));
  SPECD_ASSIGN_OR_RETURN(ValueList items, Iterate(iterable));
  if (stmt.filter != nullptr) {
    // The `if` filter sees each item bound to the loop variables.
    ValueList kept;
    frames_.emplace_back();
    absl::Cleanup pop = [this] { frames_.pop_back(); };
    for (const Value& item : items) {
      SPECD_RETURN_IF_ERROR(Step());
      frames_.back().vars.Clear();
      SPECD_RETURN_IF_ERROR(Bind(stmt.target, item));
      SPECD_ASSIGN_OR_RETURN(Value keep, Eval(*stmt.filter));
      if (Truthy(keep)) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) return Exec(stmt.else_body);
  return RunLoopBody(stmt, items);
}

absl::Status Interpreter::RunLoopBody(const Stmt& stmt, const ValueList& items) {
  auto index = std::make_shared<size_t>(0);
  const Value cycle =
      stmt.uses_loop ? Value::Function(std::make_shared<LoopCycle>(index)) : Value();
  // One frame, emptied per iteration: an iteration's variables do not outlive it.
  frames_.emplace_back();
  absl::Cleanup pop = [this] { frames_.pop_back(); };
  for (size_t i = 0; i < items.size(); ++i) {
    SPECD_RETURN_IF_ERROR(Step());
    *index = i;
    frames_.back().vars.Clear();
    SPECD_RETURN_IF_ERROR(Bind(stmt.target, items[i]));
    if (stmt.uses_loop) Assign("loop", MakeLoop(items, i, cycle));
    SPECD_RETURN_IF_ERROR(Exec(stmt.body));
    const Flow flow = flow_;
    flow_ = Flow::kNormal;
    if (flow == Flow::kBreak) break;
  }
  return absl::OkStatus();
}

absl::Status Interpreter::Bind(const AssignTarget& target, const Value& value) {
  if (!target.is_tuple) {
    Assign(target.names[0], value);
    return absl::OkStatus();
  }
  SPECD_ASSIGN_OR_RETURN(ValueList parts, Iterate(value));
  if (parts.size() != target.names.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        parts.size() > target.names.size() ? "too many" : "not enough",
        " values to unpack (expected ", target.names.size(), ", got ", parts.size(), ")"));
  }
  for (size_t i = 0; i < parts.size(); ++i) Assign(target.names[i], parts[i]);
  return absl::OkStatus();
}

absl::Status Interpreter::ExecSet(const Stmt& stmt) {
  SPECD_ASSIGN_OR_RETURN(Value value, Eval(*stmt.expr));
  if (stmt.target.attribute.empty()) return Bind(stmt.target, value);
  const Value ns = Lookup(stmt.target.names[0]);
  if (!ns.is_namespace()) {
    return absl::InvalidArgumentError("cannot assign attribute on non-namespace object");
  }
  if (value.has_namespace()) {
    return absl::InvalidArgumentError("a namespace cannot be stored inside a namespace");
  }
  ns.namespace_attrs().Set(stmt.target.attribute, std::move(value));
  return absl::OkStatus();
}

absl::StatusOr<std::string> Interpreter::Capture(const Body& body) {
  std::string captured;
  std::string* saved = out_;
  out_ = &captured;
  absl::Status status = Exec(body);
  out_ = saved;
  SPECD_RETURN_IF_ERROR(status);
  return captured;
}

absl::Status Interpreter::ExecSetBlock(const Stmt& stmt) {
  SPECD_ASSIGN_OR_RETURN(std::string text, Capture(stmt.body));
  Value value = Value::String(std::move(text));
  if (stmt.filter != nullptr) {
    SPECD_ASSIGN_OR_RETURN(value, EvalFilter(*stmt.filter, &value));
  }
  Assign(stmt.target.names[0], std::move(value));
  return absl::OkStatus();
}

absl::Status Interpreter::ExecFilterBlock(const Stmt& stmt) {
  SPECD_ASSIGN_OR_RETURN(std::string text, Capture(stmt.body));
  const Value input = Value::String(std::move(text));
  SPECD_ASSIGN_OR_RETURN(Value value, EvalFilter(*stmt.filter, &input));
  return Write(PyStr(value));
}

absl::Status Interpreter::ExecCallBlock(const Stmt& stmt) {
  const Expr& call = *stmt.expr;
  SPECD_ASSIGN_OR_RETURN(Value callee, Eval(*call.children[0]));
  const auto* macro =
      callee.is_callable() ? dynamic_cast<const MacroValue*>(&callee.callable()) : nullptr;
  if (macro == nullptr) return TypeError("{% call %} needs a macro");
  SPECD_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(call, 1));
  // The caller is the call block's body, run like a macro with the block's parameters.
  const Value caller = Value::Function(std::make_shared<MacroValue>(&stmt));
  SPECD_ASSIGN_OR_RETURN(Value result, CallMacro(*macro->def(), std::move(args), &caller));
  return Write(result.str());
}

absl::Status Interpreter::ExecWith(const Stmt& stmt) {
  std::vector<Value> values;
  for (const auto& [name, expr] : stmt.assignments) {
    SPECD_ASSIGN_OR_RETURN(Value value, Eval(*expr));
    values.push_back(std::move(value));
  }
  frames_.emplace_back();
  absl::Cleanup pop = [this] { frames_.pop_back(); };
  for (size_t i = 0; i < values.size(); ++i) Assign(stmt.assignments[i].first, values[i]);
  return Exec(stmt.body);
}

absl::StatusOr<Value> Interpreter::CallMacro(const Stmt& def, CallArgs args, const Value* caller) {
  SPECD_RETURN_IF_ERROR(Step());
  if (call_depth_ >= limits_.max_call_depth) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chat template exceeded the maximum macro call depth of ", limits_.max_call_depth));
  }
  ++call_depth_;
  frames_.emplace_back();
  frames_.back().isolated = true;
  const Flow saved_flow = flow_;
  absl::Cleanup leave = [this, saved_flow] {
    frames_.pop_back();
    --call_depth_;
    flow_ = saved_flow;
  };
  SPECD_RETURN_IF_ERROR(BindMacroArgs(def, std::move(args), caller));
  SPECD_ASSIGN_OR_RETURN(std::string text, Capture(def.body));
  return Value::String(std::move(text));
}

absl::Status Interpreter::BindMacroArgs(const Stmt& def, CallArgs args, const Value* caller) {
  ValueDict extra_kwargs;
  for (auto& [name, value] : args.keyword) {
    bool is_param = false;
    for (const Param& param : def.params) is_param = is_param || param.name == name;
    if (!is_param) extra_kwargs.Set(name, value);
  }
  for (size_t i = 0; i < def.params.size(); ++i) {
    const Param& param = def.params[i];
    Value value = Value::Undefined(absl::StrCat("'", param.name, "' is undefined"));
    bool bound = i < args.positional.size();
    if (bound) value = args.positional[i];
    for (auto& [name, kw_value] : args.keyword) {
      if (name != param.name) continue;
      if (bound) {
        return TypeError(
            absl::StrCat("macro '", def.text, "' got multiple values for '", name, "'"));
      }
      value = kw_value;
      bound = true;
    }
    if (!bound && param.default_value != nullptr) {
      SPECD_ASSIGN_OR_RETURN(value, Eval(*param.default_value));
    }
    Assign(param.name, std::move(value));
  }
  ValueList varargs;
  for (size_t i = def.params.size(); i < args.positional.size(); ++i) {
    varargs.push_back(args.positional[i]);
  }
  Assign("varargs", Value::Tuple(std::move(varargs)));
  Assign("kwargs", Value::Dict(std::move(extra_kwargs)));
  if (caller != nullptr) Assign("caller", *caller);
  return absl::OkStatus();
}

}  // namespace specd::jinja
