// Decoders of HF tokenizers (the `decoder` field of tokenizer.json): they turn the list of
// token strings back into text. Supported: Sequence, Replace, ByteFallback, Fuse, Strip,
// ByteLevel, Metaspace. Immutable; any thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/json_util.h"

namespace specd::tok {

struct DecodePiece {
  std::string text;
  // Emit the text as is in ByteLevel decoding (GGUF user-defined / control tokens are raw
  // text, not byte-level strings, as llama.cpp treats them).
  bool verbatim = false;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  // HF's decode_chain: rewrites the list of pieces; the caller concatenates the result.
  virtual void DecodeChain(std::vector<DecodePiece>* pieces) const = 0;
};

absl::StatusOr<std::unique_ptr<Decoder>> DecoderFromJson(const Json& json);

// Decoder of GGUF "llama" vocabularies: Replace(U+2581 -> ' '), ByteFallback, Fuse, and
// Strip of one leading space when the encoder adds a space prefix.
std::unique_ptr<Decoder> MakeSpmDecoder(bool strip_leading_space);

// Decoder of GGUF "gpt2" vocabularies: ByteLevel.
std::unique_ptr<Decoder> MakeByteLevelDecoder();

}  // namespace specd::tok
