// libFuzzer target: a GGUF file's metadata (engine/tokenizer/gguf_reader) and the vocabulary
// built from it (gguf_vocab), as `--tokenizer model.gguf` reads an untrusted file. Parse must
// refuse bad bytes with a status; a vocabulary that builds must then encode and decode
// (CheckLoadedTokenizer).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/tokenizer/gguf_reader.h"
#include "engine/tokenizer/gguf_vocab.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_parts.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/tokenizer_fixture.h"

namespace specd::fuzz {
namespace {

// The typed getters on the keys the vocabulary reads: a type mismatch is a status.
void ReadKnownKeys(const tok::GgufMetadata& meta) {
  for (std::string_view key : {"tokenizer.ggml.model", "tokenizer.ggml.pre",
                               "tokenizer.chat_template", "general.architecture"}) {
    (void)meta.GetString(key);
    (void)meta.GetInt(key);
    (void)meta.GetBool(key);
  }
  (void)meta.GetStringArray("tokenizer.ggml.tokens");
  (void)meta.GetFloatArray("tokenizer.ggml.scores");
  (void)meta.GetIntArray("tokenizer.ggml.token_type");
}

void FuzzOne(std::span<const uint8_t> bytes) {
  QuietLogs();
  absl::StatusOr<tok::GgufMetadata> meta = tok::GgufMetadata::Parse(bytes);
  if (!meta.ok()) return;
  ReadKnownKeys(*meta);
  absl::StatusOr<std::unique_ptr<tok::TokenizerParts>> parts = tok::BuildGgufTokenizer(*meta);
  if (!parts.ok()) return;
  const Tokenizer tokenizer(*std::move(parts));
  CheckLoadedTokenizer(tokenizer);
}

}  // namespace
}  // namespace specd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specd::fuzz::FuzzOne(std::span<const uint8_t>(data, size));
  return 0;
}
