#include "server/http/chat_prompt.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/base/status.h"
#include "engine/tokenizer/jinja/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/http/errors.h"

namespace specd::http {
namespace {

// OpenAI's roles ("developer" is the newer name of "system"; "function" the older "tool").
constexpr absl::string_view kRoles[] = {"system",    "developer", "user",
                                        "assistant", "tool",      "function"};

// Private-use code points around a placeholder: U+E000 <nonce>-<index> U+E001.
constexpr absl::string_view kPlaceholderOpen = "\xEE\x80\x80";
constexpr absl::string_view kPlaceholderClose = "\xEE\x80\x81";

// The template's view of `messages` (content flattened to text) and each one's content.
struct Conversation {
  Json messages;
  std::vector<std::string> contents;  // [messages.size()]
};

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

absl::Status CheckRole(const Json& m) {
  auto role = m.find("role");
  if (role == m.end() || !role->is_string() || role->get_ref<const std::string&>().empty()) {
    return SchemaError("messages", "each message needs a non-empty string 'role'");
  }
  const std::string& name = role->get_ref<const std::string&>();
  if (std::find(std::begin(kRoles), std::end(kRoles), name) == std::end(kRoles)) {
    return InvalidParam("messages", absl::StrCat("unknown message role '", name,
                                                 "'; use system, developer, user, assistant "
                                                 "or tool"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Conversation> ReadMessages(const Json& body, const ModelContext& model) {
  const Json* messages = FindField(body, "messages");
  if (messages == nullptr) return SchemaError("messages", "'messages' is required");
  if (!messages->is_array()) return SchemaError("messages", "'messages' must be an array");
  if (messages->empty()) return InvalidParam("messages", "'messages' must not be empty");
  Conversation conv;
  conv.messages = Json::array();
  size_t total_bytes = 0;
  for (const Json& m : *messages) {
    if (!m.is_object()) return SchemaError("messages", "each message must be an object");
    SPECD_RETURN_IF_ERROR(CheckRole(m));
    SPECD_ASSIGN_OR_RETURN(std::string text, ContentText(m.value("content", Json())));
    total_bytes += text.size();
    SPECD_RETURN_IF_ERROR(CheckTextLength(total_bytes, model, "messages"));
    Json copy = m;
    copy["content"] = text;
    conv.messages.push_back(std::move(copy));
    conv.contents.push_back(std::move(text));
  }
  return conv;
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

// What rendering needs besides the messages.
struct RenderArgs {
  const ChatTemplate* chat_template = nullptr;
  const Tokenizer* tokenizer = nullptr;
  bool add_generation_prompt = true;
  Json extra;
};

absl::StatusOr<std::string> Render(const RenderArgs& args, const Json& messages) {
  absl::StatusOr<std::string> text = ApplyChatTemplateOrdered(
      *args.chat_template, messages, args.add_generation_prompt, args.tokenizer->bos_token(),
      args.tokenizer->eos_token(), args.extra);
  if (!text.ok()) {
    return InvalidParam("messages", absl::StrCat("chat template error: ", text.status().message()));
  }
  return text;
}

std::string NewNonce() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return hex;
}

// Puts contents[i] where the placeholder for i is; `literal` gets their byte ranges.
std::string Splice(absl::string_view with_placeholders, absl::string_view open,
                   const std::vector<std::string>& contents,
                   std::vector<std::pair<size_t, size_t>>* literal) {
  std::string out;
  size_t pos = 0;
  for (size_t at; (at = with_placeholders.find(open, pos)) != absl::string_view::npos;) {
    const size_t digits = at + open.size();
    const size_t close = with_placeholders.find(kPlaceholderClose, digits);
    size_t index = 0;
    if (close == absl::string_view::npos ||
        !absl::SimpleAtoi(with_placeholders.substr(digits, close - digits), &index) ||
        index >= contents.size()) {
      absl::StrAppend(&out, with_placeholders.substr(pos, digits - pos));  // not ours: left as is
      pos = digits;
      continue;
    }
    absl::StrAppend(&out, with_placeholders.substr(pos, at - pos));
    if (!contents[index].empty())
      literal->emplace_back(out.size(), out.size() + contents[index].size());
    out += contents[index];
    pos = close + kPlaceholderClose.size();
  }
  absl::StrAppend(&out, with_placeholders.substr(pos));
  return out;
}

// Tokenizes `rendered` with special-token text inside message content kept as plain text:
// renders again with an unguessable placeholder for each content, puts the contents back
// and tokenizes with special tokens recognised only outside them. A template that rewrites
// content (trims or splits it) gives another text than `rendered`: then refused.
absl::StatusOr<std::vector<int32_t>> EncodeContentAsText(const std::string& rendered,
                                                         const Conversation& conv,
                                                         const RenderArgs& args, bool add_special) {
  const std::string open = absl::StrCat(kPlaceholderOpen, NewNonce(), "-");
  Json messages = conv.messages;
  for (size_t i = 0; i < messages.size(); ++i) {
    messages[i]["content"] = absl::StrCat(open, i, kPlaceholderClose);
  }
  SPECD_ASSIGN_OR_RETURN(std::string with_placeholders, Render(args, messages));
  std::vector<std::pair<size_t, size_t>> literal;
  if (Splice(with_placeholders, open, conv.contents, &literal) != rendered) {
    return InvalidParam(
        "messages",
        "message content holds special-token text, and this model's chat template changes "
        "content, so it cannot be kept as plain text; remove it, or start the server with "
        "--allow-special-tokens-in-content");
  }
  absl::StatusOr<std::vector<int32_t>> ids =
      args.tokenizer->EncodeWithLiteralRanges(rendered, add_special, literal);
  if (!ids.ok()) return InvalidParam("messages", ids.status().message());
  return ids;
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> ChatPromptIds(const Json& body, const ModelContext& model,
                                                   bool add_special) {
  SPECD_ASSIGN_OR_RETURN(Conversation conv, ReadMessages(body, model));
  RenderArgs args;
  args.chat_template = model.chat_template;
  args.tokenizer = model.tokenizer;
  SPECD_RETURN_IF_ERROR(ReadBool(body, "add_generation_prompt", &args.add_generation_prompt));
  SPECD_ASSIGN_OR_RETURN(args.extra, TemplateExtra(body));
  if (model.tokenizer == nullptr || model.chat_template == nullptr) {
    return InvalidParam("messages", "this model has no chat template; use /v1/completions");
  }
  SPECD_ASSIGN_OR_RETURN(std::string text, Render(args, conv.messages));
  SPECD_RETURN_IF_ERROR(CheckTextLength(text.size(), model, "messages"));
  const Tokenizer& tok = *model.tokenizer;
  const bool content_has_special =
      !model.allow_special_tokens_in_content &&
      std::any_of(conv.contents.begin(), conv.contents.end(),
                  [&](const std::string& c) { return tok.ContainsSpecialToken(c); });
  std::vector<int32_t> ids;
  if (content_has_special) {
    SPECD_ASSIGN_OR_RETURN(ids, EncodeContentAsText(text, conv, args, add_special));
  } else {
    absl::StatusOr<std::vector<int32_t>> encoded = tok.Encode(text, add_special);
    if (!encoded.ok()) return InvalidParam("messages", encoded.status().message());
    ids = *std::move(encoded);
  }
  if (ids.empty()) return InvalidParam("messages", "the rendered chat prompt is empty");
  return ids;
}

}  // namespace specd::http
