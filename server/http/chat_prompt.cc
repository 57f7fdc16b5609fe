#include "server/http/chat_prompt.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "engine/base/status.h"
#include "engine/tokenizer/jinja/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/http/errors.h"

namespace specd::http {
namespace {

// OpenAI content: a string, null (assistant turns with tool calls), or text parts, which
// are joined with newlines as vLLM does.
absl::StatusOr<std::string> ContentText(const Json& content) {
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    return SchemaError("messages", "message 'content' must be a string or an array of parts");
  }
  std::string text;
  for (const Json& part : content) {
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return SchemaError("messages", "each content part must be an object with a 'type'");
    }
    if (part["type"] != "text") {
      return InvalidParam("messages",
                          absl::StrCat("content part type '", part["type"].get<std::string>(),
                                       "' is not supported (text only)"));
    }
    if (!part.contains("text") || !part["text"].is_string()) {
      return SchemaError("messages", "a text content part needs a string 'text'");
    }
    if (!text.empty()) text += "\n";
    text += part["text"].get<std::string>();
  }
  return text;
}

absl::StatusOr<Json> TemplateMessages(const Json& body) {
  const Json* messages = FindField(body, "messages");
  if (messages == nullptr) return SchemaError("messages", "'messages' is required");
  if (!messages->is_array()) return SchemaError("messages", "'messages' must be an array");
  if (messages->empty()) return InvalidParam("messages", "'messages' must not be empty");
  Json out = Json::array();
  for (const Json& m : *messages) {
    if (!m.is_object()) return SchemaError("messages", "each message must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string() || role->get_ref<const std::string&>().empty()) {
      return SchemaError("messages", "each message needs a non-empty string 'role'");
    }
    Json copy = m;
    SPECD_ASSIGN_OR_RETURN(copy["content"], ContentText(m.value("content", Json())));
    out.push_back(std::move(copy));
  }
  return out;
}

absl::StatusOr<Json> TemplateExtra(const Json& body) {
  Json extra = Json::object();
  if (const Json* tools = FindField(body, "tools")) {
    if (!tools->is_array()) return SchemaError("tools", "'tools' must be an array");
    extra["tools"] = *tools;
  }
  if (const Json* kwargs = FindField(body, "chat_template_kwargs")) {
    if (!kwargs->is_object()) {
      return SchemaError("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    }
    for (const auto& [key, value] : kwargs->items()) extra[key] = value;
  }
  return extra;
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> ChatPromptIds(const Json& body, const ModelContext& model,
                                                   bool add_special) {
  SPECD_ASSIGN_OR_RETURN(Json messages, TemplateMessages(body));
  bool add_generation_prompt = true;
  SPECD_RETURN_IF_ERROR(ReadBool(body, "add_generation_prompt", &add_generation_prompt));
  SPECD_ASSIGN_OR_RETURN(Json extra, TemplateExtra(body));
  if (model.tokenizer == nullptr || model.chat_template == nullptr) {
    return InvalidParam("messages", "this model has no chat template; use /v1/completions");
  }
  const Tokenizer& tok = *model.tokenizer;
  absl::StatusOr<std::string> text =
      ApplyChatTemplateOrdered(*model.chat_template, messages, add_generation_prompt,
                               tok.bos_token(), tok.eos_token(), extra);
  if (!text.ok()) {
    return InvalidParam("messages", absl::StrCat("chat template error: ", text.status().message()));
  }
  absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(*text, add_special);
  if (!ids.ok()) return InvalidParam("messages", ids.status().message());
  if (ids->empty()) return InvalidParam("messages", "the rendered chat prompt is empty");
  return ids;
}

}  // namespace specd::http
