// Streaming detokenization for one sequence: each Push returns the text that the new
// token completes, never a broken UTF-8 sequence. It decodes a short window of recent ids
// twice — up to the last emitted point and including the new token — and emits the
// difference (the vLLM / HF TGI prefix-offset scheme), so decoder context such as
// SentencePiece's leading-space strip or byte-fallback runs is applied exactly as in a full
// Decode: concatenating every Push and the final Flush equals Decode of all generated ids.
// One instance per sequence, used by the engine thread only; the Tokenizer must outlive it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace specd {

class Tokenizer;

class IncrementalDetokenizer {
 public:
  // prompt_ids gives the context the first generated token continues (only its last few
  // ids are kept). skip_special drops special tokens as Decode does.
  IncrementalDetokenizer(const Tokenizer& tok, std::span<const int32_t> prompt_ids,
                         bool skip_special);

  // Newly completed text (possibly empty). Ids outside the vocabulary decode to nothing.
  std::string Push(int32_t id);
  // Whatever is held back at the end; invalid trailing bytes become U+FFFD.
  std::string Flush();

 private:
  std::string Emit(bool force);
  std::string DecodeRange(size_t begin, size_t end) const;

  const Tokenizer& tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;  // prompt tail + generated ids, trimmed as text is emitted
  size_t prefix_offset_ = 0;  // window start: context for the decoder
  size_t read_offset_ = 0;    // ids_[prefix_offset_, read_offset_) decode to emitted text
};

}  // namespace specd
