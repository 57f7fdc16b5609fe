// libFuzzer target: IncrementalDetokenizer streaming arbitrary ids (a few outside the
// vocabulary) after an arbitrary prompt, with real tokenizers (tokenizer_fixture.h). Input: a
// control byte (tokenizer, skip_special), a prompt length byte, then little-endian u16 ids.
// Checks incremental_detokenizer.h's promises: every chunk is valid UTF-8, and, when the ids
// decode without replacement characters, the chunks and Flush together equal Decode of the
// generated ids (without a prompt), or what the generated ids add to the prompt's text (with
// one, when the prompt ends on a character boundary).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/incremental_detokenizer.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/tokenizer_fixture.h"

namespace specd::fuzz {
namespace {

std::string IdsText(std::span<const int32_t> ids) {
  std::string s;
  for (int32_t id : ids) absl::StrAppend(&s, id, " ");
  return s;
}

// The streamed text of `generated` after `prompt` (every chunk checked to be UTF-8).
std::string Stream(const Tokenizer& tok, std::span<const int32_t> prompt,
                   std::span<const int32_t> generated, bool skip_special) {
  IncrementalDetokenizer detok(tok, prompt, skip_special);
  std::string out;
  for (int32_t id : generated) {
    const std::string chunk = detok.Push(id);
    FUZZ_CHECK(IsValidUtf8(chunk), absl::StrCat("chunk after ", IdsText(generated)));
    out += chunk;
  }
  const std::string rest = detok.Flush();
  FUZZ_CHECK(IsValidUtf8(rest), "flush");
  return out + rest;
}

void FuzzOne(const uint8_t* data, size_t size) {
  if (size < 2) return;
  const auto which = static_cast<FixtureTokenizer>(data[0] % kNumFixtureTokenizers);
  const bool skip_special = (data[0] >> 2) & 1;
  const Tokenizer& tok = GetFixtureTokenizer(which);
  const auto modulus = static_cast<uint32_t>(tok.vocab_size() + 2);
  std::vector<int32_t> ids;
  bool in_range = true;
  for (size_t i = 2; i + 1 < size; i += 2) {
    const uint32_t raw = data[i] | data[i + 1] << 8;
    ids.push_back(static_cast<int32_t>(raw % modulus));
    in_range = in_range && ids.back() < tok.vocab_size();
  }
  const size_t cut = std::min<size_t>(data[1] % 16, ids.size());
  const std::span<const int32_t> prompt(ids.data(), cut);
  const std::span<const int32_t> generated(ids.data() + cut, ids.size() - cut);
  const std::string streamed = Stream(tok, prompt, generated, skip_special);
  if (!in_range) return;  // Decode refuses what the stream skips: nothing to compare
  const std::string full = *tok.Decode(ids, skip_special);
  // Byte-fallback runs that are not UTF-8 become one U+FFFD per byte of the whole run in
  // Decode (HF semantics) but per windowed run in the stream; the stream promises equality
  // for text that decodes cleanly, which is what models emit.
  if (full.find("\xEF\xBF\xBD") != std::string::npos) return;
  const std::string prompt_text = *tok.Decode(prompt, skip_special);
  if (cut == 0) {
    FUZZ_CHECK(streamed == full, absl::StrCat("ids ", IdsText(ids), "streamed '", streamed,
                                              "' decoded '", full, "'"));
  } else if (full.compare(0, prompt_text.size(), prompt_text) == 0) {
    FUZZ_CHECK(streamed == full.substr(prompt_text.size()),
               absl::StrCat("prompt ", IdsText(prompt), "generated ", IdsText(generated),
                            "streamed '", streamed, "' decoded '", full, "'"));
  }
}

}  // namespace
}  // namespace specd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specd::fuzz::FuzzOne(data, size);
  return 0;
}
