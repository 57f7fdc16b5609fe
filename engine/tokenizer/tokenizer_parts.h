// Internal: the pieces a loader (HF tokenizer.json or GGUF) assembles into a Tokenizer.
// Filled once by one thread at load, then read-only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/tokenizer/added_vocabulary.h"
#include "engine/tokenizer/bpe_model.h"
#include "engine/tokenizer/decoder.h"
#include "engine/tokenizer/normalizer.h"
#include "engine/tokenizer/pre_tokenizer.h"

namespace specd::tok {

struct TokenizerParts {
  // Per id: the string handed to the decoder (added tokens' content overrides the model
  // piece) and flags. Ids with no token are holes (kPresent unset).
  enum Flag : uint8_t { kPresent = 1, kSpecial = 2, kVerbatim = 4 };
  std::vector<std::string> pieces;
  std::vector<uint8_t> flags;

  AddedVocabulary added;
  std::unique_ptr<Normalizer> normalizer;       // may be null
  std::unique_ptr<PreTokenizer> pre_tokenizer;  // may be null
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<Decoder> decoder;  // null: pieces joined with spaces (HF)

  // Post-processor, for add_special: ids before and after the text.
  std::vector<int32_t> prefix_ids;
  std::vector<int32_t> suffix_ids;

  std::optional<int32_t> bos_id;
  std::vector<int32_t> eos_ids;
  std::string bos_token;
  std::string eos_token;
  std::string chat_template;
};

}  // namespace specd::tok
