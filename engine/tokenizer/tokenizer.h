// Text <-> token ids for a model: HF tokenizer.json directories (byte-level BPE with regex
// pre-tokenizers, SentencePiece-style BPE with byte fallback, added/special tokens,
// normalizers, decoders, post-processor BOS/EOS) and GGUF vocabularies (llama.cpp's "llama"
// SPM and "gpt2" BPE with its pre-tokenizer flavours). Encode/Decode follow HF tokenizers.
// A Tokenizer is immutable after loading: every method may be called from any thread
// concurrently (front-end threads encode requests while the engine thread decodes).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace specd {

namespace tok {
struct TokenizerParts;
}  // namespace tok

class Tokenizer {
 public:
  // dir holds tokenizer.json and optionally tokenizer_config.json (and chat_template.jinja).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromDir(const std::string& dir);
  // Reads only the GGUF metadata (tokenizer.ggml.*), never the tensors.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const std::string& path);

  explicit Tokenizer(std::unique_ptr<tok::TokenizerParts> parts);  // use FromDir / FromGguf
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Special tokens written in `text` are always recognised (HF semantics). add_special adds
  // BOS (and EOS if configured) as the model's post-processor says.
  // Invalid UTF-8 input -> InvalidArgument.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special) const;
  // As Encode, except that a special token (IsSpecial) whose text starts inside one of
  // `literal` (sorted, disjoint [begin, end) byte ranges of `text`) is plain text there, as
  // HF's split_special_tokens makes it for a whole text. Chat prompts pass the ranges of
  // message content, so that content cannot forge control tokens.
  absl::StatusOr<std::vector<int32_t>> EncodeWithLiteralRanges(
      std::string_view text, bool add_special,
      std::span<const std::pair<size_t, size_t>> literal) const;
  // Whether Encode would find a special token in `text`.
  bool ContainsSpecialToken(std::string_view text) const;
  // Id out of [0, vocab_size()) -> InvalidArgument. The result is always valid UTF-8.
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids, bool skip_special) const;

  // One past the largest id (vocabulary plus added tokens).
  int32_t vocab_size() const;
  std::optional<int32_t> bos_id() const;
  // From tokenizer_config's eos_token (GGUF: tokenizer.ggml.eos_token_id). The model's
  // generation_config may add more; the engine merges those.
  std::vector<int32_t> eos_ids() const;
  // Token strings, for chat templates; empty when the model has none.
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  const std::string& chat_template() const;  // empty if none
  // Special (HF `special: true`; GGUF control/unknown) tokens are dropped by skip_special.
  bool IsSpecial(int32_t id) const;
  // Exact vocabulary lookup of a token string (added tokens first, then model pieces).
  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token's string as stored (e.g. "▁Hello", "Ġworld", "<0x0A>"); empty if out of range.
  std::string_view IdToToken(int32_t id) const;

 private:
  // split_special: special tokens in the normalized text are plain text.
  absl::Status EncodeSegment(std::string_view text, bool at_start, bool split_special,
                             std::vector<int32_t>* ids) const;

  std::unique_ptr<const tok::TokenizerParts> parts_;
};

}  // namespace specd
