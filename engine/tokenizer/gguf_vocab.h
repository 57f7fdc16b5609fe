// Internal: builds TokenizerParts from GGUF tokenizer metadata (tokenizer.ggml.*), the
// way llama.cpp interprets it: model "llama" = SentencePiece BPE (merges ranked by piece
// score, byte fallback, U+2581 for spaces), model "gpt2" = byte-level BPE with the regex
// pre-tokenizer named by tokenizer.ggml.pre. Control / user-defined / unknown tokens are
// added tokens. Called at load; any thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/gguf_reader.h"
#include "engine/tokenizer/tokenizer_parts.h"

namespace specd::tok {

absl::StatusOr<std::unique_ptr<TokenizerParts>> LoadGgufTokenizer(const std::string& path);
absl::StatusOr<std::unique_ptr<TokenizerParts>> BuildGgufTokenizer(const GgufMetadata& meta);

// The split regexes (applied in order) of a llama.cpp pre-tokenizer name; "" = default.
absl::StatusOr<std::vector<std::string>> GgufPreTokenizerPatterns(std::string_view pre);

}  // namespace specd::tok
