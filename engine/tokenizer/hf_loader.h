// Internal: builds TokenizerParts from an HF tokenizer directory (tokenizer.json plus the
// optional tokenizer_config.json / chat_template.jinja). Called once at load, any thread.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer_parts.h"

namespace specd::tok {

absl::StatusOr<std::unique_ptr<TokenizerParts>> LoadHfTokenizer(const std::string& dir);

}  // namespace specd::tok
