// Pre-tokenizers of HF tokenizers (the `pre_tokenizer` field of tokenizer.json): they cut
// each normalized segment into the words the BPE model sees. Supported: Sequence,
// ByteLevel, Split, Metaspace, Digits, Punctuation, Whitespace, WhitespaceSplit; plus the
// llama.cpp regex flavours for GGUF vocabularies. Immutable; any thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/json_util.h"

namespace specd::tok {

struct PreToken {
  std::string text;
  // Begins at offset 0 of the original input (Metaspace's prepend_scheme "first").
  bool at_start = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces every piece by its sub-pieces, in order; empty pieces are dropped.
  virtual absl::Status PreTokenize(std::vector<PreToken>* pieces) const = 0;
};

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizerFromJson(const Json& json);

// GGUF "gpt2" vocabularies: split with each regex in turn (matches isolated, as HF's
// Split), then map bytes to the byte-level alphabet.
absl::StatusOr<std::unique_ptr<PreTokenizer>> MakeRegexByteLevelPreTokenizer(
    const std::vector<std::string>& patterns);

}  // namespace specd::tok
