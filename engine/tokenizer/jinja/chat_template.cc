// ChatTemplate: parse once, render per request (see chat_template.h).
#include "engine/tokenizer/jinja/chat_template.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/base/status.h"
#include "engine/tokenizer/jinja/ast.h"
#include "engine/tokenizer/jinja/interpreter.h"
#include "engine/tokenizer/jinja/json_bridge.h"
#include "engine/tokenizer/jinja/parser.h"

namespace specd {
namespace jinja {

struct Program {
  Body body;
};

}  // namespace jinja
namespace {

absl::StatusOr<std::string> RenderValue(const jinja::Program& program, const jinja::Value& context,
                                        const ChatTemplateOptions& options) {
  if (!context.is_dict()) {
    return absl::InvalidArgumentError("chat template context must be a JSON object");
  }
  jinja::RenderLimits limits;
  limits.max_output_bytes = options.max_output_bytes;
  limits.max_steps = options.max_steps;
  limits.max_call_depth = options.max_call_depth;
  jinja::Interpreter interpreter(limits, options.now.value_or(absl::Now()), options.time_zone);
  return interpreter.Render(program.body, context);
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(absl::string_view source) {
  SPECD_ASSIGN_OR_RETURN(jinja::Body body, jinja::ParseTemplate(source));
  auto program = std::make_shared<jinja::Program>();
  program->body = std::move(body);
  return ChatTemplate(std::make_shared<const std::string>(source), std::move(program));
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::json& context) const {
  return Render(context, ChatTemplateOptions());
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::json& context,
                                                 const ChatTemplateOptions& options) const {
  SPECD_ASSIGN_OR_RETURN(jinja::Value value, jinja::ValueFromJson(context));
  return RenderValue(*program_, value, options);
}

absl::StatusOr<std::string> ChatTemplate::RenderOrdered(const nlohmann::ordered_json& context,
                                                        const ChatTemplateOptions& options) const {
  SPECD_ASSIGN_OR_RETURN(jinja::Value value, jinja::ValueFromJson(context));
  return RenderValue(*program_, value, options);
}

namespace {

template <typename Json>
absl::StatusOr<Json> BuildContext(const Json& messages, bool add_generation_prompt,
                                  const std::string& bos_token, const std::string& eos_token,
                                  const Json& extra) {
  if (!extra.is_object() && !extra.is_null()) {
    return absl::InvalidArgumentError("chat template kwargs must be a JSON object");
  }
  Json context = extra.is_object() ? extra : Json::object();
  context["messages"] = messages;
  context["add_generation_prompt"] = add_generation_prompt;
  context["bos_token"] = bos_token;
  context["eos_token"] = eos_token;
  if (!context.contains("tools")) context["tools"] = nullptr;
  if (!context.contains("documents")) context["documents"] = nullptr;
  return context;
}

}  // namespace

absl::StatusOr<std::string> ApplyChatTemplate(
    const ChatTemplate& tmpl, const nlohmann::json& messages, bool add_generation_prompt,
    const std::string& bos_token, const std::string& eos_token, const nlohmann::json& extra) {
  SPECD_ASSIGN_OR_RETURN(nlohmann::json context, BuildContext(messages, add_generation_prompt,
                                                              bos_token, eos_token, extra));
  return tmpl.Render(context);
}

absl::StatusOr<std::string> ApplyChatTemplateOrdered(
    const ChatTemplate& tmpl, const nlohmann::ordered_json& messages, bool add_generation_prompt,
    const std::string& bos_token, const std::string& eos_token, const nlohmann::ordered_json& extra,
    const ChatTemplateOptions& options) {
  SPECD_ASSIGN_OR_RETURN(
      nlohmann::ordered_json context,
      BuildContext(messages, add_generation_prompt, bos_token, eos_token, extra));
  return tmpl.RenderOrdered(context, options);
}

}  // namespace specd
