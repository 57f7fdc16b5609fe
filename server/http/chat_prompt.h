// Chat messages -> prompt token ids: checks OpenAI's `messages` array, flattens content
// parts to text, renders the model's chat template (Jinja, engine/tokenizer/jinja) and
// tokenizes the result. Used by /v1/chat/completions and /tokenize. Pure; any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "server/http/json_fields.h"
#include "server/http/openai_api.h"

namespace specd::http {

// Reads body.messages, body.add_generation_prompt (default true), body.tools and
// body.chat_template_kwargs. add_special: add BOS/EOS around the rendered text (off for
// chat: templates write their own BOS). Template errors, unknown roles and text that cannot
// fit the context (openai_api.h) are 400s on `messages`. Special-token text in message
// content (e.g. "<|end_of_turn|>") is tokenized as plain text unless the model context
// allows it; the template's own special tokens stay control tokens.
absl::StatusOr<std::vector<int32_t>> ChatPromptIds(const Json& body, const ModelContext& model,
                                                   bool add_special);

}  // namespace specd::http
