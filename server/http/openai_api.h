// OpenAI / vLLM request bodies -> engine requests: /v1/completions and
// /v1/chat/completions (sampling fields, prompts in every OpenAI form, chat template
// applied), /tokenize and /detokenize. Pure functions of the JSON body and the served
// model (no sockets, no engine), so every rule is unit-tested; errors are statuses for
// errors.h's table, naming the field at fault. Any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/engine.h"
#include "server/http/json_fields.h"

namespace specd {
class Tokenizer;
class ChatTemplate;
}  // namespace specd

namespace specd::http {

// What request parsing needs from the served model; immutable once serving starts.
struct ModelContext {
  std::string served_model_name;
  const Tokenizer* tokenizer = nullptr;         // null: token-id prompts only
  const ChatTemplate* chat_template = nullptr;  // null: the model cannot chat
  int32_t max_model_len = 0;
  int32_t vocab_size = 0;
  // The server's speculation defaults (whether usage reports speculation). What a request's
  // speculation may be is the engine's to say, at Submit.
  SpeculativeConfig speculative;
  // Special-token text in chat message content becomes control tokens (as the template's
  // own do). Off: it is tokenized as plain text (chat_prompt.h).
  bool allow_special_tokens_in_content = false;
};

// Text to tokenize (a prompt string, a rendered chat prompt, /tokenize input) longer than
// this many bytes per token of the context is refused before tokenization: it cannot fit
// unless its tokens average more than 64 bytes (long runs of whitespace at best).
inline constexpr int64_t kMaxTextBytesPerToken = 64;
// 400 context_length_exceeded naming `param` when `bytes` of text cannot fit the context.
absl::Status CheckTextLength(size_t bytes, const ModelContext& model, absl::string_view param);

// Most choices (n) per prompt, and engine requests per HTTP request (prompts x n).
inline constexpr int32_t kMaxN = 128;
inline constexpr int32_t kMaxChoices = 256;
// Most logprobs / top_logprobs alternatives per token (the sampler's limit).
inline constexpr int32_t kMaxLogprobs = 20;

enum class Endpoint { kCompletions, kChat };

// A validated generation request. requests[prompt * n + j] is choice (prompt, j); its
// index in OpenAI's `choices` is the same number.
struct GenerationSpec {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // the served model name, echoed in responses
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int32_t n = 1;
  int32_t num_prompts = 1;
  bool logprobs = false;       // report logprobs
  int32_t top_logprobs = 0;    // alternatives per token when logprobs
  bool tokens_as_ids = false;  // vLLM's return_tokens_as_token_ids: "token_id:N" strings
  // The request's `speculation` object ({"method", "num_speculative_tokens"}), set on every
  // choice's request.
  SpeculationParams speculation;
  // usage carries a `speculation` object: the request had one, or the server speculates by
  // default. Otherwise usage stays exactly OpenAI's.
  bool report_speculation = false;
  std::vector<GenerateRequest> requests;
};

// 404 model_not_found unless body.model is absent, null or the served name.
absl::Status CheckModel(const Json& body, const ModelContext& model);

absl::StatusOr<GenerationSpec> ParseCompletionRequest(const Json& body, const ModelContext& model);
absl::StatusOr<GenerationSpec> ParseChatRequest(const Json& body, const ModelContext& model);

// vLLM's /tokenize: {"prompt": str, "add_special_tokens": bool=true} or
// {"messages": [...], "add_generation_prompt": bool=true, "add_special_tokens": bool=false}.
struct TokenizeSpec {
  std::vector<int32_t> ids;
  bool return_token_strs = false;
};
absl::StatusOr<TokenizeSpec> ParseTokenizeRequest(const Json& body, const ModelContext& model);
// vLLM's /detokenize: {"tokens": [int]} -> the ids, checked against the vocabulary.
absl::StatusOr<std::vector<int32_t>> ParseDetokenizeRequest(const Json& body,
                                                            const ModelContext& model);

}  // namespace specd::http
