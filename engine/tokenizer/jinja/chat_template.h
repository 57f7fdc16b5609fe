// Chat templates: the Jinja2 programs in Hugging Face tokenizer_config.json files that
// turn a list of messages into a prompt. This interpreter implements the subset real
// templates use and renders them as transformers does (trim_blocks, lstrip_blocks,
// Jinja's default Undefined, immutable sandbox, `tojson` as json.dumps(ensure_ascii=
// False), raise_exception and strftime_now). Parse once per model; Render is const and
// may be called from any number of threads at once. Every template problem (syntax,
// raise_exception, type errors, runaway output or loops) is an InvalidArgument status.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace specd {

namespace jinja {
struct Program;
}  // namespace jinja

struct ChatTemplateOptions {
  // Largest rendered prompt (and largest string an expression may build).
  size_t max_output_bytes = size_t{8} << 20;
  // Work budget: statements, loop iterations, calls and expression nodes.
  int64_t max_steps = 5'000'000;
  // Nested macro calls.
  int max_call_depth = 64;
  // What strftime_now() formats; unset means the current time.
  std::optional<absl::Time> now;
  // Zone of strftime_now(); transformers uses the server's local time.
  absl::TimeZone time_zone = absl::LocalTimeZone();
};

class ChatTemplate {
 public:
  // Parses `source`; syntax errors are InvalidArgument with line and column.
  static absl::StatusOr<ChatTemplate> Parse(absl::string_view source);

  // Renders with `context`'s keys as variables: {"messages": [...],
  // "add_generation_prompt": bool, "bos_token": "...", "eos_token": "...", "tools": ...}.
  // nlohmann::json sorts object keys; use RenderOrdered to keep the request's key order
  // (it shows in `tojson` of tools and arguments).
  absl::StatusOr<std::string> Render(const nlohmann::json& context) const;
  absl::StatusOr<std::string> Render(const nlohmann::json& context,
                                     const ChatTemplateOptions& options) const;
  absl::StatusOr<std::string> RenderOrdered(const nlohmann::ordered_json& context,
                                            const ChatTemplateOptions& options = {}) const;

  const std::string& source() const { return *source_; }

 private:
  ChatTemplate(std::shared_ptr<const std::string> source,
               std::shared_ptr<const jinja::Program> program)
      : source_(std::move(source)), program_(std::move(program)) {}

  std::shared_ptr<const std::string> source_;
  std::shared_ptr<const jinja::Program> program_;
};

// Builds the context transformers passes (messages, add_generation_prompt, bos_token,
// eos_token, tools=None and documents=None unless `extra` sets them, then `extra`'s other
// keys such as tools, enable_thinking or date_string) and renders. As with transformers,
// a tool call's "arguments" should be a JSON object, not the OpenAI API's JSON-encoded
// string: templates apply `tojson` to it.
absl::StatusOr<std::string> ApplyChatTemplate(
    const ChatTemplate& tmpl, const nlohmann::json& messages, bool add_generation_prompt,
    const std::string& bos_token, const std::string& eos_token,
    const nlohmann::json& extra = nlohmann::json::object());
// The same keeping the request's object key order (see RenderOrdered).
absl::StatusOr<std::string> ApplyChatTemplateOrdered(
    const ChatTemplate& tmpl, const nlohmann::ordered_json& messages, bool add_generation_prompt,
    const std::string& bos_token, const std::string& eos_token,
    const nlohmann::ordered_json& extra = nlohmann::ordered_json::object(),
    const ChatTemplateOptions& options = {});

}  // namespace specd
