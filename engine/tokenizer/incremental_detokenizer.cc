#include "engine/tokenizer/incremental_detokenizer.h"

#include <algorithm>

#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"

namespace specd {
namespace {

// Prompt ids kept as decoder context (vLLM keeps 5 too).
constexpr size_t kPromptContext = 5;
// Beyond this many held tokens the text is emitted even if it ends in U+FFFD: no UTF-8
// sequence spans that many tokens, so the replacement char is final.
constexpr size_t kMaxHeldTokens = 32;

bool EndsWithReplacement(const std::string& s) {
  return s.size() >= tok::kReplacementChar.size() &&
         s.compare(s.size() - tok::kReplacementChar.size(), tok::kReplacementChar.size(),
                   tok::kReplacementChar) == 0;
}

bool StartsWithReplacement(const std::string& s) {
  return s.compare(0, tok::kReplacementChar.size(), tok::kReplacementChar) == 0;
}

// `full` minus the already emitted `prefix`. If the decoder rewrote the prefix (it should
// not), cut at the first character boundary past its length so the chunk stays valid.
std::string Suffix(const std::string& full, const std::string& prefix) {
  if (full.compare(0, prefix.size(), prefix) == 0) return full.substr(prefix.size());
  size_t cut = std::min(prefix.size(), full.size());
  while (cut < full.size() && (static_cast<uint8_t>(full[cut]) & 0xC0) == 0x80) ++cut;
  return full.substr(cut);
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tok,
                                               std::span<const int32_t> prompt_ids,
                                               bool skip_special)
    : tok_(tok), skip_special_(skip_special) {
  for (int32_t id : prompt_ids) {
    if (id < 0 || id >= tok_.vocab_size()) continue;
    if (skip_special_ && tok_.IsSpecial(id)) continue;
    ids_.push_back(id);
  }
  if (ids_.size() > kPromptContext) ids_.erase(ids_.begin(), ids_.end() - kPromptContext);
  // The kept tail may begin inside a character (its decode starts with U+FFFD); such ids
  // would taint every window, so drop them.
  while (!ids_.empty() && StartsWithReplacement(DecodeRange(0, ids_.size()))) {
    ids_.erase(ids_.begin());
  }
  // A prompt ending inside a character: leave those ids unread so the generated token that
  // completes the character emits it whole.
  read_offset_ = ids_.size();
  while (read_offset_ > 0 && EndsWithReplacement(DecodeRange(0, read_offset_))) --read_offset_;
  prefix_offset_ = 0;
}

std::string IncrementalDetokenizer::DecodeRange(size_t begin, size_t end) const {
  auto text =
      tok_.Decode(std::span<const int32_t>(ids_).subspan(begin, end - begin), skip_special_);
  return text.ok() ? *std::move(text) : std::string();  // ids are range-checked on entry
}

std::string IncrementalDetokenizer::Emit(bool force) {
  const std::string prefix_text = DecodeRange(prefix_offset_, read_offset_);
  const std::string new_text = DecodeRange(prefix_offset_, ids_.size());
  const bool held_too_long = ids_.size() - read_offset_ > kMaxHeldTokens;
  if (!force && !held_too_long &&
      (new_text.size() <= prefix_text.size() || EndsWithReplacement(new_text))) {
    return std::string();
  }
  std::string delta = Suffix(new_text, prefix_text);
  if (delta.empty() && !force && !held_too_long) return delta;
  // Slide the window: what was read becomes the context for the next tokens.
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  if (prefix_offset_ > 0) {  // drop ids that no longer matter
    ids_.erase(ids_.begin(), ids_.begin() + prefix_offset_);
    read_offset_ -= prefix_offset_;
    prefix_offset_ = 0;
  }
  return delta;
}

std::string IncrementalDetokenizer::Push(int32_t id) {
  if (id < 0 || id >= tok_.vocab_size()) return std::string();
  // A skipped special token decodes to nothing in any window: leaving it out is exact and
  // keeps the window short.
  if (skip_special_ && tok_.IsSpecial(id)) return std::string();
  ids_.push_back(id);
  return Emit(/*force=*/false);
}

std::string IncrementalDetokenizer::Flush() {
  if (read_offset_ == ids_.size()) return std::string();
  return Emit(/*force=*/true);
}

}  // namespace specd
