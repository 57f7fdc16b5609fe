// Tokenizer helpers of the fuzz targets. The real tokenizers the tokenizer and detokenizer
// targets run on, loaded once: the
// bundled codepair byte-level BPE (models/codepair), stories260K's SentencePiece-style BPE with
// byte fallback and babyllama's character vocabulary without it (both from $SPECD_SHARED_DIR).
// One thread (a fuzz target's).
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/tokenizer/tokenizer.h"

namespace specd::fuzz {

enum class FixtureTokenizer {
  kCodepairByteLevel = 0,
  kStoriesSentencePiece = 1,
  kBabyllamaChars = 2
};
inline constexpr int kNumFixtureTokenizers = 3;

// Tokenizer `which` (loaded on first use; aborts when the files are missing).
const Tokenizer& GetFixtureTokenizer(FixtureTokenizer which);

// For a tokenizer loaded from fuzzed files (tokenizer.json, GGUF): a sample text encodes to
// ids inside the vocabulary (when it encodes at all), the first ids decode to valid UTF-8,
// and ids outside the vocabulary are refused. Aborts otherwise.
void CheckLoadedTokenizer(const Tokenizer& tok);

}  // namespace specd::fuzz
