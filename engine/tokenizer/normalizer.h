// Normalizers of HF tokenizers (the `normalizer` field of tokenizer.json): text rewrites
// applied to each non-added-token segment before pre-tokenization. Supported: Sequence,
// Prepend, Replace, Strip, NFC/NFD/NFKC/NFKD, Lowercase, ByteLevel. Immutable after
// construction; Normalize may run on any thread.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/tokenizer/json_util.h"

namespace specd::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // `text` is valid UTF-8 on entry and stays so.
  virtual absl::Status Normalize(std::string* text) const = 0;
};

// Builds a normalizer from its tokenizer.json object.
absl::StatusOr<std::unique_ptr<Normalizer>> NormalizerFromJson(const Json& json);

// SentencePiece-style normalization for GGUF "llama" vocabularies: optionally prepend
// U+2581, then replace every space with U+2581 (HF's legacy Llama normalizer).
std::unique_ptr<Normalizer> MakeSpmNormalizer(bool add_space_prefix);

}  // namespace specd::tok
